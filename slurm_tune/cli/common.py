"""Shared by every entry point: the error-to-exit-status boundary."""

from __future__ import annotations

import os
import sys

# The exit statuses live with the error family (errors.py, imported here anyway); re-exported for the commands.
from ..errors import (
    EXIT_ATTENTION,
    EXIT_CANNOT_RUN,
    EXIT_ERROR,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    StuneError,
)

__all__ = [
    "EXIT_ATTENTION",
    "EXIT_CANNOT_RUN",
    "EXIT_ERROR",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "guarded",
    "run_console",
]


def guarded(prog: str, func, argv: list[str] | None, internal_exit: int = EXIT_INTERNAL) -> int:
    """Run func(argv); a StuneError becomes `prog: message` and exit 1, a bug becomes one line and
    `internal_exit` (a prolog passes 0 there: a bug in stune must never drain a node)."""
    try:
        return func(sys.argv[1:] if argv is None else argv)
    except StuneError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the boundary: never a traceback, unless asked for
        if os.environ.get("STUNE_DEBUG"):
            raise
        print(
            f"{prog}: internal error: {type(exc).__name__}: {exc} (set STUNE_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return internal_exit


def run_console(
    prog: str, func, argv: list[str] | None, internal_exit: int = EXIT_INTERNAL, outcome=None
) -> int:
    """guarded() for a hot-path console script (stune-sbatch, stune-task-prolog, stune-health), then
    `outcome(status)` when given (a hook's rule for which statuses may leave it). Called from Python with an
    argv (tests), it returns like any function. As the console script (argv None) it exits without the
    collector's passes and the interpreter's teardown, which free nothing the exit does not (hot path: see
    docs/speed.md). Output is flushed first."""
    if argv is not None:
        rc = guarded(prog, func, argv, internal_exit)
        return outcome(rc) if outcome else rc
    import gc

    gc.disable()
    rc = guarded(prog, func, None, internal_exit=internal_exit)
    if outcome:
        rc = outcome(rc)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # stdout closed under us (a pipe reader gone): nothing left to say
        pass
    os._exit(rc if isinstance(rc, int) else EXIT_ERROR)
