"""`stune-health incidents` (this node's Xid incidents, the remediation ladder and hung probes, as text or
JSON) and `stune-health xids` (the Xid rules in force). Apart from cli/health.py: neither is on a hook's path.
"""

from __future__ import annotations

import time

from ..durations import compact
from ..errors import EXIT_OK

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

DEFAULT_HOLD = 86400  # health.xid.hold's default, when no profile can be read


def _profile(partition: str | None) -> Profile | None:
    from ..errors import ConfigError
    from ..profilestore import load_profile

    if not partition:
        return None
    try:
        return load_profile(partition)
    except ConfigError:
        return None


def xids(options: dict) -> int:
    """The Xid table in force: stune's, or with -p P that partition's profile over it."""
    from ..health.xid import policy
    from ..output import table

    profile = _profile(options.get("partition"))
    if options.get("partition") and profile is None:
        from ..profilestore import load_profile

        load_profile(options["partition"])  # raises the ConfigError that says why
    rows = []
    for code, rule in sorted(policy(profile).items()):
        burst = f"{rule.burst}/{compact(profile.health.xid.burst_window)}" if rule.burst and profile else ""
        burst = burst or (str(rule.burst) if rule.burst else "-")
        note = " [application]" if rule.app else ""
        note += " [profile]" if rule.source == "profile" else ""
        rows.append((f"{code:4d}", rule.action, burst, "-" if rule.app else rule.remedy, rule.meaning + note))
    print(table(rows, (" XID", "ACTION", "BURST", "REMEDY", "MEANING")), end="")
    return EXIT_OK


def report(state: dict, hold: float, now: float) -> dict:
    """The JSON form: every incident kept, events per code, what is held, the ladder and the hung probes."""
    from ..health import incidents
    from ..health.outputs import incident_summary

    return {
        "node": state.get("node", ""),
        "partition": state.get("partition", ""),
        "incidents": incidents.history(state),
        **incident_summary(state, hold, now),
        "ladder": state.get("ladder") if isinstance(state.get("ladder"), dict) else {},
        "hangs": state.get("hangs") if isinstance(state.get("hangs"), dict) else {},
    }


def _held(inc: dict, hold: float, now: float) -> str:
    released = inc.get("released")
    if isinstance(released, dict):
        return f"released ({released.get('by')} {_stamp(released.get('at'))})"
    if inc["level"] == "drain":
        return "held"
    if inc["level"] == "degrade":
        return "held" if inc["at"] >= now - hold else "expired"
    return "-"


def _stamp(at) -> str:
    from ..health.incidents import stamp

    return stamp(at) if type(at) in (int, float) else "?"


def incidents(options: dict) -> int:
    from ..health import node
    from ..health.state import read
    from ..output import print_json, table

    cfg = node.settings(options)
    state, problem = read(cfg.state_dir)
    if problem:
        import sys

        print(f"stune-health: {problem}", file=sys.stderr)
    profile = _profile(options.get("partition") or cfg.partition or state.get("partition"))
    hold = profile.health.xid.hold if profile is not None else DEFAULT_HOLD
    now = time.time()
    doc = report(state, hold, now)
    if options.get("json"):
        print_json(doc)
        return EXIT_OK
    held = sum(doc["held"].values())
    print(
        f"{doc['node'] or cfg.node} ({doc['partition'] or '?'}): {len(doc['incidents'])} incidents kept, {held} Xid events held"
    )
    rows = [
        (
            _stamp(i["at"]),
            i["xid"],
            i["gpu"] or i["pci"],
            i["count"],
            i["level"],
            _held(i, hold, now),
            i["why"] or i["text"][:60],
        )
        for i in doc["incidents"]
    ]
    if rows:
        print(table(rows, ("WHEN", "XID", "GPU", "EVENTS", "LEVEL", "HELD", "WHY / LINE")), end="")
    if doc["by_code"]:
        counts = ", ".join(
            f"Xid {k}: {v}" for k, v in sorted(doc["by_code"].items(), key=lambda kv: int(kv[0]))
        )
        print(f"events per code since the state began: {counts}")
    ladder = doc["ladder"]
    steps = ladder.get("steps") if isinstance(ladder.get("steps"), list) else []
    if steps or ladder.get("repair"):
        done = ", ".join(
            f"{s.get('step')} {_stamp(s.get('at'))} {'ok' if s.get('ok') else 'failed'}"
            + (f" ({s['detail']})" if s.get("detail") else "")
            for s in steps
            if isinstance(s, dict)
        )
        print(f"remediation: {done or 'no step taken'}")
        if isinstance(ladder.get("repair"), dict):
            print(
                f"  drained for repair {_stamp(ladder['repair'].get('at'))}: {ladder['repair'].get('reason')}"
            )
    for probe, hang in sorted(doc["hangs"].items()):
        if isinstance(hang, dict):
            where = f" ({hang['stalled_at']})" if hang.get("stalled_at") else ""
            state_d = ", reader in D state" if hang.get("dstate") else ""
            print(
                f"hung probe: {probe}{where} past its deadline in {hang.get('runs')} runs in a row{state_d}"
            )
    return EXIT_OK
