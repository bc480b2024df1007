"""Tolerant readers of the store's two other record streams: the validation layers' (`validate`, judged by
stune-validate's own validator, validate/records.py) and the scaling curves' (`scaling`), as the comparison
and the acceptance page read them.

A record is accepted only when every field those readers use has the type and range stune writes; anything
else (a torn line, a foreign field type, NaN, a huge number) skips the whole record, never raises. Fields
they do not use are not looked at, so a later writer may add some.

validate: {at, partition, layer: ops|converge|training, node, job, status, detail, fingerprint, ...}; ops
adds `ops` [{op, dtype, status, max_abs, max_rel, tol_abs, tol_rel, ref}]; converge adds max_dev, band,
steps, cold/steady {steps, seconds, steps_per_s}, peak_mem_bytes; training adds verdict, note, by.
scaling: {at, partition, sweep, scope: node|nodes, check, unit, points [{n, value, status, efficiency}],
baseline, knee: null|{n, efficiency, why, ...}, verdict, fingerprint}.
"""

from __future__ import annotations

from ..readback import EPOCH_MAX, problem
from ..validate.records import VERSION_KEYS, valid_record
from . import store
from .store import FINGERPRINT_KEYS, VALUE_MAX

VERDICTS = ("pass", "knee", "fail", "unknown", "skipped")
SCOPES = ("node", "nodes")
VALIDATE_PARTS = VERSION_KEYS  # what a validation record's fingerprint adds
TEXT_MAX = 4096  # a name or a detail longer than this is not one stune wrote
MAX_ITEMS = 4096  # operators per record, points per curve


def _text(v, optional: bool = True) -> bool:
    if v is None:
        return optional
    return isinstance(v, str) and len(v) <= TEXT_MAX


def _num(v, hi: float = VALUE_MAX) -> bool:
    """None, or a finite number in [0, hi] (not a bool: JSON's true is no measurement)."""
    return v is None or (type(v) is not bool and problem(v, 0, hi) is None)


def _count(v) -> bool:
    return v is None or (type(v) is int and 0 <= v <= 1 << 40)


def _fingerprint(fp) -> bool:
    return isinstance(fp, dict) and all(_text(fp.get(k)) for k in (*FINGERPRINT_KEYS, *VALIDATE_PARTS))


def _common(r) -> bool:
    return (
        isinstance(r, dict)
        and problem(r.get("at"), 0, EPOCH_MAX) is None
        and _fingerprint(r.get("fingerprint"))
    )


def _point(p) -> bool:
    return (
        isinstance(p, dict)
        and type(p.get("n")) is int
        and 1 <= p["n"] <= 1 << 20
        and _num(p.get("value"))
        and _num(p.get("efficiency"))
        and _text(p.get("status"))
    )


def _knee(k) -> bool:
    return k is None or (
        isinstance(k, dict)
        and type(k.get("n")) is int
        and 1 <= k["n"] <= 1 << 20
        and _num(k.get("efficiency"))
        and _text(k.get("why"))
    )


def valid_scaling(r) -> bool:
    """A scaling curve's record stune could have written (module docstring)."""
    if not _common(r) or r.get("scope") not in SCOPES or r.get("verdict") not in VERDICTS:
        return False
    points = r.get("points")
    return (
        _text(r.get("check"), optional=False)
        and _text(r.get("unit"))
        and _text(r.get("sweep"))
        and isinstance(points, list)
        and len(points) <= MAX_ITEMS
        and all(_point(p) for p in points)
        and _knee(r.get("knee"))
    )


def load_validate(directory: str, partition: str, since: float, until: float | None = None) -> list[dict]:
    return store.load(directory, partition, since, until, kind="validate", accept=valid_record)


def load_scaling(directory: str, partition: str, since: float, until: float | None = None) -> list[dict]:
    return store.load(directory, partition, since, until, kind="scaling", accept=valid_scaling)
