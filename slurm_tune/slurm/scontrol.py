"""Reading scontrol's text output: `show ... -o` records and `show config`.

Slurm 22.05's scontrol has no --json, so these are read as text on every release.
"""

from __future__ import annotations

from ..text import is_digits


def parse_records(text: str) -> list[dict[str, str]]:
    """Parse `scontrol show ... -o` output: one record per line, Key=Value pairs separated by spaces.
    A value may contain spaces (Reason=...), so a token without '=' continues the previous value."""
    records = []
    for line in text.splitlines():
        rec: dict[str, str] = {}
        last = None
        for token in line.split(" "):
            key, sep, value = token.partition("=")
            if sep and key and (key[0].isupper() or is_digits(key[0])) and "/" not in key:
                rec[key] = value
                last = key
            elif last is not None and token:
                rec[last] += " " + token
        if rec:
            records.append(rec)
    return records


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` (`Key = Value` lines under a header) as a dict: PriorityDecayHalfLife, ..."""
    conf = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and " " not in key:
            conf[key] = value.strip()
    return conf
