"""JSON for the hot paths, through CPython's C scanner and encoder (`_json`).

`import json` costs ~6 ms here because json.decoder and json.encoder import `re` for their pure-Python
fallbacks; the C accelerator they wrap needs neither. The prolog and `stune-health check` run in ~15 ms in
all, so this matters. Semantics are json's: the same scanner and encoder, with json's defaults. Any error,
or an interpreter without `_json`, falls back to the `json` module itself, so messages (with line numbers)
are json's own.

`_json` is CPython's private API: its signatures may change in any release. Both C entry points are built
and tried on a known value at import; if either raises or answers differently, that direction uses `json`
(a few ms slower), so a Python upgrade can never break the hooks at import time.
"""
from __future__ import annotations

try:
    import _json
except ImportError:  # not CPython: the plain module does the same, a few ms slower
    _json = None

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _DecoderContext:
    """The attributes the C scanner reads from a json.JSONDecoder, with JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


_WHITESPACE = " \t\n\r"
# A value that exercises every kind the hooks write and read, and its exact json.dumps(sort_keys, compact).
_PROBE = {"b": [1, -2.5, None, True, False, "\u00e9\n\"x"], "a": {"k": 1e100}}
_PROBE_TEXT = '{"a":{"k":1e+100},"b":[1,-2.5,null,true,false,"\\u00e9\\n\\"x"]}'


def _make_scanner():
    """The C scanner, or None when `_json` is missing or not what this code expects."""
    if _json is None:
        return None
    try:
        scan = _json.make_scanner(_DecoderContext())
        if scan(_PROBE_TEXT, 0) != (_PROBE, len(_PROBE_TEXT)):
            return None
    except Exception:
        return None
    return scan


_scan = _make_scanner()


def loads(text):
    """Like json.loads(text). Raises ValueError (json.JSONDecodeError) on bad input."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if _scan is not None and isinstance(text, str):
        start = 0
        while start < len(text) and text[start] in _WHITESPACE:
            start += 1
        try:
            value, end = _scan(text, start)
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
    if _json is None:
        return None
    try:
        encode = _json.make_encoder(None, _unserialisable, _json.encode_basestring_ascii, None, ":", ",", True,
                                    False, True)
        if "".join(encode(_PROBE, 0)) != _PROBE_TEXT:
            return None
    except Exception:
        return None
    return encode


_encode = _make_encoder()


def dumps(obj) -> str:
    """Compact, key-sorted JSON, like json.dumps(obj, sort_keys=True, separators=(",", ":"))."""
    if _encode is not None:
        return "".join(_encode(obj, 0))
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def load_file(path: str):
    """Parse a JSON file. OSError and ValueError propagate for the caller to word."""
    with open(path, "rb") as fh:
        return loads(fh.read())
