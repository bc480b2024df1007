"""stune-validate's records: one JSON line per layer and node, stored with the active checks' results under
`<store>/validate/<partition>/<YYYY-MM>.jsonl` (active/store.py, kind "validate"). docs/validate.md has the
format; the acceptance page and the comparison report read it, so its keys stay.

    {at, partition, layer: ops|converge|training, node, job, status: pass|fail|unknown|unavailable, detail,
     fingerprint: {the active fingerprint's keys..., torch, device, backend, accel}, ...the layer's own keys}

An agent's record (inside the job) is not judged yet: its operators' status is `measured` and the record's
`unknown`, until stune-validate run judges it (judge.py) on the submitting host, where the store is.
"""

from __future__ import annotations

from ..readback import EPOCH_MAX, problem

LAYERS = ("ops", "converge", "training")
STATUSES = ("pass", "fail", "unknown", "unavailable")
OP_STATUSES = ("pass", "fail", "unsupported", "unknown")
MEASURED = "measured"  # an operator the agent ran, before judging
VERSION_KEYS = ("torch", "device", "backend")
NUMBER_MAX = 1e300


def _finite(v, none_ok: bool = True) -> bool:
    if v is None:
        return none_ok
    return not isinstance(v, bool) and isinstance(v, (int, float)) and abs(v) <= NUMBER_MAX  # not NaN, inf


def _op_ok(e, raw: bool) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("op"), str)
        and isinstance(e.get("dtype"), str)
        and e.get("status") in (*OP_STATUSES, *((MEASURED,) if raw else ()))
        and all(_finite(e.get(k)) for k in ("max_abs", "max_rel", "tol_abs", "tol_rel", "scale"))
        and isinstance(e.get("sample", []), list)
        and all(_finite(x) for x in e.get("sample", []))
    )


def valid_record(r, raw: bool = False) -> bool:
    """A record stune-validate could have written (store.load's `accept=`): its time in range, its layer,
    status and fingerprint of the right kinds, and its layer's own keys sound. `raw`: an agent's record, not
    judged yet (collect's check)."""
    if not isinstance(r, dict) or problem(r.get("at"), 0, EPOCH_MAX):
        return False
    if (
        r.get("layer") not in LAYERS
        or r.get("status") not in STATUSES
        or not all(isinstance(r.get(k), str) for k in ("partition", "node", "job", "detail"))
    ):
        return False
    fp = r.get("fingerprint")
    if not isinstance(fp, dict) or not all(isinstance(v, str) for v in fp.values()):
        return False
    layer = r["layer"]
    if layer == "ops":
        ops = r.get("ops")
        return isinstance(ops, list) and all(_op_ok(e, raw) for e in ops)
    if layer == "converge":
        losses = r.get("losses")
        return (
            isinstance(losses, list)
            and all(_finite(x) for x in losses)
            and _finite(r.get("max_dev"))
            and _finite(r.get("band"))
            and (r.get("reference") is None or isinstance(r.get("reference"), dict))
        )
    metrics = r.get("metrics")
    return (
        r.get("verdict") in ("pass", "fail")
        and isinstance(metrics, dict)
        and all(isinstance(k, str) and _finite(v, none_ok=False) for k, v in metrics.items())
        and isinstance(r.get("note", ""), str)
        and isinstance(r.get("by", ""), str)
    )


def version_matrix(fp: dict) -> str:
    """The fingerprint as one line, the software first: `torch 2.3.1, cuda H100 (NVIDIA ...), driver=...`."""
    head = f"torch {fp.get('torch') or '?'}, {fp.get('backend') or '?'} {fp.get('device') or '?'}"
    if fp.get("accel"):
        head += f" {fp['accel']}"
    rest = [f"{k}={v}" for k, v in sorted(fp.items()) if v and k not in (*VERSION_KEYS, "accel")]
    return head + (", " + ", ".join(rest) if rest else "")


def latest(records: list[dict], layer: str, node: str | None = None, passed: bool = False) -> dict | None:
    """The newest record of a layer (of one node; only passing ones): a reference, or `show`'s row."""
    for r in reversed(records):  # store.load gives them oldest first
        if (
            r["layer"] == layer
            and (node is None or r["node"] == node)
            and (not passed or r["status"] == "pass")
        ):
            return r
    return None
