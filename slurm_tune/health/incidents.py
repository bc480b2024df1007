"""The incident engine: what one evaluation's new Xid events mean under the policy (health/xid.py), and the
node's memory of them. Pure: (snapshot, profile, previous state) -> (results, state updates).

An incident is what one evaluation saw of one Xid code on one GPU: `{at, xid, pci, gpu, count, seq, level,
remedy, why, text, released}`. Its level is the rule's action for the code (refined by the line itself,
xid.refine), escalated one step by
- a burst: the code's events within `health.xid.burst_window` (this evaluation's included) reaching the
  rule's `burst`;
- a recurrence: the code again on the same GPU within `health.xid.recur_window` after an incident of it was
  released by a GPU reset, a reboot or `stune-health clear --xid`.
An application's code (xid.APP_CODES) never goes past degrade. A drain-level incident fails the node and is
held until it is released; a degrade-level one keeps it degraded for `health.xid.hold`; a count-level one
is listed, counted, and held against nothing.

With `remediation.enabled`, a held drain-level incident is what the ladder (health/ladder.py) acts on, one
step each, once: a GPU reset, a reboot, and when those are spent (or the rule's remedy is `repair`) a drain
for repair decided here, `stune: repair: gpu2 Xid 48 x3 after reset 05-12 12:05, reboot 05-12 12:40`, held
until `stune-health clear --xid`.

State (health/state.py validates its numbers on read): `incidents` (the last INCIDENTS_KEEP, held ones
never dropped), `incident_counts` (events per code since the state began: the Prometheus counter),
`xid_sticky` (the held drain-level incidents: what the prolog fails on without reading the log), `ladder`.
"""

from __future__ import annotations

import time

from ..durations import compact
from . import result, xid
from .xid import COUNT, DEGRADE, DRAIN, LEVELS, REBOOT, REMEDIES, REPAIR, RESET

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

INCIDENTS_KEEP = 200
TEXT_KEEP = 160
COUNT_MAX = 1 << 40
RELEASES = ("reset", "reboot", "clear")
WAIT = "wait"
STEP_TEXT = {
    RESET: "remediation: a GPU reset when the node is idle",
    REBOOT: "remediation: a reboot (scontrol reboot ASAP)",
    WAIT: "remediation: waiting for the reboot stune asked for",
}


def now_of(snapshot) -> float:
    at = snapshot.get("captured_at") if isinstance(snapshot, dict) else None
    return (
        float(at)
        if isinstance(at, (int, float)) and not isinstance(at, bool) and 0 < at < 1e10
        else time.time()
    )


def stamp(at: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(at))


def valid_incident(inc) -> bool:
    if not isinstance(inc, dict):
        return False
    released = inc.get("released")
    return (
        type(inc.get("at")) in (int, float)
        and xid.valid_event(inc)
        and type(inc.get("count")) is int
        and 0 < inc["count"] <= COUNT_MAX
        and inc.get("level") in LEVELS
        and inc.get("remedy") in REMEDIES
        and (
            released is None
            or (
                isinstance(released, dict)
                and type(released.get("at")) in (int, float)
                and released.get("by") in RELEASES
            )
        )
    )


def history(state: dict) -> list:
    found = state.get("incidents")
    return [dict(i) for i in found if valid_incident(i)] if isinstance(found, list) else []


def held(incidents: list, level: str, now: float, hold: float) -> list:
    return [
        i
        for i in incidents
        if i["level"] == level and i["released"] is None and (level == DRAIN or i["at"] >= now - hold)
    ]


def release(incidents: list, now: float, by: str, pcis=None) -> int:
    """Release the held incidents (of the GPUs `pcis`, or all); returns how many."""
    n = 0
    for i in incidents:
        if i["level"] != COUNT and i["released"] is None and (pcis is None or i["pci"] in pcis):
            i["released"] = {"at": round(now, 3), "by": by}
            n += 1
    return n


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    """The xid family over a snapshot with a kernel log (judge.py): unknown when the log could not be read
    (what is held stays held), else the new events judged by the policy."""
    kernel = snapshot.get("kernel") if isinstance(snapshot, dict) else None
    events = kernel.get("events") if isinstance(kernel, dict) and kernel.get("answered") is True else None
    if not isinstance(events, dict) or not isinstance(events.get("xid"), list):
        why = kernel.get("error") if isinstance(kernel, dict) else None
        why = why if isinstance(why, str) else "no kernel log in the snapshot"
        unread = result.unknown("gpu.xid", "kernel log", f"could not read Xid events: {why}")
        return [unread, *xid.held_check(snapshot, previous)[0]], {}
    return evaluate(snapshot, profile, previous)


def evaluate(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    now = now_of(snapshot)
    table = xid.policy(profile)
    knobs = profile.health.xid
    fresh, seq, rebooted = xid.new_events(snapshot, previous.get("xid_seq"), previous.get("boot_id"))
    past = history(previous)
    past += _adopt(previous, past, now, table)
    if rebooted:
        release(past, now, "reboot")
    new = _incidents(fresh, snapshot, table, knobs, past, now)
    past += new
    counts = _counts(previous, new)
    sticky = held(past, DRAIN, now, knobs.hold)
    ladder = _ladder(previous, sticky, past, profile, xid.boot_id(snapshot), now)
    updates: dict = {
        "xid_seq": seq,
        "incidents": bounded(past),
        "incident_counts": counts,
        "xid_sticky": sticky,
        "ladder": ladder,
    }
    if xid.boot_id(snapshot) is not None:
        updates["boot_id"] = xid.boot_id(snapshot)
    step = next_step(ladder, sticky, profile, xid.boot_id(snapshot), now) if sticky else None
    return _results(snapshot, table, new, sticky, held(past, DEGRADE, now, knobs.hold), ladder, step), updates


def _adopt(previous: dict, past: list, now: float, table) -> list:
    """Held Xids from a state written before incidents were recorded: held on as drain-level incidents."""
    known = {(i["seq"], i["xid"]) for i in past}
    out = []
    for ev in previous.get("xid_sticky") or []:
        if xid.valid_event(ev) and "level" not in ev and (ev["seq"], ev["xid"]) not in known:
            rule = xid.rule_for(table, ev["xid"])
            out.append(
                _incident(ev["xid"], ev.get("pci", ""), ev.get("pci", ""), 1, ev["seq"], DRAIN, rule, now)
            )
            out[-1]["text"] = str(ev.get("text", ""))[:TEXT_KEEP]
    return out


def _incident(code, pci, gpu, count, seq, level, rule, now, remedy=None, why="", text="") -> dict:
    return {
        "at": round(now, 3),
        "xid": code,
        "pci": pci,
        "gpu": gpu,
        "count": min(count, COUNT_MAX),
        "seq": seq,
        "level": level,
        "remedy": remedy or rule.remedy,
        "why": why,
        "text": text[:TEXT_KEEP],
        "released": None,
    }


def _incidents(fresh: list, snapshot, table, knobs, past: list, now: float) -> list:
    """One incident per (Xid, GPU) of this evaluation's events, at the worst level any of them gives."""
    groups: dict = {}
    for ev in fresh:
        key = (ev["xid"], ev.get("pci", ""))
        rule = xid.rule_for(table, ev["xid"])
        text = str(ev.get("text", ""))
        action, remedy = xid.refine(ev["xid"], rule, text)
        group = groups.get(key)
        if group is None:
            groups[key] = group = {
                "count": 0,
                "seq": ev["seq"],
                "action": action,
                "remedy": remedy,
                "text": text,
            }
        group["count"] += 1
        group["seq"] = max(group["seq"], ev["seq"])
        if LEVELS.index(action) > LEVELS.index(group["action"]):
            group.update(action=action, text=text)
        if REMEDIES.index(remedy) > REMEDIES.index(group["remedy"]):
            group["remedy"] = remedy
    out = []
    for (code, pci), group in groups.items():
        rule = xid.rule_for(table, code)
        level, why = group["action"], []
        if rule.burst:
            recent = group["count"] + sum(
                i["count"] for i in past if i["xid"] == code and i["at"] >= now - knobs.burst_window
            )
            if recent >= rule.burst and xid.escalate(level, rule.app) != level:
                level = xid.escalate(level, rule.app)
                why.append(f"{recent} within {compact(knobs.burst_window)}: a burst")
        again = [
            i
            for i in past
            if i["xid"] == code
            and i["pci"] == pci
            and i["released"] is not None
            and i["released"]["at"] >= now - knobs.recur_window
        ]
        if again:
            last = max(again, key=lambda i: i["released"]["at"])["released"]
            level = xid.escalate(level, rule.app) if level != DRAIN else level
            why.append(f"again after the {_by(last['by'])} at {stamp(last['at'])}")
        gpu = xid.gpu_name(snapshot, pci)
        out.append(
            _incident(
                code,
                pci,
                gpu,
                group["count"],
                group["seq"],
                level,
                rule,
                now,
                group["remedy"],
                "; ".join(why),
                group["text"],
            )
        )
    return out


def _by(how: str) -> str:
    return {"reset": "GPU reset", "reboot": "reboot", "clear": "`clear --xid`"}.get(how, how)


def _counts(previous: dict, new: list) -> dict:
    counts = previous.get("incident_counts")
    counts = {k: v for k, v in counts.items() if type(v) is int} if isinstance(counts, dict) else {}
    for inc in new:
        key = str(inc["xid"])
        counts[key] = min(counts.get(key, 0) + inc["count"], COUNT_MAX)
    return counts


def bounded(incidents: list) -> list:
    """At most INCIDENTS_KEEP, oldest first; over it, the oldest released or count-level incident of the
    code with the most goes first, so a storm of one code cannot push out the one GPU that fell off."""
    out = sorted(incidents, key=lambda i: i["at"])
    while len(out) > INCIDENTS_KEEP:
        droppable = [i for i in out if i["level"] == COUNT or i["released"] is not None] or out
        per_code: dict = {}
        for i in droppable:
            per_code[i["xid"]] = per_code.get(i["xid"], 0) + 1
        most = max(per_code, key=lambda c: per_code[c])
        out.remove(next(i for i in droppable if i["xid"] == most))
    return out


# ---- the remediation ladder's decisions (health/ladder.py takes the steps) --------------------------------


def steps(ladder) -> list:
    found = ladder.get("steps") if isinstance(ladder, dict) else None
    return [
        s
        for s in found or []
        if isinstance(s, dict) and s.get("step") in (RESET, REBOOT) and type(s.get("at")) in (int, float)
    ]


def next_step(ladder: dict, sticky: list, profile: Profile, boot: str | None, now: float) -> str | None:
    """The ladder's next step for the held drain-level incidents: reset, reboot, wait (for a reboot asked
    for), repair; None when the partition has not opted in or nothing is held."""
    remediation = profile.remediation
    if not remediation.enabled or not sticky:
        return None
    if isinstance(ladder.get("repair"), dict):
        return REPAIR
    done = steps(ladder)
    names = {s["step"] for s in done}
    remedy = max((i["remedy"] for i in sticky), key=REMEDIES.index)
    if remedy == RESET and remediation.reset and RESET not in names:
        return RESET
    if remedy in (RESET, REBOOT) and remediation.reboot and REBOOT not in names:
        return REBOOT
    reboot = next((s for s in reversed(done) if s["step"] == REBOOT), None)
    if (
        reboot is not None
        and reboot.get("ok") is True
        and (boot is None or reboot.get("boot_id") == boot)
        and now < reboot["at"] + remediation.reboot_timeout
    ):
        return WAIT
    return REPAIR


def _ladder(previous: dict, sticky: list, past: list, profile: Profile, boot, now: float) -> dict:
    ladder = previous.get("ladder")
    ladder = dict(ladder) if isinstance(ladder, dict) else {}
    if isinstance(ladder.get("repair"), dict):
        return ladder
    if sticky and next_step(ladder, sticky, profile, boot, now) == REPAIR:
        ladder["repair"] = repair(sticky, past, steps(ladder), now)
        return ladder
    done = steps(ladder)
    if not sticky and done and done[-1]["at"] < now - profile.remediation.forget_after:
        return {}
    return ladder


def repair(sticky: list, past: list, done: list, now: float) -> dict:
    """The drain for repair: its reason (the incident history, short) and message (in full)."""
    last = max(sticky, key=lambda i: i["at"])
    code, pci = last["xid"], last["pci"]
    mine = [i for i in past if i["xid"] == code and i["pci"] == pci]
    total = sum(i["count"] for i in mine)
    tried = ", ".join(f"{s['step']} {stamp(s['at'])}" + ("" if s.get("ok") else " failed") for s in done)
    gpu = str(last["gpu"]).split()[0] or pci
    reason = f"repair: {gpu} Xid {code} x{total}" + (f" after {tried}" if tried else "")
    seen = ", ".join(f"{stamp(i['at'])} x{i['count']}" for i in mine[-6:])
    message = (
        f"Xid {code} ({xid.rule_for(xid.XIDS, code).meaning}) on {last['gpu']}: {seen}; "
        + (f"remediation tried: {tried}; " if tried else "no automatic fix; ")
        + "drained for repair, held until `stune-health clear --xid`"
    )
    return {"at": round(now, 3), "xid": code, "pci": pci, "reason": reason[:200], "message": message}


# ---- results -----------------------------------------------------------------------------------------------


def _by_gpu(incidents: list) -> dict:
    out: dict = {}
    for i in incidents:
        out.setdefault((i["xid"], i["pci"]), []).append(i)
    return out


def _results(snapshot, table, new, sticky, degraded, ladder, step) -> list:
    results = []
    if isinstance(ladder.get("repair"), dict):
        repair_ = ladder["repair"]
        results.append(result.fail("gpu.xid", "node", repair_["message"], repair_["reason"]))
    else:
        for (code, pci), found in _by_gpu(sticky).items():
            where = xid.gpu_name(snapshot, pci)
            why = "; ".join(i["why"] for i in found if i["why"])
            results.append(
                result.fail(
                    "gpu.xid",
                    where,
                    f"Xid {code} ({xid.rule_for(table, code).meaning}) x{sum(i['count'] for i in found)} since "
                    f"{stamp(found[0]['at'])}, last at kernel log seq {found[-1]['seq']}"
                    + (f" ({why})" if why else "")
                    + "; held until reboot, a GPU reset or `stune-health clear --xid`"
                    + (f"; {STEP_TEXT[step]}" if step in STEP_TEXT else ""),
                    f"{where.split()[0]} Xid {code}",
                )
            )
    for (code, pci), found in _by_gpu(degraded).items():
        where = xid.gpu_name(snapshot, pci)
        why = "; ".join(i["why"] for i in found if i["why"])
        results.append(
            result.degraded(
                "gpu.xid",
                where,
                f"Xid {code} ({xid.rule_for(table, code).meaning}) x{sum(i['count'] for i in found)}, last at "
                f"{stamp(found[-1]['at'])}" + (f" ({why})" if why else "") + "; degraded for "
                "health.xid.hold after the last one; expected no hardware Xid",
                f"{where.split()[0]} Xid {code}",
            )
        )
    for inc in new:
        if inc["level"] == COUNT:
            rule = xid.rule_for(table, inc["xid"])
            results.append(
                result.ok(
                    "gpu.xid",
                    inc["gpu"],
                    f"Xid {inc['xid']} ({rule.meaning}) x{inc['count']}: counted, not held against the node"
                    + (f" ({inc['why']})" if inc["why"] else ""),
                )
            )
    if not results:
        results.append(result.ok("gpu.xid", "kernel log", "no new Xid events"))
    return results


def clear(state: dict, now: float | None = None) -> None:
    """`stune-health clear --xid`: release every held incident (a later one counts as a recurrence) and end
    the ladder, a drain for repair included."""
    now = time.time() if now is None else now
    found = history(state)
    release(found, now, "clear")
    state["incidents"] = found
    state["xid_sticky"] = []
    state["ladder"] = {}
