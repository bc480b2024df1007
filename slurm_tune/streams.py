"""The one way stune writes a line of progress or a note: to a stream it does not own, ignoring failure.

A job's stderr file can be removed or its disk full, a pipe's reader can be gone, a test can pass a closed
stream: a note about the work must never fail the work. On the prolog, task-prolog and stune-sbatch paths:
imports nothing.
"""

from __future__ import annotations


def say(stream, line: str) -> bool:
    """Write `line` and a newline to `stream` and flush it. False when there is no stream or it failed
    (closed, broken pipe, no space), so a caller can stop writing to it; never raises for that."""
    if stream is None:
        return False
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):  # ValueError: I/O operation on a closed file
        return False
    return True
