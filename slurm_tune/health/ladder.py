"""The remediation ladder: what the periodic run does about a held Xid, when the partition opts in
(`remediation.enabled`). Each step once, in order, each only after the one before did not clear the Xid:

1. reset the GPUs with held Xids (hw/gpureset.py, behind `remediation.reset_timeout`), only while the node is
   under stune's own drain and idle: the next run judges the GPU again and resumes the node if it is healthy;
2. `scontrol reboot ASAP nextstate=RESUME reason="stune: reboot: gpu2 Xid 48"` through the Slurm adapter:
   Slurm runs its RebootProgram once the node is idle and returns it to service after the boot; until the
   boot (a new boot id) or `remediation.reboot_timeout`, the run leaves the node's Slurm state alone;
3. drain for repair, with the incident history in the reason: decided by the incident engine
   (health/incidents.py), applied like any failure, held until `stune-health clear --xid`.
A rule's remedy may start the ladder later (`reboot` for Xid 79: a GPU off the bus cannot be reset;
`repair` for Xid 143); the partition can turn steps off (`remediation.reset`, `remediation.reboot`).

Through the circuit breaker: a step is taken only on a node that is under stune's own drain now (apply.py
drained it, and only the breaker's share of a partition is ever drained), never on an admin's drain or one
the breaker held back, and never while the node also fails other checks (a GPU reset does not fix a port).
The step is recorded before it is taken (a concurrent run cannot take it twice) and the state lock is not
held while a reset runs (the hooks wait on that lock).
"""

from __future__ import annotations

from ..errors import SlurmError
from . import apply, incidents, result, state
from .xid import REBOOT, RESET

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


def due(held: dict, profile: Profile, now: float) -> str | None:
    """The ladder's next step for this node's state (incidents.next_step), or None."""
    sticky = [i for i in incidents.history(held) if i["level"] == "drain" and i["released"] is None]
    ladder, boot = held.get("ladder"), held.get("boot_id")
    ladder = ladder if isinstance(ladder, dict) else {}
    boot = boot if isinstance(boot, str) else None
    return incidents.next_step(ladder, sticky, profile, boot, now)


def waiting(held: dict, profile: Profile, now: float) -> bool:
    """Whether a reboot stune asked for is still to come: the run then leaves Slurm's node state alone."""
    return due(held, profile, now) == incidents.WAIT


def act(cfg, slurm, profile: Profile, verdict: result.Verdict, now: float, reset=None) -> dict | None:
    """Take the ladder's next step if it is due and allowed; returns {"step", "taken", "note"} or None.
    `reset`: hw.gpureset.reset by default (tests pass a stand-in)."""
    if not profile.remediation.enabled:
        return None
    with state.Locked(cfg.state_dir) as st:
        step = due(st.state, profile, now)
        held = dict(st.state)
    if step not in (RESET, REBOOT):
        return None
    why_not = _blocked(cfg, slurm, held, verdict, step)
    if why_not:
        return {"step": step, "taken": False, "note": f"remediation: the {step} waits: {why_not}"}
    sticky = [i for i in incidents.history(held) if i["level"] == "drain" and i["released"] is None]
    pcis = sorted({i["pci"] for i in sticky})
    with state.Locked(cfg.state_dir) as st:
        if due(st.state, profile, now) != step:  # another run took it meanwhile
            return None
        record = {"step": step, "at": round(now, 3), "ok": None, "detail": "", "pcis": pcis}
        if step == REBOOT:
            record["boot_id"] = st.state.get("boot_id")
        ladder = _ladder_of(st.state)
        st.state["ladder"] = {**ladder, "steps": [*incidents.steps(ladder), record]}
        st.save()
    if step == RESET:
        if reset is None:
            from ..hw.gpureset import reset
        ok, detail = reset(profile.remediation.reset_command, pcis, profile.remediation.reset_timeout)
    else:
        reason = f"stune: reboot: {verdict.reason}"[:200]
        try:
            slurm.reboot_node(cfg.node, reason, asap=True, next_state="RESUME")
            ok, detail = True, f"scontrol reboot ASAP nextstate=RESUME reason={reason!r}"
        except SlurmError as exc:
            ok, detail = False, str(exc)[:200]
    with state.Locked(cfg.state_dir) as st:
        ladder = _ladder_of(st.state)
        steps = incidents.steps(ladder)
        for s in steps:
            if s.get("step") == step and s.get("at") == record["at"]:
                s.update(ok=ok, detail=detail)
        st.state["ladder"] = {**ladder, "steps": steps}
        if step == RESET and ok:
            found = incidents.history(st.state)
            incidents.release(found, now, "reset", set(pcis))
            st.state["incidents"] = found
            st.state["xid_sticky"] = [i for i in found if i["level"] == "drain" and i["released"] is None]
        st.save()
    what = "GPU reset" if step == RESET else "reboot request"
    return {
        "step": step,
        "taken": True,
        "ok": ok,
        "note": f"remediation: {what} {'done' if ok else 'failed'}: {detail}",
    }


def _ladder_of(held: dict) -> dict:
    ladder = held.get("ladder")
    return ladder if isinstance(ladder, dict) else {}


def _blocked(cfg, slurm, held: dict, verdict: result.Verdict, step: str) -> str:
    """Why the step may not be taken now ('' when it may)."""
    others = [r for r in verdict.results if r.status == result.FAIL and r.check != "gpu.xid"]
    if others:
        return f"the node also fails {others[0].check} ({others[0].reason})"
    try:
        node = slurm.node(cfg.node)
    except SlurmError as exc:
        return f"Slurm did not answer: {exc}"
    kind = apply.drain_kind(node, held)
    if kind != "ours":
        return {
            "none": "the node is not drained (the circuit breaker may have held the drain back)",
            "admin": f"the node is under someone else's drain ({node.reason!r})",
        }.get(kind, f"the node is not under stune's own drain yet ({kind})")
    if step == RESET and (node.state != "idle" or "COMPLETING" in node.flags):
        return f"jobs still run on the node ({node.state})"
    return ""
