"""Reading what opsuite.py and trainrun.py printed: their one `STUNE-VALIDATE {json}` line, checked key by key.
Anything else (no such line, bytes that are not UTF-8 or JSON, a key missing or of the wrong kind, a number
that is not finite or out of range) is unknown, with why: never a pass, never a fail.
"""

from __future__ import annotations

import json

from .torchdev import MARK

TEXT_MAX = 300
MAX_OPS = 64
MAX_SAMPLE = 256
MAX_LOSSES = 10001
NUMBER_MAX = 1e300
CONVERGE_KEYS = ("steps", "loss_every", "losses", "cold", "steady", "peak_mem_bytes", "peak_mem_kind")


class Unreadable(ValueError):
    pass


def _text(doc: dict, key: str, limit: int = TEXT_MAX) -> str:
    v = doc.get(key, "")
    if not isinstance(v, str):
        raise Unreadable(f"{key} is not text")
    return v[:limit]


def _int(doc: dict, key: str, lo: int = 0, hi: int = 2**62) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise Unreadable(f"{key} is not a whole number in [{lo}, {hi}]")
    return v


def _num(v, key: str, none_ok: bool = True) -> float | None:
    if v is None and none_ok:
        return None
    if (
        isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= NUMBER_MAX
    ):  # NaN compares false
        raise Unreadable(f"{key} is not a finite number")
    return float(v)


def _numbers(v, key: str, limit: int) -> list:
    if not isinstance(v, list) or len(v) > limit:
        raise Unreadable(f"{key} is not a list of at most {limit} numbers")
    return [_num(x, key) for x in v]


def _versions(doc: dict) -> dict:
    return {k: _text(doc, k, 120) for k in ("torch", "device", "backend", "accel_version")}


def _op(e) -> dict:
    if not isinstance(e, dict):
        raise Unreadable("an operator entry is not an object")
    op = {"op": _text(e, "op", 40), "dtype": _text(e, "dtype", 16), "detail": _text(e, "detail")}
    if not op["op"] or not op["dtype"]:
        raise Unreadable("an operator entry names no operator or dtype")
    status = e.get("status")
    if status in ("unsupported", "error"):
        return dict(op, status=status)
    if status != "ok":
        raise Unreadable(f"operator {op['op']}: status {str(status)[:20]!r}")
    bad = _int(e, "nonfinite")
    errors = {
        "max_abs": _num(e.get("max_abs"), "max_abs", none_ok=bad > 0),
        "max_rel": _num(e.get("max_rel"), "max_rel", none_ok=bad > 0),
        "scale": _num(e.get("scale"), "scale", none_ok=False),
    }
    if any(x is not None and x < 0 for x in errors.values()):
        raise Unreadable(f"operator {op['op']}: a negative error")
    sample = _numbers(e.get("sample"), "sample", MAX_SAMPLE)
    return dict(
        op, status="ok", nonfinite=bad, sample=sample, seconds=_num(e.get("seconds"), "seconds"), **errors
    )


def _phase(v, key: str) -> dict:
    if not isinstance(v, dict):
        raise Unreadable(f"{key} is not an object")
    seconds = _num(v.get("seconds"), f"{key}.seconds", none_ok=False)
    rate = _num(v.get("steps_per_s"), f"{key}.steps_per_s")
    if seconds is None or seconds < 0 or (rate is not None and rate < 0):
        raise Unreadable(f"{key}: a negative time")
    return {"steps": _int(v, "steps"), "seconds": seconds, "steps_per_s": rate}


def _converge(doc: dict) -> dict:
    losses = _numbers(doc.get("losses"), "losses", MAX_LOSSES)
    if not losses:
        raise Unreadable("no losses")
    return {
        "steps": _int(doc, "steps", 1),
        "loss_every": _int(doc, "loss_every", 1),
        "losses": losses,
        "cold": _phase(doc.get("cold"), "cold"),
        "steady": _phase(doc.get("steady"), "steady"),
        "peak_mem_bytes": _int(doc, "peak_mem_bytes"),
        "peak_mem_kind": _text(doc, "peak_mem_kind", 80),
    }


def _reject_constant(name: str):
    raise Unreadable(f"{name} is not a number JSON has")


def parse(output, layer: str) -> tuple[str, dict | None, str]:
    """(status, reading, detail) from a script's output (bytes or text): ("done", {...}, ""),
    ("unavailable", None, what to install) or ("unknown", None, why)."""
    data = output.encode("utf-8", "replace") if isinstance(output, str) else bytes(output)
    lines = [line for line in data.split(b"\n") if line.startswith(MARK.encode())]
    if not lines:
        tail = data.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(no output)"]
        return "unknown", None, f"the {layer} script printed no result; its last line: {tail[0][:200]}"
    try:
        doc = json.loads(lines[-1][len(MARK) :].decode("utf-8"), parse_constant=_reject_constant)
        if not isinstance(doc, dict) or doc.get("layer") != layer:
            raise Unreadable(f"not a {layer} result")
        if doc.get("status") == "unavailable":
            return "unavailable", None, _text(doc, "detail", 600) or "PyTorch is not available"
        if doc.get("status") != "done":
            raise Unreadable(f"status {str(doc.get('status'))[:20]!r}")
        reading: dict = dict(_versions(doc), seed=_int(doc, "seed"))
        if layer == "ops":
            ops = doc.get("ops")
            if not isinstance(ops, list) or not 0 < len(ops) <= MAX_OPS:
                raise Unreadable(f"ops is not a list of 1 to {MAX_OPS} operators")
            reading["ops"] = [_op(e) for e in ops]
        else:
            reading.update(_converge(doc))
        return "done", reading, ""
    except (Unreadable, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return "unknown", None, f"unreadable output from the {layer} script: {str(exc)[:200]}"
