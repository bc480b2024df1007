"""`stune-bind CMD...`: exec CMD bound to the CPUs and memory of the NUMA node of the task's GPU.

    srun stune-bind python train.py

The CPUs are the GPU's local CPUs within the cpuset Slurm gave the task; memory is bound with numactl
--membind when numactl is installed, else with set_mempolicy(2). When the topology is unknown (numa_node -1,
as in VMs) or there is no GPU, CMD runs unbound and one note on stderr says why. Options: -v prints what was
bound; --show prints it and runs nothing.
"""
from __future__ import annotations

import os
import sys

from .common import EXIT_CANNOT_RUN, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, guarded

PROG = "stune-bind"


def _note(text: str) -> None:
    sys.stderr.write(f"{PROG}: note: {text}\n")


def _main(argv: list[str]) -> int:
    verbose = show = False
    args = list(argv)
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag in ("-v", "--verbose"):
            verbose = True
        elif flag == "--show":
            show = True
        elif flag in ("-h", "--help"):
            print(__doc__.split(":", 1)[1].strip())
            return EXIT_OK
        else:
            print(f"{PROG}: unknown option {flag!r}; usage: {PROG} [-v] [--show] [--] CMD [ARGS...]",
                  file=sys.stderr)
            return EXIT_USAGE
    if not args and not show:
        print(f"{PROG}: usage: {PROG} [-v] [--show] [--] CMD [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
    from ..hw.sysfs import Sysfs, resolve_root
    from ..nodeenv.binding import format_cpus, plan_binding
    from ..thisnode import job_context

    job = job_context(os.environ)
    environ = job.environ
    allowed = frozenset(os.sched_getaffinity(0))
    plan = plan_binding(environ, Sysfs(resolve_root(None, environ, job.node)), allowed)
    command = list(args)
    if plan.cpus is None:
        _note(plan.note)
    else:
        os.sched_setaffinity(0, plan.cpus)
        memory = _bind_memory(plan.numa_node, environ, command)
        if memory.startswith("not bound"):
            _note(f"memory {memory}")
        if verbose or show:
            print(f"{PROG}: GPU {plan.gpu} ({plan.pci}) on NUMA node {plan.numa_node}: CPUs "
                  f"{format_cpus(plan.cpus)} (Slurm gave {format_cpus(allowed)}); memory {memory}",
                  file=sys.stderr)
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
