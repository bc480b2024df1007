"""`stune-health`: node health checks and hooks.

    stune-health capture [-o FILE] [--no-nvml | --gpu-snapshot FILE]            the node's state as JSON
    stune-health check --snapshot FILE [--previous FILE] [-v] [--json]         judge a snapshot offline
    stune-health prolog | epilog                                               Slurm Prolog / Epilog
    stune-health run [--dry-run] [--json]                                      HealthCheckProgram
    stune-health status                                                        this node's health state
    stune-health clear [--xid] [--baselines] [--trust] [--unknown]             forget held state
    stune-health xids [-p P]                                                   the Xid rules in force
    stune-health incidents [--json]                                            this node's Xid incidents
    stune-health lemons [-p P] [--mark] [--json]                               nodes that break jobs
    stune-health reliability [-p P] [--since 90d] [--format ...] [--png F]     ETTR, MTTF, interruptions

Common options: -p/--partition P, --sysfs-root DIR, --gpu-snapshot FILE, --state-dir DIR, --node NAME,
--prom FILE (Prometheus textfile), --json-out FILE. Environment: STUNE_HEALTH_PARTITION, STUNE_SYSFS_ROOT,
STUNE_GPU_SNAPSHOT, STUNE_STATE_DIR (each may use %n for the node name), STUNE_HEALTH_PROM,
STUNE_HEALTH_JSON, STUNE_PARTITIONS.

Exit status (errors.py's table, README's "Exit status"): check: 0 ok, 4 unknown, 5 degraded, 6 fail.
prolog/epilog: 10 only when a failure fails the job, 0 for anything else, including a bug or a bad profile: a
hook must never drain the fleet by mistake. (10, not 1, so that a Python that cannot even start - exit 1 - is
told apart by the hook scripts.) run: 0, 1 when Slurm or the profile failed, 7 when the circuit breaker held
back a drain.

The option parser is hand-made (hot path: see docs/speed.md). The shared options (-p/--partition, --node,
--sysfs-root, --json, --dry-run) take their spellings from cli/options.py, loaded only when a command line has
options (the hooks have none).
"""

from __future__ import annotations

import sys

from ..errors import EXIT_BY_STATUS, EXIT_HOOK_FAIL, EXIT_OK
from ..progs import HEALTH
from .common import EXIT_USAGE, run_console

PROG = HEALTH
# Options of every command: the shared ones by name (cli/options.py spells them), then stune-health's own
# (flag: takes a value). A command's own options follow the same rule.
SHARED_COMMON = ("partition", "sysfs_root", "node")
COMMON = {"--gpu-snapshot": 1, "--state-dir": 1, "--prom": 1, "--json-out": 1}
COMMANDS = {
    "capture": {"-o": 1, "--output": 1, "--no-nvml": 0, "--timeout": 1, "json": 0},
    "check": {"--snapshot": 1, "--previous": 1, "-v": 0, "--verbose": 0, "json": 0},
    "prolog": {},
    "epilog": {},
    "run": {"dry_run": 0, "json": 0},
    "status": {"json": 0},
    "clear": {"--xid": 0, "--baselines": 0, "--trust": 0, "--unknown": 0},
    "xids": {},
    "incidents": {"json": 0},
}


_ENFORCED: list = []  # set by a hook that fails the job on purpose; nothing else may make a hook exit non-zero


class Usage(Exception):
    """A usage error (exit 2) or, with `help_for`, a request for a command's help (exit 0)."""

    def __init__(self, message: str, help_for: str | None = None):
        super().__init__(message)
        self.help_for = help_for


def parse(argv: list[str]) -> tuple[str, dict]:
    """(command, {option_name: value}); option names lose their dashes (--sysfs-root -> sysfs_root)."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        raise Usage("", help_for=argv[1] if len(argv) > 1 and argv[1] in COMMANDS else None)
    command = argv[0]
    if command not in COMMANDS:
        raise Usage(f"unknown command {command!r}")
    options: dict = {}
    if len(argv) == 1:
        return command, options
    allowed = allowed_options(command)
    args = iter(argv[1:])
    value: str | bool | None
    for arg in args:
        if arg in ("-h", "--help"):
            raise Usage("", help_for=command)
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in allowed:
            raise Usage(f"{command}: unknown option {arg!r} (see {PROG} {command} --help)")
        key, takes_value = allowed[name]
        if not takes_value:
            if eq:
                raise Usage(f"{command}: {name} takes no value")
            value = True
        elif not eq:
            value = next(args, None)
            if value is None:
                raise Usage(f"{command}: {name} needs a value")
        options[key] = value
    return command, options


def allowed_options(command: str) -> dict:
    """{flag: (option key, takes a value)} for one command: the shared options' spellings from cli/options.py,
    then stune-health's own (--sysfs-root -> sysfs_root, -o -> output, -v -> verbose)."""
    from . import options as shared

    allowed = {}
    own = dict(COMMON, **COMMANDS[command])
    for name in SHARED_COMMON + tuple(k for k in own if not k.startswith("-")):
        for flag in shared.flags(name):
            allowed[flag] = (name, shared.takes_value(name))
    for flag, takes_value in own.items():
        if flag.startswith("-"):
            key = {"-o": "output", "-v": "verbose"}.get(flag, flag.lstrip("-").replace("-", "_"))
            allowed[flag] = (key, bool(takes_value))
    return allowed


def _capture(options: dict) -> int:
    from ..health import collect
    from ..health.node import settings

    cfg = settings(options)
    timeout = None
    if options.get("timeout"):
        try:
            timeout = float(options["timeout"])
        except ValueError:
            raise Usage(f"capture: --timeout {options['timeout']!r} is not a number") from None
    snap = collect.full(
        cfg.root,
        None,
        cfg.node,
        cfg.gpu_snapshot,
        gids=True,
        timeout_s=timeout,
        nvml=not options.get("no_nvml"),
    )
    profile = _capture_profile(cfg)
    if profile is not None and profile.accelerator != "nvidia" and profile.gpu.count:
        # an AMD or Ascend partition's devices: its backend (or the replay file), beside whatever NVML said
        collect.add_accel(snap, cfg.root, profile, cfg.node, timeout or 5.0, cfg.gpu_snapshot)
    collect.add_drift(snap, cfg.root, profile, timeout or 5.0)
    out = options.get("output")
    if out and out != "-":
        from ..hw.snapshot import save

        save(snap, out)
        print(f"{PROG}: wrote {out}", file=sys.stderr)
    else:
        from ..output import print_json

        print_json(snap)
    return EXIT_OK


def _capture_profile(cfg):
    """The profile a capture reads the drift section's sysctls (and an AMD or Ascend partition's devices) for
    (--partition or $STUNE_HEALTH_PARTITION), or None: then only the built-in sysctls (hw/drift.py)."""
    if not cfg.partition:
        return None
    from ..errors import StuneError
    from ..profilestore import load_profile

    try:
        return load_profile(cfg.partition)
    except StuneError as exc:
        print(f"{PROG}: capture: the built-in sysctls only, not {cfg.partition}'s: {exc}", file=sys.stderr)
        return None


def _print_verdict(header: str, verdict, verbose: bool) -> None:
    print(f"{header}: {verdict.status.upper()}" + (f" - {verdict.reason}" if verdict.reason else ""))
    hidden = 0
    for r in sorted(verdict.results, key=lambda r: (-_rank(r.status), r.status == "ok")):
        if r.status == "ok" and not verbose:
            hidden += 1
            continue
        print(r.line())
    if hidden:
        print(f"{hidden} ok results (show them with -v)")


def _rank(status: str) -> int:
    from ..health.result import RANK

    return RANK[status]


def _check(options: dict) -> int:
    from ..health import offline, outputs
    from ..health.state import policy_digest
    from ..hw.snapshot import load

    if not options.get("snapshot"):
        raise Usage("check: --snapshot FILE is required")
    snap = load(options["snapshot"])
    previous = load(options["previous"]) if options.get("previous") else None
    profile = offline.choose_profile(options.get("partition"))
    verdict, _ = offline.check(snap, profile, previous)
    name, at = snap.get("node"), snap.get("captured_at")
    name = name if isinstance(name, str) else "?"
    at = at if type(at) is int or type(at) is float else 0.0
    doc = outputs.report(
        name,
        profile.partition,
        policy_digest(profile),
        "check",
        at,
        verdict,
        {"snapshot": options["snapshot"]},
    )
    if options.get("prom"):
        outputs.write_prometheus(options["prom"], doc)
    if options.get("json_out"):
        outputs.write_json(options["json_out"], doc)
    if options.get("json"):
        from ..output import print_json

        print_json(doc)
    else:
        _print_verdict(
            f"{name} ({profile.partition}, policy {doc['policy']})", verdict, bool(options.get("verbose"))
        )
    return EXIT_BY_STATUS[verdict.status]


def _hook(mode: str, options: dict) -> int:
    """A hook exits 10 only for an enforced failure; a bug or a bad profile is logged and exits 0."""
    from ..health import node

    code = node.run_hook(mode, options, PROG)
    _ENFORCED.append(code == EXIT_HOOK_FAIL)
    return code


def _run(options: dict) -> int:
    from ..health import node
    from ..slurm import Slurm

    cfg = node.settings(options)
    slurm = Slurm.from_env(timeout=20)
    code, doc = node.run(cfg, slurm, dry_run=bool(options.get("dry_run")))
    if options.get("json"):
        from ..output import print_json

        print_json(doc)
    else:
        print(
            f"{cfg.node} ({doc['partition']}): {doc['status'].upper()}"
            + (f" - {doc['reason']}" if doc["reason"] else "")
            + (f"; Slurm: {doc['sync']}" if doc["sync"] else "; no Slurm call (nothing changed)")
        )
        for note in doc["notes"]:
            print(f"  {note}")
        for r in sorted(doc["results"], key=lambda r: -_rank(r["status"])):
            if r["status"] != "ok":  # what a dry run is for: every finding behind the verdict, warnings too
                print(f"  {r['status']:8s} {r['check']:22s} {r['subject']}: {r['message']}")
    if doc["breaker"]["open"]:
        print(
            f"{PROG}: {doc['breaker']['message']}", file=sys.stderr
        )  # "circuit breaker open: ...", as logged
    if doc["error"]:
        print(f"{PROG}: {doc['error']}", file=sys.stderr)
    return code


def _status(options: dict) -> int:
    from ..health import node
    from ..health.state import read
    from ..output import print_json

    cfg = node.settings(options)
    state, problem = read(cfg.state_dir)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
    print_json(state)
    return EXIT_OK


def _clear(options: dict) -> int:
    from ..health import node
    from ..health.state import Locked, log

    cfg = node.settings(options)
    what = [k for k in ("xid", "baselines", "trust", "unknown") if options.get(k)]
    if not what:
        raise Usage(
            "clear: say what to forget: --xid (held Xids, after a GPU reset), --baselines, --trust, --unknown"
        )
    with Locked(cfg.state_dir) as st:
        if "xid" in what:
            from ..health.incidents import clear

            clear(st.state)
        if "baselines" in what:
            st.state["baselines"] = {}
        if "trust" in what:
            st.state["trusted"] = []
        if "unknown" in what:
            st.state["unknown_runs"] = {}
        st.save()
    log(cfg.state_dir, f"clear {' '.join(what)} (by hand)")
    print(f"{PROG}: cleared {', '.join(what)} in {cfg.state_dir}")
    return EXIT_OK


def _health_incidents():
    from . import health_incidents

    return health_incidents


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("lemons", "reliability"):  # fleet-wide, from sacct: argparse, cli/reliability.py
        from .reliability import main as fleet

        return fleet(argv)
    try:
        command, options = parse(argv)
    except Usage as exc:
        if exc.help_for:
            from .health_help import command_help  # hot path: see docs/speed.md

            print(command_help(exc.help_for))
            return EXIT_OK
        if str(exc):
            print(f"{PROG}: {exc}", file=sys.stderr)
        print(
            __doc__.split("\n\n")[1] + f"\n\n`{PROG} <command> --help` lists a command's options and exit "
            "codes.",
            file=sys.stderr if str(exc) else sys.stdout,
        )
        return EXIT_USAGE if str(exc) else 0
    try:
        if command in ("prolog", "epilog"):
            return _hook(command, options)
        return {
            "capture": _capture,
            "check": _check,
            "run": _run,
            "status": _status,
            "clear": _clear,
            "xids": lambda o: _health_incidents().xids(o),
            "incidents": lambda o: _health_incidents().incidents(o),
        }[command](options)
    except Usage as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    # A prolog or epilog must exit 0 on an internal error: only a judged failure may drain a node.
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("prolog", "epilog"):
        return run_console(PROG, _main, argv, internal_exit=EXIT_OK, outcome=_hook_status)
    return run_console(PROG, _main, argv)


def _hook_status(code: int) -> int:
    """A hook's exit status: 10 only for the failure it enforced on purpose, 0 for anything else."""
    return EXIT_HOOK_FAIL if code == EXIT_HOOK_FAIL and _ENFORCED and _ENFORCED[-1] else EXIT_OK
