"""Run every check family over one snapshot. A family that raises yields "unknown", never "fail"."""
from __future__ import annotations

from . import gpu, ib, versions, xid
from . import result as R

FAMILIES = (("ib", ib.check), ("versions", versions.check), ("gpu", gpu.check), ("xid", xid.check))


def judge(snapshot, profile, previous: dict | None = None) -> tuple[R.Verdict, dict]:
    """(verdict, state updates) for `snapshot` under `profile`, given the node's previous state."""
    previous = previous if isinstance(previous, dict) else {}
    if not isinstance(snapshot, dict):
        return R.make_verdict([R.unknown("snapshot", "node", "not a snapshot (expected a JSON object)")]), {}
    results: list = []
    updates: dict = {}
    for name, family in FAMILIES:
        try:
            found, changes = family(snapshot, profile, previous)
        except Exception as exc:  # a bug in a check must never drain a node
            found, changes = [R.unknown(f"{name}.internal", "node",
                                        f"internal error in the {name} checks: {type(exc).__name__}: {exc}")], {}
        results += found
        updates.update(changes)
    return R.make_verdict(results), updates


def merge_state(state: dict, updates: dict, *, rebaseline: bool) -> None:
    """Fold a judgement's updates into the node state. Counter baselines move only when `rebaseline` (the
    periodic run: thresholds are per run); a hook only adds baselines for ports that had none."""
    new = updates.get("baselines")
    if isinstance(new, dict):
        old = state.get("baselines") if isinstance(state.get("baselines"), dict) else {}
        if rebaseline:
            old.update(new)
        else:
            for port, values in new.items():
                old.setdefault(port, values)
        state["baselines"] = old
    for key in ("xid_seq", "xid_sticky", "boot_id", "gpu_pci"):
        if key in updates:
            state[key] = updates[key]
