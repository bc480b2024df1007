"""NVIDIA Xid events: the one table of what each Xid means and how stune judges it, and the Xid check.

The kernel driver logs `NVRM: Xid (PCI:0000:47:00): 79, ...` when a GPU or its driver hits an error. Many
Xids are the application's fault (a bad pointer is Xid 31) and say nothing about the node; some mean the
hardware needs a reset or a technician. Severities follow NVIDIA's Xid catalogue and DCGM's health policy:

- fail:     the GPU needs a reset or a reboot (or is broken). Sticky: the node stays failed until it reboots
            (the kernel log starts over) or an admin runs `stune-health clear --xid` after a GPU reset.
- degraded: a warning sign with a lasting condition judged elsewhere (row remaps, ECC counts); reported for
            the evaluation that first sees it.
- info:     usually the application's own error; listed, never held against the node.

An Xid not in the table is reported as info with "not in stune's Xid table" so a new driver's codes show
up without draining anything.
"""

from __future__ import annotations

from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

FAIL, DEGRADED, INFO = "fail", "degraded", "info"

# xid: (severity, meaning)
XIDS = {
    13: (INFO, "graphics engine exception (usually an application error)"),
    31: (INFO, "GPU memory page fault (usually an application error)"),
    32: (INFO, "invalid or corrupted push buffer stream"),
    38: (FAIL, "driver firmware error"),
    43: (INFO, "GPU stopped processing (usually an application error)"),
    45: (INFO, "preemptive cleanup after an earlier error (usually the application was killed)"),
    48: (FAIL, "double-bit ECC error"),
    61: (FAIL, "internal micro-controller breakpoint/warning: reset the GPU"),
    62: (FAIL, "internal micro-controller halt: reset the GPU"),
    63: (DEGRADED, "ECC page retirement or row remapping recorded: pending until the GPU is reset"),
    64: (FAIL, "ECC page retirement or row remapping failed"),
    68: (INFO, "video decoder (NVDEC) exception"),
    69: (INFO, "graphics engine class error"),
    74: (FAIL, "NVLink error"),
    79: (FAIL, "GPU has fallen off the bus"),
    92: (DEGRADED, "high single-bit ECC error rate"),
    94: (DEGRADED, "contained ECC error: the application was stopped, a row remap is pending"),
    95: (FAIL, "uncontained ECC error: reset the GPU"),
    109: (INFO, "context switch timeout (usually an application error)"),
    119: (FAIL, "GSP RPC timeout"),
    120: (FAIL, "GSP error"),
    121: (FAIL, "C2C link error"),
    140: (FAIL, "unrecovered ECC error"),
    143: (FAIL, "GPU initialization failure"),
}


def classify(xid: int) -> tuple[str, str]:
    return XIDS.get(xid, (INFO, "not in stune's Xid table"))


def _events(snapshot) -> list | None:
    kernel = snapshot.get("kernel") if isinstance(snapshot, dict) else None
    if not isinstance(kernel, dict):
        return None
    if kernel.get("answered") is not True:
        return None
    events = kernel.get("events")
    xids = events.get("xid") if isinstance(events, dict) else None
    return xids if isinstance(xids, list) else None


def _valid(ev) -> bool:
    return (
        isinstance(ev, dict)
        and type(ev.get("seq")) is int
        and type(ev.get("xid")) is int
        and isinstance(ev.get("pci", ""), str)
    )


def boot_id(snapshot) -> str | None:
    events = snapshot["kernel"].get("events") if isinstance(snapshot.get("kernel"), dict) else None
    value = events.get("boot_id") if isinstance(events, dict) else None
    return value if isinstance(value, str) and value else None


def new_events(snapshot, last_seq, last_boot) -> tuple[list, int | None, bool]:
    """(events after last_seq, the highest seq seen, whether the node rebooted since).

    A reboot resets the GPUs and restarts the kernel log's sequence numbers: it is a new boot id, or (when
    the boot id cannot be read) every sequence number in the log being below the last one seen."""
    events = [ev for ev in _events(snapshot) or [] if _valid(ev)]
    boot = boot_id(snapshot)
    if boot is not None and isinstance(last_boot, str) and boot != last_boot:
        return events, max((ev["seq"] for ev in events), default=None), True
    if not events:
        return [], last_seq, False
    top = max(ev["seq"] for ev in events)
    if type(last_seq) is not int:
        return events, top, False
    if top < last_seq:
        return events, top, True
    return [ev for ev in events if ev["seq"] > last_seq], max(top, last_seq), False


def _gpu_name(snapshot, pci: str) -> str:
    """`gpu3 0000:47:00.0` for the Xid's `0000:47:00` when NVML listed that GPU, else the PCI address."""
    gpus = snapshot.get("gpus") if isinstance(snapshot, dict) else None
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    for dev in devices if isinstance(devices, list) else []:
        if not isinstance(dev, dict) or not isinstance(dev.get("pci_bus_id"), str):
            continue
        bus = dev["pci_bus_id"].lower()
        if bus.endswith(pci.lower()) or bus.rsplit(".", 1)[0].endswith(pci.lower()):
            return f"gpu{dev.get('index')} {pci}"
    return pci or "gpu"


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    """Xid events since the last evaluation. Returns (results, state updates: xid_seq, xid_sticky)."""
    sticky = [ev for ev in previous.get("xid_sticky") or [] if _valid(ev)]
    if (
        not isinstance(snapshot, dict) or "kernel" not in snapshot
    ):  # not captured (the prolog): held ones only
        return [_sticky_result(snapshot, ev) for ev in sticky], {}
    if _events(snapshot) is None:
        kernel = snapshot.get("kernel") if isinstance(snapshot, dict) else None
        why = (
            kernel.get("error")
            if isinstance(kernel, dict) and isinstance(kernel.get("error"), str)
            else "no kernel log in the snapshot"
        )
        results = [result.unknown("gpu.xid", "kernel log", f"could not read Xid events: {why}")]
        results += [_sticky_result(snapshot, ev) for ev in sticky]
        return results, {}
    fresh, seq, rebooted = new_events(snapshot, previous.get("xid_seq"), previous.get("boot_id"))
    if rebooted:
        sticky = []  # a reboot resets the GPUs: old Xids no longer hold
    results = []
    for ev in fresh:
        severity, meaning = classify(ev["xid"])
        if severity == FAIL and not any(s["seq"] == ev["seq"] for s in sticky):
            sticky.append(
                {
                    "seq": ev["seq"],
                    "xid": ev["xid"],
                    "pci": ev.get("pci", ""),
                    "text": str(ev.get("text", ""))[:200],
                }
            )
        elif severity == DEGRADED:
            where = _gpu_name(snapshot, ev.get("pci", ""))
            results.append(
                result.degraded(
                    "gpu.xid",
                    where,
                    f"Xid {ev['xid']} ({meaning}) at kernel log seq {ev['seq']}; expected no hardware Xid",
                    f"{where.split()[0]} Xid {ev['xid']}",
                )
            )
        else:
            results.append(
                result.ok(
                    "gpu.xid",
                    _gpu_name(snapshot, ev.get("pci", "")),
                    f"Xid {ev['xid']} ({meaning}): not held against the node",
                )
            )
    results += [_sticky_result(snapshot, ev) for ev in sticky]
    if not results:
        results.append(result.ok("gpu.xid", "kernel log", "no new Xid events"))
    updates: dict[str, object] = {"xid_sticky": sticky, "xid_seq": seq}
    if boot_id(snapshot) is not None:
        updates["boot_id"] = boot_id(snapshot)
    return results, updates


def _sticky_result(snapshot, ev) -> result.Result:
    _, meaning = classify(ev["xid"])
    where = _gpu_name(snapshot, ev.get("pci", ""))
    return result.fail(
        "gpu.xid",
        where,
        f"Xid {ev['xid']} ({meaning}) at kernel log seq {ev['seq']}; held until "
        f"reboot or `stune-health clear --xid`",
        f"{where.split()[0]} Xid {ev['xid']}",
    )
