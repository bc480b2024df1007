"""How every command prints what it read: one column table, one JSON style.

- `table(rows, header)`: columns left-aligned, two spaces apart, no trailing blanks, one line per row
  (header included); the caller words the cells (`-`, `?`) and upper-cases a header if it wants to.
- `json_text(doc)`: keys sorted, indent 1, ASCII, one document ending in a newline; numbers that are not
  Python's own (Decimal, numpy) are written as floats, sets as sorted lists, named tuples as objects.
  `--json` on every read command prints exactly this; `--json-out`/`-o` files written for people use it too.

No imports at module level: the hot paths may import this module; json is loaded only when JSON is written.
"""

from __future__ import annotations


def table(rows, header=None) -> str:
    """Rows (sequences of cells: None is an empty cell, anything else str()) as aligned text, header first.
    No rows and no header give ''."""
    lines = [
        tuple("" if c is None else str(c) for c in row) for row in ([header] if header else []) + list(rows)
    ]
    if not lines:
        return ""
    columns = max(len(line) for line in lines)
    widths = [max((len(line[i]) for line in lines if i < len(line)), default=0) for i in range(columns)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() + "\n" for line in lines)


def _plain(obj):
    """json's `default`: what json itself cannot write, as the nearest JSON value; anything else is a bug."""
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "__index__"):
        return obj.__index__()
    if hasattr(obj, "__float__"):
        return float(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def json_text(doc) -> str:
    """The one JSON output style (see the module docstring)."""
    import json

    return json.dumps(_named(doc), indent=1, sort_keys=True, default=_plain) + "\n"


def compact_json(obj) -> str:
    """Compact, key-sorted JSON on one line: the form of stune's records (result lines, a job's spec)."""
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _named(obj):
    """Named tuples as objects (json would write them as arrays before `default` ever sees them)."""
    if hasattr(obj, "_asdict") and not isinstance(obj, type):  # a namedtuple or a frozen.Record
        return {k: _named(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_named(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _named(v) for k, v in obj.items()}
    return obj


def print_json(doc, stream=None) -> None:
    """Write json_text(doc) to stream (default: stdout)."""
    import sys

    (stream or sys.stdout).write(json_text(doc))
