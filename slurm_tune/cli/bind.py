"""`stune-bind CMD...`: exec CMD bound to the CPUs and memory of the NUMA node of the task's GPU.

    srun stune-bind python train.py

The CPUs are the GPU's local CPUs within the cpuset Slurm gave the task; memory is bound with numactl
--membind when numactl is installed, else with set_mempolicy(2). When the topology is unknown (numa_node -1,
as in VMs) or there is no GPU, CMD runs unbound and one note on stderr says why. Options: -v prints what was
bound; --show prints it and runs nothing; --node and --sysfs-root as in every stune command.
"""

from __future__ import annotations

import os
import sys

from .common import EXIT_CANNOT_RUN, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, guarded

PROG = "stune-bind"


def _note(text: str) -> None:
    sys.stderr.write(f"{PROG}: note: {text}\n")


# Hand-parsed: stune-bind runs once per rank at job start, and argparse measured +10 ms there (x1.6 -> x3.0 of
# `python3 -I -S -c pass`; README, "Command-line conventions").
USAGE = f"usage: {PROG} [-v] [--show] [--node NAME] [--sysfs-root DIR] [--] CMD [ARGS...]"
OWN = {"-v": "verbose", "--verbose": "verbose", "--show": "show"}


class UsageError(Exception):
    pass


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """({option: value}, command). stune-bind's options come first; the first other word (or `--`) starts
    the command. --node and --sysfs-root are spelled as in cli/options.py (also `--flag=value`)."""
    from .options import flags

    valued = {flag: name for name in ("node", "sysfs_root") for flag in flags(name)}
    options: dict = {}
    args = list(argv)
    while args and args[0].startswith("-"):
        arg = args.pop(0)
        if arg == "--":
            break
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in valued:
            if not eq:
                if not args:
                    raise UsageError(f"{name} needs a value")
                value = args.pop(0)
            options[valued[name]] = value
        elif arg in OWN:
            options[OWN[arg]] = True
        elif arg in ("-h", "--help"):
            options["help"] = True
        else:
            raise UsageError(f"unknown option {arg!r}")
    return options, args


def _main(argv: list[str]) -> int:
    try:
        options, args = parse(argv)
    except UsageError as exc:
        print(f"{PROG}: {exc}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    if options.get("help"):
        print(__doc__.split(":", 1)[1].strip())
        print(USAGE)
        return EXIT_OK
    verbose, show = options.get("verbose", False), options.get("show", False)
    if not args and not show:
        print(f"{PROG}: no command\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    from ..hw.sysfs import Sysfs, resolve_root
    from ..nodeenv.binding import format_cpus, plan_binding
    from ..thisnode import job_context

    job = job_context(os.environ, node=options.get("node"))
    environ = job.environ
    allowed = frozenset(os.sched_getaffinity(0))
    plan = plan_binding(environ, Sysfs(resolve_root(options.get("sysfs_root"), environ, job.node)), allowed)
    command = list(args)
    if plan.cpus is None or plan.numa_node is None:  # a plan with CPUs always has its NUMA node
        _note(plan.note)
    else:
        os.sched_setaffinity(0, plan.cpus)
        memory = _bind_memory(plan.numa_node, environ, command)
        if memory.startswith("not bound"):
            _note(f"memory {memory}")
        if verbose or show:
            print(
                f"{PROG}: GPU {plan.gpu} ({plan.pci}) on NUMA node {plan.numa_node}: CPUs "
                f"{format_cpus(plan.cpus)} (Slurm gave {format_cpus(allowed)}); memory {memory}",
                file=sys.stderr,
            )
    if show:
        return EXIT_OK
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"{PROG}: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except PermissionError:
        print(f"{PROG}: {command[0]}: permission denied", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return EXIT_OK  # not reached


def _bind_memory(node: int, environ, command: list[str]) -> str:
    """Bind memory to `node`: numactl when installed (it wraps the command in place), else set_mempolicy.
    Returns how, or 'not bound: why'."""
    from ..hw.sysfs import Sysfs
    from ..nodeenv.binding import numactl_path, set_membind

    if node not in Sysfs("/").numa_nodes():  # a fixture's node the real kernel does not have
        return f"not bound: the kernel has no NUMA node {node}"
    numactl = numactl_path(environ)
    if numactl:
        command[:0] = [numactl, f"--membind={node}", "--"]
        return f"bound to node {node} (numactl --membind)"
    problem = set_membind(node)
    if problem:
        return f"not bound: {problem}"
    return f"bound to node {node} (set_mempolicy)"


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
