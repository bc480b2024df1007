"""`stune-sweep`: active checks with baselines (docs/active.md).

    stune-sweep run -p PARTITION [--reservation R] [--checks a,b] [--nodes n1,n2] [--runs N] [--dry-run]
    stune-sweep judge -p PARTITION [--dry-run]          re-judge the stored history and mark/clear nodes
    stune-sweep report -p PARTITION [--json | --format table|csv|json|prom] [-o FILE] [--png FILE] [--drift]
    stune-sweep report --compare A B [--json] [-o FILE] [--png FILE]   two partitions (or PART@previous)
    stune-sweep history -p PARTITION [--node N] [--check C] [--since 30d] [--json | --format table|csv|json]
    stune-sweep checks [-p PARTITION] [--json]          the catalogue: tools, commands, what to install
    stune-sweep scaling -p PARTITION [--reservation R] [--nodes n1,n2] [--max-nodes N] [--json] [--png FILE]
                        [--dry-run]                     the all-reduce scaling curve, in one node and across
    stune-sweep agent --spec JSON                       (inside a sweep job: run one check on this node)

Common: --store DIR (results and state; default $STUNE_ACTIVE_DIR or /var/lib/stune/active).
Exit status: 0 done; 1 an error (bad profile, Slurm did not answer); 3 (EXIT_ATTENTION) `run`/`judge` found
outliers, `scaling` found a knee or a failure, or its single-node curve did not pass. The full table: README's "Exit status".
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..active import compare, judge, report, scaling, scaling_out, store, sweep
from ..active.agent import run_spec
from ..active.report import checks_listing, checks_text
from ..errors import NoProfileError, StuneError
from ..output import json_text
from ..profiles import load_profile
from ..safeio import write_atomic
from ..schema import Duration, Where
from ..slurm import Slurm
from . import options
from .common import EXIT_ATTENTION, EXIT_OK, guarded

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

PROG = "stune-sweep"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,judge,report,history,checks,scaling}")
    common = options.store_parent("results")
    run = sub.add_parser("run", parents=[common], help="submit the partition's checks and judge them")
    options.add(run, "partition", required=True)
    run.add_argument("--reservation", help="run inside this maintenance reservation")
    run.add_argument("--checks", help="comma list: only these of the profile's checks")
    run.add_argument("--nodes", help="comma list: only these nodes (still only idle ones)")
    run.add_argument("--runs", type=int, help="measurements per check (default active.runs)")
    run.add_argument("--wait", type=float, help="seconds to wait for the jobs before cancelling them")
    options.add(run, "dry_run", help="say what would be submitted and marked")
    judge = sub.add_parser("judge", parents=[common], help="judge the stored history and mark or clear nodes")
    options.add(judge, "partition", required=True)
    options.add(judge, "dry_run", help="say what would be marked or cleared")
    rep = sub.add_parser("report", parents=[common], help="results against the partition baseline")
    options.add(rep, "partition", help="the partition whose profile to use (not with --compare)")
    rep.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="two partitions side by side (PART, or PART@previous: before its latest version change)",
    )
    rep.add_argument("--format", choices=("table", "csv", "json", "prom"), default="table")
    options.add(rep, "json", help="the same as --format json")
    rep.add_argument("-o", "--output", help="write here instead of stdout")
    rep.add_argument("--png", help="also draw a PNG here")
    rep.add_argument("--drift", action="store_true", help="before/after a version change instead")
    rep.add_argument("--check", help="only this check")
    hist = sub.add_parser("history", parents=[common], help="every stored result of a node, pair or check")
    options.add(hist, "partition", required=True)
    options.add(hist, "node", help="results whose subject involves this node")
    hist.add_argument("--check")
    hist.add_argument("--since", default="30d", help="how far back: 7d, 12h, 90m (default 30d)")
    hist.add_argument("--format", choices=("table", "csv", "json"), default="table")
    options.add(hist, "json", help="the same as --format json")
    checks = sub.add_parser("checks", parents=[common], help="the catalogue of checks")
    options.add(checks, "partition", help="only the checks this partition's profile configures")
    options.add(checks, "json", help="the catalogue as JSON")
    sc = sub.add_parser(
        "scaling", parents=[common], help="the all-reduce scaling curve (one node, then nodes)"
    )
    options.add(sc, "partition", required=True)
    sc.add_argument("--reservation", help="run inside this maintenance reservation (its nodes)")
    sc.add_argument("--nodes", help="comma list: only these nodes (still only idle ones)")
    sc.add_argument("--max-nodes", type=int, help="largest node count of the multi-node curve")
    sc.add_argument("--wait", type=float, help="seconds to wait for each step's jobs before cancelling them")
    options.add(sc, "json", help="the curves as JSON")
    sc.add_argument("--png", help="also draw the curves as a PNG here")
    options.add(sc, "dry_run", help="say what would be submitted")
    agent = sub.add_parser("agent")
    agent.add_argument("--spec", required=True)
    return p


def _profile(args):
    return load_profile(args.partition, args.partitions_dir)


def _main(argv: list[str]) -> int:
    args = options.parse(_parser(), argv)
    if args.command == "agent":
        try:
            spec = json.loads(args.spec)
        except ValueError as exc:
            raise StuneError(f"--spec is not JSON: {exc}") from None
        return run_spec(spec, emit=lambda line: print(line, flush=True))

    directory = store.store_dir(args.store)
    if args.command == "checks":
        return _checks(args)
    if args.command == "report" and args.compare:
        return _compare(args, directory)
    if args.command == "report" and not args.partition:
        raise StuneError("report needs -p PARTITION (or --compare A B)")
    profile = _profile(args)
    if args.command == "report":
        return _report(args, profile, directory)
    if args.command == "history":
        return _history(args, directory)

    slurm = Slurm.from_env()
    if args.command == "scaling":
        return _scaling(args, slurm, profile, directory)
    with store.SweepLock(directory, args.partition):
        if args.command == "run":
            opts = sweep.Options(
                args.partition,
                directory,
                reservation=args.reservation,
                checks=args.checks.split(",") if args.checks else None,
                nodes=args.nodes.split(",") if args.nodes else None,
                runs=args.runs,
                dry_run=args.dry_run,
                wait_s=args.wait,
            )
            out = sweep.sweep(slurm, profile, opts)
        else:
            opts = sweep.Options(args.partition, directory, dry_run=args.dry_run)
            out = sweep.judge_and_mark(slurm, profile, opts, "judge", [], time.time(), print)
    verdicts = out.get("verdicts", [])
    if verdicts:
        rows = [
            {
                "check": v.check,
                "subject": v.subject,
                "status": v.status,
                "value": None if v.value is None else round(v.value, 4),
                "baseline": round(v.baseline.median, 4) if v.baseline else None,
                "reason": v.reason,
            }
            for v in verdicts
        ]
        sys.stdout.write(report.table(rows, ("check", "subject", "status", "value", "baseline", "reason")))
    for node, why in sorted(out.get("named", {}).items()):
        print(f"{node}: named at fault: {why}")
    outliers = [v for v in verdicts if v.status == judge.OUTLIER and "+" not in v.subject] + list(
        out.get("named", {})
    )
    return EXIT_ATTENTION if outliers else EXIT_OK


HISTORY_COLUMNS = (
    "when",
    "sweep",
    "check",
    "subject",
    "run",
    "status",
    "value",
    "unit",
    "fingerprint",
    "job",
    "detail",
)


def _history(args, directory: str) -> int:
    try:
        seconds = Duration().check(args.since, "--since", Where("--since"))
    except StuneError:
        raise StuneError(f"--since {args.since!r}: give a duration like 7d, 12h, 90m") from None
    rows = []
    for r in store.load(directory, args.partition, since=time.time() - seconds):
        if args.check and r["check"] != args.check:
            continue
        if args.node and args.node not in judge.pair_members(r["subject"]):
            continue
        rows.append(
            dict(
                r,
                when=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"])),
                fingerprint=store.fingerprint_key(r.get("fingerprint") or {}),
                detail=r.get("detail", "")[:80],
            )
        )
    if args.format == "json" or args.json:
        sys.stdout.write(json_text({"partition": args.partition, "results": rows}))
    elif args.format == "csv":
        sys.stdout.write(report.to_csv(rows, HISTORY_COLUMNS))
    else:
        sys.stdout.write(report.table(rows, HISTORY_COLUMNS) if rows else "no results\n")
    return EXIT_OK


def _checks(args) -> int:
    profile = _profile(args) if args.partition else None
    listing = checks_listing(profile)
    if args.json:
        sys.stdout.write(json_text({"partition": args.partition, "checks": listing}))
    elif profile is not None and not listing:
        print(
            f"partition {args.partition} runs no active checks: its profile has no active.checks (add an "
            "`active:` section, docs/active.md); `stune-sweep checks` lists every check stune knows"
        )
    else:
        sys.stdout.write(checks_text(listing))
    return EXIT_OK


def _report(args, profile: Profile, directory: str) -> int:
    results = store.load(directory, args.partition, since=time.time() - profile.active.window * 12)
    if args.check:
        results = [r for r in results if r["check"] == args.check]
    columns: tuple[str, ...]
    if args.drift:
        data, columns = (
            report.drift(results),
            ("check", "subject", "changed", "before", "after", "change", "runs_before", "runs_after"),
        )
    else:
        data, columns = (
            report.rows(
                store.load(directory, args.partition, since=time.time() - profile.active.window)
                if not args.check
                else [r for r in results if r["at"] >= time.time() - profile.active.window],
                judge.Settings.from_profile(profile),
            ),
            report.COLUMNS,
        )
    if args.json:
        args.format = "json"
    if args.format == "table":
        text = report.table(data, columns) if data else "no results\n"
    elif args.format == "csv":
        text = report.to_csv(data, columns)
    elif args.format == "json":
        text = json_text({"partition": args.partition, "rows": data})
    else:
        text = report.prometheus(args.partition, data if not args.drift else [])
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    if args.png:
        _png(args.png, lambda: report.png(args.png, args.partition, data))
    return EXIT_OK


DEFAULT_WINDOW = 30 * 86400  # a side whose partition has no profile (any more): the schema's active.window


def _window(partition: str, partitions_dir: str | None) -> float:
    try:
        return load_profile(partition, partitions_dir).active.window
    except NoProfileError:
        return DEFAULT_WINDOW


def _compare(args, directory: str) -> int:
    if args.drift:
        raise StuneError("--compare and --drift: give one (--compare A A@previous is a before/after)")
    now = time.time()
    sides = [
        compare.load_side(directory, side, now, _window(compare.parse_side(side)[0], args.partitions_dir))
        for side in args.compare
    ]
    doc = compare.compare(*sides)
    fmt = "json" if args.json else args.format
    if fmt not in ("table", "json"):
        raise StuneError(f"--compare prints a table or JSON, not --format {fmt}")
    text = json_text(doc) if fmt == "json" else compare.text(doc)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    if args.png:
        _png(args.png, lambda: compare.png(args.png, doc))
    return EXIT_OK


def _png(path: str, draw) -> None:
    try:
        draw()
    except ImportError:
        raise StuneError(f"--png {path}: needs matplotlib (pip install 'slurm-tune[reports]')") from None
    except ValueError as exc:
        raise StuneError(f"--png {path}: {exc}") from None
    except OSError as exc:
        raise StuneError(f"--png {path}: {exc.strerror or exc}") from None


def _scaling(args, slurm, profile: Profile, directory: str) -> int:
    if args.max_nodes is not None and args.max_nodes < 1:
        raise StuneError(f"--max-nodes {args.max_nodes}: give a node count of at least 1")
    opts = scaling.Options(
        args.partition,
        directory,
        max_nodes=args.max_nodes,
        reservation=args.reservation,
        nodes=args.nodes.split(",") if args.nodes else None,
        dry_run=args.dry_run,
        wait_s=args.wait,
    )
    with store.SweepLock(directory, args.partition):  # the same nodes as a sweep's: one at a time
        out = scaling.run(
            slurm, profile, opts, log=(lambda line: print(line, file=sys.stderr)) if args.json else print
        )
    if args.dry_run:
        return EXIT_OK
    curves = out["curves"]
    if args.json:
        sys.stdout.write(scaling_out.json_doc(args.partition, out["sweep"], curves))
    else:
        sys.stdout.write(scaling_out.text(curves))
    if args.png:
        _png(args.png, lambda: scaling_out.png(args.png, args.partition, curves))
    return EXIT_ATTENTION if scaling.exit_attention(curves) else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
