"""Run every check family over one snapshot. A family that raises yields "unknown", never "fail"."""

from __future__ import annotations

from . import gpu, ib, result, transport, versions

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


def _xid(snapshot, profile: Profile, previous):
    """The xid family, imported only when there is something to judge: a kernel log (not in the prolog's
    snapshot: the incident engine) or Xids held from before (the prolog: what is held, nothing more)."""
    if "kernel" not in snapshot:
        if not previous.get("xid_sticky") and not previous.get("ladder"):
            return [], {}
        from . import xid

        return xid.held_check(snapshot, previous)
    from . import incidents

    return incidents.check(snapshot, profile, previous)


def _drift(snapshot, profile: Profile, previous):
    """The drift family, imported only when the snapshot has host settings to judge (the periodic run's and
    `stune-health capture`'s; never a hook's: docs/speed.md)."""
    if "drift" not in snapshot:
        return [], {}
    from . import drift

    return drift.check(snapshot, profile, previous)


def _accel(snapshot, profile: Profile, previous):
    """The accel family (AMD, Ascend: health/accel.py), imported only for such a partition or a snapshot with
    their sections; an NVIDIA node's hooks never load it."""
    if profile.accelerator == "nvidia" and "accel" not in snapshot and "pci_accel" not in snapshot:
        return [], {}
    from . import accel

    return accel.check(snapshot, profile, previous)


FAMILIES = (
    ("ib", ib.check),
    ("versions", versions.check),
    ("gpu", gpu.check),
    ("accel", _accel),
    ("xid", _xid),
    ("transport", transport.check),
    ("drift", _drift),
)


def judge(snapshot, profile: Profile, previous: dict | None = None) -> tuple[result.Verdict, dict]:
    """(verdict, state updates) for `snapshot` under `profile`, given the node's previous state."""
    previous = previous if isinstance(previous, dict) else {}
    if not isinstance(snapshot, dict):
        return result.make_verdict(
            [result.unknown("snapshot", "node", "not a snapshot (expected a JSON object)")]
        ), {}
    results: list = []
    updates: dict = {}
    for name, family in FAMILIES:
        try:
            found, changes = family(snapshot, profile, previous)
        except Exception as exc:  # a bug in a check must never drain a node
            found, changes = (
                [
                    result.unknown(
                        f"{name}.internal",
                        "node",
                        f"internal error in the {name} checks: {type(exc).__name__}: {exc}",
                    )
                ],
                {},
            )
        results += found
        updates.update(changes)
    return result.make_verdict(results), updates


def escalate_unknowns(verdict: result.Verdict, state: dict, after: int) -> result.Verdict:
    """The periodic run's memory of unknowns: a finding unknown in `after` runs in a row (a sysfs read that
    keeps hanging, a counter stuck saturated) becomes degraded, so the node is kept out of multi-node jobs
    instead of being trusted forever on what nobody can see; never fail. Updates state["unknown_runs"]
    (finding -> runs in a row); a finding that reads again drops out, and so does its mark."""
    before = state.get("unknown_runs")
    before = before if isinstance(before, dict) else {}
    runs: dict = {}
    results = []
    for r in verdict.results:
        if r.status == result.UNKNOWN:
            key = f"{r.check} {r.subject}"
            count = before.get(key)
            runs[key] = count = (count if type(count) is int and 0 < count < 1 << 30 else 0) + 1
            if after and count >= after:
                r = result.degraded(
                    r.check,
                    r.subject,
                    f"{r.message} (unknown in {count} runs in a row)",
                    f"{r.subject} unknown for {count} runs: {r.message}",
                )
        results.append(r)
    state["unknown_runs"] = runs
    return result.make_verdict(results)


def merge_state(state: dict, updates: dict, *, rebaseline: bool) -> None:
    """Fold a judgement's updates into the node state. Counter baselines move only when `rebaseline` (the
    periodic run: thresholds are per run); a hook only adds baselines for ports that had none."""
    new = updates.get("baselines")
    if isinstance(new, dict):
        old = state.get("baselines")
        old = old if isinstance(old, dict) else {}
        if rebaseline:
            old.update(new)
        else:
            for port, values in new.items():
                old.setdefault(port, values)
        state["baselines"] = old
    for key in ("xid_seq", "xid_sticky", "boot_id", "gpu_pci", "incidents", "incident_counts", "ladder"):
        if key in updates:
            state[key] = updates[key]
