"""`stune-sbatch`: drop-in sbatch with the partition's NCCL, binding, placement and recovery settings.

    stune-sbatch [sbatch options] [--dry-run] [--stage SRC[:NAME]]... [--stage-required] [script [args...]]
    stune-sbatch history [-n N]
    stune-sbatch history diff A B        (A, B: job ids, or -1 for the latest run, -2 the one before ...)
"""
from __future__ import annotations

import sys

from .common import EXIT_USAGE, guarded

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
    if argv[:1] in (["-n"], ["--last"]) and len(argv) == 2 and argv[1].isdigit():
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


def run_console(prog: str, func, internal_exit: int = 70):  # never returns
    """Run a hot-path console script (stune-sbatch, stune-task-prolog) and exit without the interpreter's
    teardown. These commands sit on a user's critical path: the collector would only run passes over freshly
    imported modules (there is nothing to free), and the teardown (~2 ms) frees memory the exit frees anyway.
    Output is flushed first."""
    import gc
    import os

    gc.disable()
    rc = guarded(prog, func, None, internal_exit=internal_exit)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # stdout closed under us (a pipe reader gone): nothing left to say
        pass
    os._exit(rc if isinstance(rc, int) else 1)


def main(argv: list[str] | None = None) -> int:
    if argv is not None:  # called from Python (tests): behave like any function
        return guarded(PROG, _main, argv)
    run_console(PROG, _main)
