"""`stune-sbatch`: drop-in sbatch with the partition's NCCL, binding, placement and recovery settings.

    stune-sbatch [sbatch options] [--dry-run] [--stage SRC[:NAME]]... [--stage-required] [--stage-strict]
                 [--checkpoint-signal] [--node-summary] [script [args...]]
    stune-sbatch history [-n N]
    stune-sbatch history diff A B        (A, B: job ids, or -1 for the latest run, -2 the one before ...)
"""
from __future__ import annotations

import sys

from ..text import is_digits
from .common import EXIT_USAGE, run_console

PROG = "stune-sbatch"


def _history(argv: list[str]) -> int:
    from ..sbatch import history

    if argv[:1] == ["diff"]:
        if len(argv) != 3:
            print(f"{PROG}: usage: {PROG} history diff A B (job ids, or -1 for the latest run)", file=sys.stderr)
            return EXIT_USAGE
        entries = history.load()
        a, b = history.find(entries, argv[1]), history.find(entries, argv[2])
        lines = history.diff(a, b)
        print(f"history diff {a.get('job_id')} ({history.when(a)}) -> {b.get('job_id')} ({history.when(b)})")
        print("\n".join(lines) if lines else "no difference in partition, profile, command or environment")
        return 0
    limit = None
    if argv[:1] in (["-n"], ["--last"]) and len(argv) == 2 and is_digits(argv[1]):
        limit = int(argv[1])
    elif argv:
        print(f"{PROG}: usage: {PROG} history [-n N] | history diff A B", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(history.format_list(history.load(), limit))
    return 0


def _main(argv: list[str]) -> int:
    if argv[:1] == ["history"]:
        return _history(argv[1:])
    from ..sbatch.submit import run

    return run(argv)


def main(argv: list[str] | None = None) -> int:
    return run_console(PROG, _main, argv)
