"""Shared by every entry point: the error-to-exit-code boundary."""
from __future__ import annotations

import os
import sys

from ..errors import StuneError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE


def guarded(prog: str, func, argv: list[str] | None, internal_exit: int = EXIT_INTERNAL) -> int:
    """Run func(argv); a StuneError becomes `prog: message` and exit 1, a bug becomes one line and
    `internal_exit` (a prolog passes 0 there: a bug in stune must never drain a node)."""
    try:
        return func(sys.argv[1:] if argv is None else argv)
    except StuneError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the boundary: never a traceback, unless asked for
        if os.environ.get("STUNE_DEBUG"):
            raise
        print(f"{prog}: internal error: {type(exc).__name__}: {exc} (set STUNE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return internal_exit

