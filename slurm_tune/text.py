"""Tiny text helpers shared by parsers of Slurm and kernel output."""


def is_digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and other Unicode digits that int() rejects."""
    return text.isascii() and text.isdigit()


VERSION_PARTS_MAX = 8  # components of a version: 535.104.05 has 3, a VBIOS like 96.00.74.00.0D has 5
VERSION_PART_DIGITS = 9  # digits per component: bounded, so no text can make int() slow or huge
_HEX = "0123456789abcdefABCDEF"


def parse_version(text, hex_parts: bool = False) -> tuple | None:
    """The numeric tuple of a fully well-formed dotted version, else None.

    Well formed: 1-8 components separated by single dots, each 1-9 ASCII digits (hex digits for a VBIOS,
    `hex_parts`), nothing else but surrounding whitespace. `20.31.1014` -> (20, 31, 1014); `20.31.10\ufffd14`,
    `20.31`+5000 digits, `v1.2`, `1..2` and `` -> None. A version that is not exactly this is unreadable,
    never a lower version: garbage must not fail a node."""
    if not isinstance(text, str):
        return None
    text = text.strip(" \t\r\n")
    if not text or len(text) > VERSION_PARTS_MAX * (VERSION_PART_DIGITS + 1) or not text.isascii():
        return None
    parts = text.split(".")
    if len(parts) > VERSION_PARTS_MAX:
        return None
    out = []
    for part in parts:
        if not 1 <= len(part) <= VERSION_PART_DIGITS:
            return None
        if hex_parts:
            if any(c not in _HEX for c in part):
                return None
            out.append(int(part, 16))
        elif is_digits(part):
            out.append(int(part))
        else:
            return None
    return tuple(out)


def counted(count, noun: str, plural: str | None = None) -> str:
    """`1 GPU`, `2 GPUs`, `0.5 GPUs`, `1 job`: a count and its noun, plural unless the count is exactly 1."""
    return f"{count:g} {noun if count == 1 else (plural or noun + 's')}"


_PRE_RELEASE = ("alpha", "beta", "rc")  # in release order; a pre-release sorts before the release it precedes


def parse_vendor_version(text) -> tuple | None:
    """The sort key of an accelerator stack's version, else None: dotted parts of digits, or a pre-release tag
    with its number (Ascend's `24.1.rc2`, CANN's `8.0.RC2`, `8.1.RC1.alpha003`), bounded as parse_version.
    `24.1.rc2` < `24.1.rc3` < `24.1.0` < `24.1.1`; garbage is None (unreadable, never lower)."""
    if not isinstance(text, str):
        return None
    text = text.strip(" \t\r\n")
    if not text or len(text) > VERSION_PARTS_MAX * (VERSION_PART_DIGITS + 6) or not text.isascii():
        return None
    parts = text.split(".")
    if len(parts) > VERSION_PARTS_MAX:
        return None
    out: list[tuple[int, int, int]] = []
    for part in parts:
        low = part.lower()
        tag = next((t for t in _PRE_RELEASE if low.startswith(t)), None)
        number = low[len(tag) :] if tag else low
        if not 1 <= len(number) <= VERSION_PART_DIGITS or not is_digits(number):
            return None
        # (0, tag rank, n) for a pre-release part, (1, n, 0) for a number: 'rc2' sorts before '0'
        out.append((0, _PRE_RELEASE.index(tag), int(number)) if tag else (1, int(number), 0))
    out.append((0, len(_PRE_RELEASE), 0))  # the end sorts after a trailing tag: 8.1.RC1.alpha3 < 8.1.RC1
    return tuple(out)
