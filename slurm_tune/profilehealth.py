"""The profile keys of the incident engine, the hung-read escalation and the remediation ladder (issue 25):
`health.xid`, `health.hang_degrade_after`/`hang_drain_after` and the `remediation` section. Apart from
profilecheck.py, which registers them, to keep that module small; the profile cache is keyed by this file
too (profilestore._VALIDATOR_PY). docs/health.md, "Xid incidents", "Hung reads" and "Remediation".
"""

from __future__ import annotations

from .schema import Bool, Duration, Int, List, Map, Nullable, Section, Str, Where

XID_RULE = Section(
    {
        "action": Nullable(Str(choices=("count", "degrade", "drain")), doc="what one event does"),
        "burst": Nullable(Int(min=0, max=1_000_000), doc="events within health.xid.burst_window; 0 never"),
        "remedy": Nullable(Str(choices=("reset", "reboot", "repair")), doc="the ladder's first step"),
    }
)
XID = Section(
    {
        "burst_window": Duration(3600, doc="a code's `burst` events within this escalate one step"),
        "hold": Duration(86400, doc="a degrade-level Xid keeps the node degraded this long"),
        "recur_window": Duration(7 * 86400, doc="an Xid again this soon after a reset or reboot escalates"),
        "codes": Map(XID_RULE, doc="rules per Xid code, over stune's table (`stune-health xids`)"),
    }
)
HANG_KEYS = {
    "hang_degrade_after": Int(
        2,
        min=1,
        max=1000,
        doc="periodic runs in a row with a probe past its deadline after which the node is degraded (at "
        "once when the stuck reader is in D state)",
    ),
    "hang_drain_after": Int(
        3, min=0, max=1000, doc="... after which it is drained, `stune: <read> hung for N runs`; 0 never"
    ),
}
REMEDIATION = Section(
    {
        "enabled": Bool(False, doc="opt in: a held Xid gets a GPU reset, a reboot, a drain for repair"),
        "reset": Bool(True, doc="the GPU reset step (when the node is drained and idle)"),
        "reboot": Bool(True, doc="the `scontrol reboot ASAP nextstate=RESUME` step"),
        "reset_command": List(
            Str(), default=("nvidia-smi", "--gpu-reset", "-i", "{pci}"), doc="{pci}: the GPU's bus id"
        ),
        "reset_timeout": Duration(120, doc="the reset command's deadline"),
        "reboot_timeout": Duration(1800, doc="a requested reboot not done by then: drain for repair"),
        "forget_after": Duration(7 * 86400, doc="a ladder with nothing held this long starts over"),
    }
)


def check(data: dict, where: Where) -> None:
    """The cross-checks of these keys (profilecheck._cross_checks)."""
    from .health.xid import APP_CODES

    for code, rule in data["health"]["xid"]["codes"].items():
        key = f"health.xid.codes.{code}"
        if not (code.isdigit() and 0 < int(code) < 100_000):
            raise where.error(key, f"{code!r} is not an Xid code (a number, e.g. 79)")
        if int(code) in APP_CODES and rule.get("action") == "drain":
            raise where.error(
                f"{key}.action", f"Xid {code} is the application's: count or degrade, not drain"
            )
    remediation = data["remediation"]
    if remediation["enabled"] and remediation["reset"] and not remediation["reset_command"]:
        raise where.error("remediation.reset_command", "empty: give one, or set remediation.reset: false")
