"""What an active check's parser returns: a Reading (ok with a number, fail, unavailable, or unknown with the
reason), and the rules every parser (parse.py, parse_io.py) reads numbers and output by: numbers only in the
tools' own notation, finite and below a sanity bound, and only from complete lines."""

from __future__ import annotations

import re
from collections import namedtuple

OK, FAIL, UNKNOWN, UNAVAILABLE = "ok", "fail", "unknown", "unavailable"
MAX_VALUE = 1e7  # no link or disk reaches 10 PB/s; anything above is a misread
NUMBER = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,12})?\Z")
EXP_NUMBER = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,12})?(?:[eE][-+]?[0-9]{1,3})?\Z")


class Reading(namedtuple("Reading", "status value unit detail extra")):
    """status: ok/fail/unknown; value: float or None; unit: e.g. 'GB/s'; detail: one line for a human;
    extra: small dict of what else the output said (nccl version, per-test sums...)."""

    __slots__ = ()


def ok(value: float, unit: str, detail: str, **extra) -> Reading:
    return Reading(OK, value, unit, detail, extra)


def fail(detail: str, value=None, unit: str = "", **extra) -> Reading:
    return Reading(FAIL, value, unit, detail, extra)


def unknown(detail: str, **extra) -> Reading:
    return Reading(UNKNOWN, None, "", detail, extra)


def unavailable(detail: str, **extra) -> Reading:
    """The tool (or what it needs) is not installed: summarized as "not available", never marks a node."""
    return Reading(UNAVAILABLE, None, "", detail, extra)


def text_of(output) -> str:
    """Tool output as text: bytes are decoded leniently (a stray byte must not hide the result lines)."""
    if isinstance(output, (bytes, bytearray, memoryview)):
        return bytes(output).decode("utf-8", "replace")
    return output if isinstance(output, str) else ""


def complete_lines(output) -> list[str]:
    """The output's lines, without a last line that was cut mid-way (no newline): a number cut short
    ('428.53' -> '4') must not be read."""
    text = text_of(output)
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        lines.pop()
    return lines


def number(token: str, exponent: bool = False) -> float | None:
    """A plain decimal as the tools print it, or None. Rejects nan, inf, '1_000', signs, absurd sizes."""
    if not isinstance(token, str) or not (EXP_NUMBER if exponent else NUMBER).match(token):
        return None
    value = float(token)
    return value if 0.0 <= value <= MAX_VALUE else None


def json_number(value) -> float | None:
    """A JSON number a tool wrote (an int or a finite float, not a bool), within the bound; else None."""
    if type(value) is int:
        return float(value) if 0 <= value <= MAX_VALUE * 1e9 else None
    if type(value) is float and value == value and 0.0 <= value <= MAX_VALUE * 1e9:
        return value
    return None


def first_error(lines, markers) -> str | None:
    """The first line that holds one of the tool's error markers, cut to 200 characters; None if none."""
    for line in lines:
        stripped = line.strip()
        if any(m in stripped for m in markers):
            return stripped[:200]
    return None
