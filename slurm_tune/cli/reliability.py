"""`stune-health lemons` and `stune-health reliability`: the fleet's reliability from sacct, on the host where
sacct is (a timer beside the accountant, or an admin's shell), not on a node.

    stune-health lemons [-p P ...] [--window 30d] [--mark [--dry-run]] [--json] [--sacct-file DUMP]
    stune-health reliability [-p P ...] [--since 90d] [--format table|csv|json] [--table months|sizes|causes]
                             [-o FILE] [--png FILE] [--json] [--sacct-file DUMP]

Both read `sacct -a -X -D -P` (reliability/history.py) and the nodes' DOWN/DRAIN events (`sacctmgr show
event`, reliability/events.py; --events-file for a dump, --no-events to skip). The names are the field's own
words: a lemon is what Meta's papers call a node that keeps breaking jobs; `reliability` is the report the
Llama 3 paper and the HPCA 2025 reliability study give. docs/reliability.md has the test and the definitions.

argparse here: these are not hot paths (cli/health.py hands them over before its own parser runs).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..durations import option
from ..errors import EXIT_ATTENTION, EXIT_OK, SlurmError, StuneError
from ..progs import HEALTH
from . import options

WINDOW_DEFAULT = 90 * 86400  # the reliability report's


def _time(epoch: float) -> str:
    """sacct and sacctmgr take local wall-clock times, not epochs."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch)))


def _ago(text: str | None, name: str, now: float) -> int | None:
    """A window's edge: a duration before `now` ('30d', '12h', '2w', durations' rules) or '@EPOCH'."""
    if text is None:
        return None
    text = text.strip()
    if text.startswith("@") and text[1:].isdigit():
        return int(text[1:])
    return int(now - option(text, name))


def _partitions(args) -> list[str] | None:
    if not args.partition:
        return None
    return sorted({p for value in args.partition for p in value.split(",") if p})


def _read(args, since_live: int, until: float | None):
    """(runs, events or None, the time the data ends at, warnings)."""
    from ..reliability import events, history
    from ..slurm import Slurm

    warnings: list[str] = []
    if args.sacct_file:
        runs = history.read_file(args.sacct_file)
        evs = events.read_file(args.events_file) if args.events_file and not args.no_events else None
        return runs, evs, runs.as_of, warnings
    slurm = Slurm.from_env(timeout=600)
    now = time.time() if until is None else until
    runs = history.read_live(slurm, _time(since_live), _time(now) if until is not None else None)
    evs = None
    if not args.no_events:
        try:
            evs = events.read_live(slurm, _time(since_live - events.AFTER_S))
        except SlurmError as exc:
            warnings.append(f"node events not read ({exc}): causes from sacct alone")
    return runs, evs, int(now), warnings


def _profiles(directory: str | None):
    """(partition -> Profile, the lemon Policy of a partition without one, notes)."""
    from ..profilecheck import PROFILE_SCHEMA
    from ..profilestore import load_profiles
    from ..reliability.lemons import Policy
    from ..schema import Where

    notes: list[str] = []
    try:
        profiles = load_profiles(directory)
    except StuneError as exc:  # (no directory, one root may not trust, a bad profile)
        profiles = {}
        notes.append(f"profiles not read ({exc}): the built-in lemon settings apply")
    defaults = PROFILE_SCHEMA.fields["health"].complete({}, "health", Where("(the built-in defaults)"))
    return profiles, Policy.from_health(argparse.Namespace(**defaults)), notes


def _lemons(args) -> int:
    from dataclasses import replace

    from ..reliability import causes, lemons, render
    from ..reliability.lemons import Policy

    now = time.time()
    wanted = _partitions(args)
    window = option(args.window, "--window") if args.window else None
    profiles, default, notes = _profiles(args.partitions)

    def policy(name: str) -> Policy:
        found = Policy.from_health(profiles[name].health) if name in profiles else default
        return replace(found, window=window) if window else found

    # the sacct read reaches back as far as the longest window of the partitions asked for
    longest = max(policy(p).window for p in [*(wanted or profiles), ""])
    runs, evs, until, warnings = _read(args, int(now - longest), None)
    names = wanted or sorted(set(runs.partitions))
    c = causes.classify(runs, evs)
    reports = [lemons.score(runs, c, p, until - policy(p).window, until, policy(p), now=until) for p in names]
    for line in [*notes, *warnings, *runs.warnings(), *(evs.warnings() if evs else [])]:
        print(f"{HEALTH}: {line}", file=sys.stderr)
    sys.stdout.write(render.lemons_json(reports) if args.json else render.lemons_text(reports))
    if args.mark:
        _mark(args, reports, profiles)
    return EXIT_ATTENTION if any(r.lemons for r in reports) else EXIT_OK


def _mark(args, reports, profiles) -> None:
    from ..reliability import mark
    from ..slurm import Slurm

    if args.sacct_file and not args.cluster:
        raise StuneError("--mark marks the live cluster's nodes: add --cluster to mark from a dump")
    slurm = Slurm.from_env()
    out = sys.stderr if args.json else sys.stdout
    for report in reports:
        profile = profiles.get(report.partition)
        if profile is None or not profile.health.lemon_mark:
            if report.lemons:
                print(
                    f"{report.partition}: not marked (health.lemon_mark is off for this partition)", file=out
                )
            continue
        for line in mark.apply_marks(slurm, report, profile, dry_run=args.dry_run):
            print(line, file=out)


def _reliability(args) -> int:
    from ..reliability import causes, render, report

    now = time.time()
    until = _ago(args.until, "--until", now)
    since_text = args.since or f"{WINDOW_DEFAULT}s"
    runs, evs, end, warnings = _read(args, _ago(since_text, "--since", until or now) or 0, until)
    until = until if until is not None else end
    since = _ago(since_text, "--since", until) or 0
    settings = report.Settings(
        checkpoint_interval_s=option(args.checkpoint_interval, "--checkpoint-interval"),
        restart_overhead_s=option(args.restart_overhead, "--restart-overhead"),
    )
    c = causes.classify(runs, evs)
    rep = report.build(runs, c, since, until, settings, len(evs) if evs else 0, _partitions(args))
    rep.warnings += warnings + (evs.warnings() if evs else [])
    fmt = "json" if args.json else args.format
    if fmt == "csv":
        text = render.reliability_csv(rep, args.table)
    elif fmt == "json":
        text = render.reliability_json(rep)
    else:
        text = render.reliability_text(rep) if fmt == "table" else ""
    if args.output and text:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"{HEALTH}: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        if fmt != "table":
            for w in rep.warnings:
                print(f"{HEALTH}: warning: {w}", file=sys.stderr)
    if args.png:
        render.reliability_png(rep, args.png)
        print(f"{HEALTH}: wrote {args.png}", file=sys.stderr)
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    from ..reliability.render import TABLES

    parser = argparse.ArgumentParser(prog=HEALTH, description="the fleet's reliability from sacct")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def common(p):
        options.add(
            p,
            "partition",
            action="append",
            help="only this partition (repeat, or a comma list; default: all)",
        )
        p.add_argument(
            "--sacct-file", help="a `sacct -a -X -D -P` dump with its header (docs/reliability.md)"
        )
        p.add_argument("--events-file", help="with --sacct-file: a `sacctmgr -n -P show event` dump")
        p.add_argument("--no-events", action="store_true", help="classify from sacct alone")

    p = sub.add_parser(
        "lemons",
        help="nodes that make multi-node jobs fail more than their share",
        epilog="exit status: 0 no lemon; 3 lemons found (a person should look); 1 an error; 2 a usage error",
    )
    common(p)
    p.add_argument("--window", help="how far back (default: each partition's health.lemon_window, 30d)")
    p.add_argument(
        "--mark",
        action="store_true",
        help="mark lemons degraded where health.lemon_mark is on; clear old marks",
    )
    options.add(p, "dry_run", help="with --mark: say what would be marked; change nothing")
    p.add_argument(
        "--cluster", action="store_true", help="with --sacct-file and --mark: mark the live cluster"
    )
    p.add_argument("--partitions", help="partition profiles directory (default $STUNE_PARTITIONS)")
    options.add(p, "json", help="the scores as JSON")
    p = sub.add_parser(
        "reliability",
        help="ETTR, MTTF by job size, interruptions per 1,000 node-days by cause",
        epilog="exit status: 0 done; 1 an error; 2 a usage error. docs/reliability.md has the definitions",
    )
    common(p)
    p.add_argument("--since", help="window start: 90d (default), 12w, @EPOCH")
    p.add_argument("--until", help="window end: a duration ago or @EPOCH (default: now, or the dump's end)")
    p.add_argument("--format", choices=("table", "csv", "json", "none"), default="table")
    p.add_argument("--table", choices=TABLES, default="months", help="which table --format csv writes")
    options.add(p, "json", help="the same as --format json")
    p.add_argument("-o", "--output", help="write the table, CSV or JSON here instead of stdout")
    p.add_argument("--png", help="write the charts (per partition and month; MTTF by size) here")
    p.add_argument("--checkpoint-interval", default="1h", help="ETTR: how often jobs checkpoint (default 1h)")
    p.add_argument("--restart-overhead", default="5m", help="ETTR: time to restart a run (default 5m)")
    return parser


COMMANDS = ("lemons", "reliability")


def main(argv: list[str]) -> int:
    args = options.parse(_parser(), argv)
    try:
        import numpy  # noqa: F401  (the columns of a year of sacct)
    except ImportError:
        raise StuneError(
            f"{args.cmd} needs numpy, the `accountant` extra: pip install 'slurm-tune[accountant]' "
            "(on the accountant's host, where sacct is)"
        ) from None
    return {"lemons": _lemons, "reliability": _reliability}[args.cmd](args)
