"""The wire form of a verdict in the job's AdminComment line: one token, no spaces.

    c1;<status>;<key>:<value>;<key>:<value>...

`c1` names the format (a later one is `c2`, which this reader refuses). A value is a list of items joined by
`,`; an item is parts joined by `~`; a part is text with every character outside `A-Za-z0-9._+-/`
percent-escaped as UTF-8 (`AWS Libfabric` -> `AWS%20Libfabric`), so `;`, `:`, `,`, `~`, `=`, `%` and blanks
occur only as the format's own separators (`=` never: the AdminComment line is `key=value` tokens).
Empty fields are left out. verdict.py maps NodeVerdict's fields onto keys; this module only packs them.
"""

from __future__ import annotations

FORMAT = "c1"
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-/")
_HEX = "0123456789ABCDEF"
NUMBER_DIGITS = 12  # a count decoded has at most this many digits: no text can make a huge int


def escape(text: str) -> str:
    if all(c in _SAFE for c in text):
        return text
    return "".join(
        c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8", "replace")) for c in text
    )


def unescape(text: str) -> str | None:
    """The text `escape` made, or None when it is not one (a bad escape, a raw separator, bad UTF-8)."""
    if "%" not in text:
        return text if all(c in _SAFE for c in text) else None
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(h not in _HEX for h in pair):
                return None
            out.append(int(pair, 16))
            i += 3
        elif c in _SAFE:
            out.append(ord(c))
            i += 1
        else:
            return None
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def number(text: str) -> int | None:
    if 1 <= len(text) <= NUMBER_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def items(rows) -> str:
    """[(a, 1), (b, 2)] -> `a~1,b~2`; [x, y] -> `x,y` (each part escaped)."""
    out = []
    for row in rows:
        parts = row if isinstance(row, tuple) else (row,)
        out.append("~".join(escape(str(p)) for p in parts))
    return ",".join(out)


def parse_items(text: str, arity: int) -> list[tuple[str, ...]] | None:
    """`items`' inverse for rows of `arity` parts; None when any row has another arity or a bad part."""
    rows = []
    for item in text.split(","):
        parts = item.split("~")
        if len(parts) != arity:
            return None
        plain = [unescape(p) for p in parts]
        if any(p is None for p in plain):
            return None
        rows.append(tuple(p for p in plain if p is not None))
    return rows


def pack(status: str, fields: list[tuple[str, str]]) -> str:
    return ";".join([FORMAT, escape(status)] + [f"{key}:{value}" for key, value in fields if value])


def unpack(text: str, max_len: int = 4096) -> tuple[str, dict[str, str]] | None:
    """(status, {key: raw value}) of a packed token, or None when it is not one of this format."""
    if not isinstance(text, str) or not text or len(text) > max_len:
        return None
    parts = text.split(";")
    if len(parts) < 2 or parts[0] != FORMAT:
        return None
    status = unescape(parts[1])
    if status is None:
        return None
    fields: dict[str, str] = {}
    for part in parts[2:]:
        key, sep, value = part.partition(":")
        if not sep or not key or key in fields or not value:
            return None
        fields[key] = value
    return status, fields
