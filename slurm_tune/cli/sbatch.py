"""`stune-sbatch`: drop-in sbatch with the partition's NCCL, binding, placement and recovery settings.

stune-sbatch [sbatch options] [--dry-run] [--stage SRC[:NAME]]... [--stage-required] [--stage-strict]
             [--checkpoint-signal] [--node-summary] [script [args...]]
stune-sbatch [sbatch options] --dry-run --json [script]   (the dry run as JSON)
stune-sbatch history [-n N] [--json]     (each run with its samples/s and data wait: docs/steps.md)
stune-sbatch history diff A B [--json]   (A, B: job ids, or -1 for the latest run, -2 the one before ...;
                                         the throughput change first, next to the settings change)
"""

from __future__ import annotations

import sys

from ..text import is_digits
from .common import EXIT_OK, run_console

PROG = "stune-sbatch"


def _history_parser():
    import argparse

    from . import options

    parser = argparse.ArgumentParser(
        prog=f"{PROG} history",
        description=(
            "the submissions recorded for you, with each job's samples/s and data wait (docs/steps.md); "
            "`diff A B`: what changed between two runs"
        ),
    )
    parser.add_argument(
        "words",
        nargs="*",
        metavar="diff A B",
        help="A, B: job ids, or -1 for the latest run, -2 the one before ...",
    )
    parser.add_argument("-n", "--last", type=_count, metavar="N", help="only the last N submissions")
    options.add(parser, "json", help="the submissions (or the diff) as JSON")
    return parser


def _count(text: str) -> int:
    import argparse

    if not is_digits(text):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of submissions")
    return int(text)


def _history_load(historyview):
    """The history, and one line on stderr when lines of it were skipped (torn or garbled)."""
    entries = historyview.load()
    if entries.warning():
        print(f"{PROG}: warning: {entries.warning()}", file=sys.stderr)
    return entries


def _throughput(historyview, entries: list[dict]) -> dict:
    """The runs' steps summaries (one sacct call), and one line on stderr when sacct could not answer."""
    if not entries:
        return {}
    rates, warning = historyview.throughput(entries)
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return rates


def _with_steps(entry: dict, rates: dict) -> dict:
    from ..sbatch.historyview import run_key

    stats = rates.get(run_key(entry))
    return dict(entry, steps=None if stats is None else stats.as_dict())


def _history(argv: list[str]) -> int:
    from ..output import print_json
    from ..sbatch import historyview

    parser = _history_parser()
    # `-1`/`-2` name runs, not options: everything after `diff` is positional
    if argv[:1] == ["diff"]:
        rest = [w for w in argv[1:] if w != "--json"]
        args = parser.parse_args(
            ["--", "diff", *rest] if "--json" not in argv else ["--json", "--", "diff", *rest]
        )
    else:
        args = parser.parse_args(argv)
    if args.words[:1] == ["diff"]:
        if len(args.words) != 3 or args.last is not None:
            parser.error("usage: history diff A B (job ids, or -1 for the latest run)")
        entries = _history_load(historyview)
        a, b = historyview.find(entries, args.words[1]), historyview.find(entries, args.words[2])
        lines = historyview.diff(a, b)
        found, warning = historyview.records([a, b])
        if warning:
            print(f"{PROG}: warning: {warning}", file=sys.stderr)
        rates = historyview.steps_of(found)
        bounds = historyview.bounds_of([a, b], found)
        summary = historyview.headline(a, b, rates, bounds)
        if args.json:
            print_json(
                {
                    "a": _with_steps(a, rates),
                    "b": _with_steps(b, rates),
                    "summary": summary,
                    "changes": historyview.changes(a, b),
                    "bound": {
                        "a": bounds.get(historyview.run_key(a)),
                        "b": bounds.get(historyview.run_key(b)),
                    },
                    "differences": lines,
                }
            )
            return EXIT_OK
        print(
            f"history diff {a.get('job_id')} ({historyview.when(a)}) -> {b.get('job_id')} ({historyview.when(b)})"
        )
        print(summary)
        print("\n".join(lines) if lines else "no difference in partition, profile, command or environment")
        return EXIT_OK
    if args.words:
        parser.error(f"unknown words {' '.join(args.words)!r} (history [-n N] [--json] | history diff A B)")
    entries = _history_load(historyview)
    shown = entries[-args.last :] if args.last else list(entries)
    rates = _throughput(historyview, shown)
    if args.json:
        print_json([_with_steps(entry, rates) for entry in shown])
        return EXIT_OK
    sys.stdout.write(historyview.format_list(shown, None, rates))
    return EXIT_OK


def _main(argv: list[str]) -> int:
    if argv[:1] == ["history"]:
        return _history(argv[1:])
    from ..sbatch.submit import run

    return run(argv)


def main(argv: list[str] | None = None) -> int:
    return run_console(PROG, _main, argv)
