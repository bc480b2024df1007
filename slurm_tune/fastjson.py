"""JSON for the hot paths, through CPython's C scanner and encoder (`_json`).

`import json` costs ~6 ms here because json.decoder and json.encoder import `re` for their pure-Python
fallbacks; the C accelerator they wrap needs neither. The prolog and `stune-health check` run in ~15 ms in
all, so this matters. Semantics are json's: the same scanner and encoder, with json's defaults. Any error,
or an interpreter without `_json`, falls back to the `json` module itself, so messages (with line numbers)
are json's own.

`_json` is CPython's private API: its signatures may change in any release. Each C entry point is built
and tried on a known value when first needed; if it raises or answers differently, that direction uses
`json` (a few ms slower), so a Python upgrade can never break the hooks.

`dumps` of plain values (dicts with str keys, lists, str of printable ASCII without a quote or backslash,
int, bool, None: a submission's history record) is joined here without `_json`, whose load (a shared
library) costs more than the encoding; anything else goes to the C encoder.
"""

from __future__ import annotations

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


_WHITESPACE = " \t\n\r"
# A value that exercises every kind the hooks write and read, and its exact json.dumps(sort_keys, compact).
_PROBE = {"b": [1, -2.5, None, True, False, '\u00e9\n"x'], "a": {"k": 1e100}}
_PROBE_TEXT = '{"a":{"k":1e+100},"b":[1,-2.5,null,true,false,"\\u00e9\\n\\"x"]}'


def _c_json():
    try:
        import _json
    except ImportError:  # not CPython: the plain module does the same, a few ms slower
        return None
    return _json


_UNBUILT = object()
_scan = _encode = _UNBUILT  # the C entry points once built; None: not usable, json does the work


def _scanner():
    global _scan
    if _scan is _UNBUILT:
        _scan = _make_scanner()
    return _scan


def _make_scanner():
    """The C scanner, or None when `_json` is missing or not what this code expects."""
    _json = _c_json()
    if _json is None:
        return None

    class DecoderContext:  # built when first decoding (hot path: docs/speed.md)
        """The attributes the C scanner reads from a json.JSONDecoder, with JSONDecoder's defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = _CONSTANTS.__getitem__

        def __init__(self) -> None:
            self.memo: dict = {}  # an instance attribute, as on JSONDecoder

    try:
        scan = _json.make_scanner(DecoderContext())
        if scan(_PROBE_TEXT, 0) != (_PROBE, len(_PROBE_TEXT)):
            return None
    except Exception:
        return None
    return scan


def loads(text):
    """Like json.loads(text). Raises ValueError (json.JSONDecodeError) on bad input."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    scan = _scanner()
    if scan is not None and isinstance(text, str):
        start = 0
        while start < len(text) and text[start] in _WHITESPACE:
            start += 1
        try:
            value, end = scan(text, start)
        except StopIteration:
            value, end = None, -1
        except (ValueError, RecursionError, SystemError):
            # SystemError: the C scanner reports bad input through json.decoder, which is not imported
            end = -1
        if end >= 0:
            while end < len(text) and text[end] in _WHITESPACE:
                end += 1
            if end == len(text):
                return value
    import json  # the slow path: let json say exactly what is wrong, and where

    return json.loads(text)


def _unserialisable(obj):
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _make_encoder():
    """The C encoder (json's own arguments: markers, default, encoder, indent, key and item separators,
    sort_keys, skipkeys, allow_nan), or None when `_json` is missing or its private API changed."""
    _json = _c_json()
    if _json is None:
        return None
    try:
        encode = _json.make_encoder(
            None, _unserialisable, _json.encode_basestring_ascii, None, ":", ",", True, False, True
        )
        if "".join(encode(_PROBE, 0)) != _PROBE_TEXT:
            return None
    except Exception:
        return None
    return encode


def _encoder():
    global _encode
    if _encode is _UNBUILT:
        _encode = _make_encoder()
    return _encode


def dumps(obj) -> str:
    """Compact, key-sorted JSON, like json.dumps(obj, sort_keys=True, separators=(",", ":"))."""
    parts: list[str] = []
    if _plain(obj, parts):
        return "".join(parts)
    encode = _encoder()
    if encode is not None:
        return "".join(encode(obj, 0))
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _plain(obj, parts: list[str], depth: int = 0) -> bool:
    """Append obj's JSON to parts when every value in it is plain (module docstring); False otherwise (parts
    is then garbage). Exact types only: a str or int subclass may encode differently."""
    kind = type(obj)
    if kind is str:
        if not (obj.isascii() and obj.isprintable()) or '"' in obj or "\\" in obj:
            return False
        parts.append(f'"{obj}"')
    elif obj is None:
        parts.append("null")
    elif obj is True:
        parts.append("true")
    elif obj is False:
        parts.append("false")
    elif kind is int:
        parts.append(int.__repr__(obj))
    elif depth >= 50:  # far deeper than any record: json's own recursion rules decide
        return False
    elif kind is dict:
        parts.append("{")
        first = True
        for key in sorted(obj) if all(type(k) is str for k in obj) else ():
            if not first:
                parts.append(",")
            first = False
            if not _plain(key, parts, depth + 1):
                return False
            parts.append(":")
            if not _plain(obj[key], parts, depth + 1):
                return False
        if obj and first:  # keys that are not all str: json converts or refuses them
            return False
        parts.append("}")
    elif kind is list or kind is tuple:
        parts.append("[")
        for i, item in enumerate(obj):
            if i:
                parts.append(",")
            if not _plain(item, parts, depth + 1):
                return False
        parts.append("]")
    else:
        return False
    return True


def load_file(path: str):
    """Parse a JSON file. OSError and ValueError propagate for the caller to word."""
    with open(path, "rb") as fh:
        return loads(fh.read())
