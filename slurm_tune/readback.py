"""Numbers read back from stune's own files (the fair-share ledger, node health state, the active-check
store, the cache tier ledger, the submission history): the one rule. A number stune wrote is a JSON int or
float, finite and inside a range it could have written; anything else (NaN, inf, -1e300, 1e308, "abc", true)
is garbage or tampering, never acted on. `problem` says what is wrong (for readers that skip a bad record);
`number` raises CorruptFileError naming the file and the key (for files read whole); `parse` reads one
written as text.

On the prolog path (health state): imports nothing beyond errors.py.
"""

from __future__ import annotations

from .errors import CorruptFileError

EPOCH_MAX = 1e10  # a time stune writes: seconds since 1970, before the year 2286
COUNT_MAX = float(1 << 62)  # a counter (error counters, sequence numbers, bytes): below 2**62
AMOUNT_MAX = 1e18  # an accumulated amount (usage in TRES-seconds): ~3e10 years of one million CPUs


def problem(value, lo: float = 0.0, hi: float = COUNT_MAX, *, integer: bool = False) -> str | None:
    """None when `value` is a finite int (or float, unless `integer`) with lo <= value <= hi; else why not."""
    kind = type(value)
    if kind is not int and (integer or kind is not float):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        return f"{shown} is not {'an integer' if integer else 'a number'}"
    if lo <= value <= hi:  # the common case first: NaN and (with finite bounds) inf fail it
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return f"{value!r} is not a finite number"
    if not lo <= value <= hi:
        return f"{value!r} is out of range ({lo:g} to {hi:g})"
    return None


def number(value, path: str, key: str, lo: float = 0.0, hi: float = COUNT_MAX, *, integer: bool = False):
    """`value` when it passes `problem`; otherwise CorruptFileError "path: key: problem"."""
    why = problem(value, lo, hi, integer=integer)
    if why:
        raise CorruptFileError(path, None, key, why)
    return value


def optional(value, path: str, key: str, lo: float = 0.0, hi: float = COUNT_MAX, *, integer: bool = False):
    """`number`, but None passes (a field stune leaves empty until it knows it)."""
    return None if value is None else number(value, path, key, lo, hi, integer=integer)


def parse(text: str, lo: float = 0.0, hi: float = COUNT_MAX, *, integer: bool = False):
    """A number written as text (a tier ledger row, a stamp line): plain ASCII digits for an integer, a
    decimal for a float; None when it is not one, or fails `problem`."""
    text = text.strip()
    value: float  # an int when `integer`
    if not text.isascii() or len(text) > 40:
        return None
    if integer:
        if not text.isdigit():
            return None
        value = int(text)
    else:
        try:
            value = float(text)
        except ValueError:
            return None
    return None if problem(value, lo, hi, integer=integer) else value
