"""A hung driver is a broken node: a hardware probe that hits its deadline run after run escalates.

One probe past its deadline is unknown (hw/deadline.py: the read is abandoned, the hook goes on): it may be
a slow node. The periodic run remembers, per probe, how many runs in a row it hung (state `hangs`); at
`health.hang_degrade_after` runs in a row (default 2) the node is degraded, `<read> hung`, and at once when
the stuck reader is in D state (uninterruptible sleep: the driver holds it, it will not come back); at
`health.hang_drain_after` (default 3; 0 never) it fails, and the periodic run drains it,
`stune: sysfs read of mlx5_2 hung for 3 runs`. The first run that reads again forgets it. NHC's watchdog does
the same for a hung check. Only the periodic run counts (its runs are what "in a row" means); the hooks
judge what they read, as before. The reasons stay the same from run to run (the threshold, not the count),
so a node that stays hung makes no Slurm call per run.
"""

from __future__ import annotations

from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profiletypes import Health

# snapshot section -> (probe, what is read)
SECTIONS = {
    "ib": ("sysfs-ib", "sysfs read"),
    "net": ("sysfs-net", "sysfs read"),
    "pci_gpus": ("sysfs-pci", "sysfs read"),
    "kernel": ("kmsg", "kernel log read"),
    "gpus": ("nvml", "NVML read"),
    "accel": ("accel", "accelerator tool read"),  # npu-smi / hccn_tool / amdsmi (hw/ascend.py, hw/amd.py)
}


def hung(snapshot: dict) -> dict:
    """probe -> {"stalled_at", "reader"} for each section of the snapshot whose probe hit its deadline."""
    out = {}
    for section, (probe, _what) in SECTIONS.items():
        sec = snapshot.get(section) if isinstance(snapshot, dict) else None
        if isinstance(sec, dict) and sec.get("timeout") is True:
            stalled = sec.get("stalled_at")
            if section == "gpus" and type(stalled) is int:
                stalled = f"gpu{stalled}"
            reader = sec.get("reader")
            out[probe] = {
                "stalled_at": stalled if isinstance(stalled, str) else "",
                "reader": reader if isinstance(reader, str) and len(reader) == 1 else "",
            }
    return out


def _read_name(probe: str, stalled_at: str) -> str:
    what = next(w for p, w in SECTIONS.values() if p == probe)
    return f"{what} of {stalled_at}" if stalled_at else what


def escalate(
    verdict: result.Verdict, snapshot: dict, state: dict, health: Health, now: float
) -> result.Verdict:
    """The verdict with each hung probe's finding first (degraded or fail, see the module docstring);
    updates state["hangs"]."""
    before = state.get("hangs")
    before = before if isinstance(before, dict) else {}
    hangs: dict = {}
    found = []
    for probe, info in hung(snapshot).items():
        prev = before.get(probe)
        prev = prev if isinstance(prev, dict) else {}
        count, since, stalled = prev.get("runs"), prev.get("since"), prev.get("stalled_at")
        runs = (count if type(count) is int and 0 < count < 1 << 30 else 0) + 1
        since = since if runs > 1 and isinstance(since, (int, float)) else now
        stalled = (stalled if runs > 1 and isinstance(stalled, str) else "") or info["stalled_at"]
        dstate = info["reader"] == "D"
        hangs[probe] = {
            "runs": runs,
            "since": round(since, 3),
            "stalled_at": stalled,
            "reader": info["reader"],
            "dstate": dstate,
        }
        read = _read_name(probe, stalled)
        message = (
            f"the {probe} probe hit its deadline (health.probe_timeout_s) in {runs} periodic run(s) in a row"
            + (f", reading {info['stalled_at']}" if info["stalled_at"] else "")
            + ("; the stuck reader is in D state (uninterruptible: the driver holds it)" if dstate else "")
        )
        if health.hang_drain_after and runs >= health.hang_drain_after:
            found.append(
                result.fail(
                    "hw.hang",
                    probe,
                    f"{message}; expected it to answer (drained after {health.hang_drain_after})",
                    f"{read} hung for {health.hang_drain_after} runs",
                )
            )
        elif runs >= health.hang_degrade_after or dstate:
            found.append(
                result.degraded(
                    "hw.hang",
                    probe,
                    f"{message}; degraded"
                    + (
                        f", drained after {health.hang_drain_after} in a row"
                        if health.hang_drain_after
                        else ""
                    ),
                    f"{read} hung" + (" in D state" if dstate else ""),
                )
            )
    state["hangs"] = hangs
    return result.make_verdict(found + list(verdict.results)) if found else verdict
