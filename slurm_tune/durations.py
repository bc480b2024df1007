"""Durations: the one rule set for every length of time stune reads or prints.

stune's own durations (config keys, `--since`, `--half-life`, ...) and Slurm's (`scontrol show config`,
slurm.conf, `--time`) are read by the same rules:

* a number of seconds: `300`, `1.5` (a bare number counts `bare_unit` seconds: 1 for stune, 60 where Slurm
  counts minutes, as in `--time` and slurm.conf);
* a number with a unit, or several in descending order: `90s`, `10m`, `1.5h`, `7d`, `2w`, `1d12h`;
* Slurm's clock forms: `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` (`7-00:00:00`).

Units are case-insensitive; surrounding blanks are ignored; anything else (a sign, an exponent, NaN, an
unknown unit) is a DurationError that says what a duration looks like. Callers name the key or option.
`compact()` and `clock()` print durations back in forms `parse()` reads.

On the prolog and stune-sbatch paths: imports nothing.
"""

from __future__ import annotations

from .errors import StuneError

UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
EXAMPLES = "300, 90s, 10m, 1.5h, 7d, 2w, 1d12h or 7-00:00:00"
# Slurm prints these where a duration has no finite value.
SLURM_NONE = ("NONE", "(NULL)", "N/A")
SLURM_INFINITE = ("INFINITE", "UNLIMITED")
_MAX_DIGITS = 30  # no duration anyone means has more; bounds the work a hostile string can cause


class DurationError(StuneError, ValueError):
    """Text that is not a duration. str() is the problem alone; the caller names the key."""

    def __init__(self, text, problem: str | None = None):
        self.text = text
        super().__init__(problem or f"{text!r} is not a duration (e.g. {EXAMPLES})")


def _number(text: str, original) -> float:
    """Digits with at most one decimal point: no sign, exponent, underscores, 'inf' or 'nan'."""
    whole, dot, frac = text.partition(".")
    if (
        not (whole or frac)
        or len(text) > _MAX_DIGITS
        or not (whole + frac).isdigit()
        or not (whole + frac).isascii()
    ):
        raise DurationError(original)
    return float(text) if dot else int(whole)


def _clock(text: str, original) -> int:
    """Slurm's forms: M:S, H:M:S, D-H, D-H:M, D-H:M:S (every field an integer)."""
    days, dash, rest = text.partition("-")
    fields = rest.split(":") if dash else text.split(":")
    if len(fields) > 3 or (dash and not days):
        raise DurationError(original)
    for f in fields + ([days] if dash else []):
        if not f or len(f) > _MAX_DIGITS or not f.isdigit() or not f.isascii():
            raise DurationError(original)
    nums = [int(f) for f in fields]
    if dash:
        h, m, s = [*nums, 0, 0][:3]
        return int(days) * 86400 + h * 3600 + m * 60 + s
    if len(nums) == 2:
        return nums[0] * 60 + nums[1]
    return nums[0] * 3600 + nums[1] * 60 + nums[2]


def parse(text, *, bare_unit: int = 1) -> int:
    """Whole seconds from a duration (see the module's rules); a fraction of a second is dropped.
    A non-negative int or float (a YAML number) counts `bare_unit` seconds. DurationError otherwise."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise DurationError(text)
    if not isinstance(text, str):
        if not text >= 0 or text == float("inf"):  # also NaN
            raise DurationError(text, f"{text!r} must be a positive duration")
        return int(text * bare_unit)
    original = text
    text = text.strip().lower()
    if not text:
        raise DurationError(original)
    if ":" in text or "-" in text:
        if text.startswith("-"):
            raise DurationError(original, f"{original!r} must be a positive duration")
        return _clock(text, original)
    if text[-1].isdigit() or text[-1] == ".":
        return int(_number(text, original) * bare_unit)
    total, at, last_rank = 0.0, 0, -1
    while at < len(text):
        start = at
        while at < len(text) and (text[at].isdigit() or text[at] == "."):
            at += 1
        number = text[start:at]
        while at < len(text) and text[at] == " ":  # "90 s", "1d 12h"
            at += 1
        rank = next((i for i, (unit, _) in enumerate(UNITS) if at < len(text) and unit == text[at]), None)
        if (
            not number or rank is None or rank <= last_rank
        ):  # no number, unknown, repeated or out-of-order unit
            raise DurationError(original)
        total += _number(number, original) * UNITS[rank][1]
        at, last_rank = at + 1, rank
        while at < len(text) and text[at] == " ":
            at += 1
    return int(total)


def parse_slurm(text, *, bare_unit: int = 60) -> int | None:
    """A duration as Slurm writes it (`scontrol show config`, slurm.conf, `--time`): the same rules, a bare
    number in minutes by default, `300 sec` as scontrol prints timeouts; NONE/(null) is 0, INFINITE or
    UNLIMITED is None. DurationError for anything else."""
    text = str(text if text is not None else "").strip()
    upper = text.upper()
    if not text or upper in SLURM_NONE:
        return 0
    if upper in SLURM_INFINITE:
        return None
    if upper.endswith(" SEC"):
        return parse(text[:-4], bare_unit=1)
    return parse(text, bare_unit=bare_unit)


def compact(seconds) -> str:
    """`1d12h`, `2w`, `90s` -> 1d12h, 2w, 1m30s: the shortest unit form; parse() gives the seconds back."""
    seconds = int(seconds)
    if seconds <= 0:
        return "0s"
    out = []
    for unit, size in UNITS:
        n, seconds = divmod(seconds, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def clock(seconds) -> str:
    """H:MM:SS (hours unbounded), as sacct prints Elapsed under a day; parse() gives the seconds back."""
    h, rest = divmod(max(0, int(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def option(text, name: str, *, bare_unit: int = 1) -> int:
    """parse() for a command-line option or config key: the error names it (`--half-life '2x': ...`)."""
    try:
        return parse(text, bare_unit=bare_unit)
    except DurationError as exc:
        raise DurationError(text, f"{name}: {exc}") from None
