"""The accel family: AMD Instinct and Huawei Ascend devices (issue 26), judged from the snapshot's `accel` section
(hw/accel.py's format, read by hw/amd.py through amdsmi or hw/ascend.py through npu-smi and hccn_tool) and from
the PCI bus's view of them (`pci_accel`, the prolog's only view), under the profile's `accel` thresholds
(slurm_tune/accelspec.py; docs/accelerators.md has the table per vendor).

- The backend answers: a tool or library that was asked and hung (the deadline), or that the driver made fail
  (npu-smi exiting non-zero with no device, amdsmi that cannot be opened) fails the node, like NVML not
  answering; what stune itself could not do (amdsmi or a tool not installed, not captured, a replay file
  without the section) is unknown.
- The device count against gpu.count (NPU chips on Ascend: /dev/davinciN; GPUs, or their partitions, on AMD),
  naming the missing minors; the model (gpu.model, a substring of the name).
- Per device (acceldevice.py): Ascend health, ECC/RAS, temperature, power, the PCIe link, AMD's XGMI links.
- Ascend's on-card RoCE ports (accelports.py, when accel.hccn.check): link, net_health, an IPv4 address.
- The bus: each device a full check listed (by address, kept in the node state as `gpu_pci`) still on the
  PCI bus, and at least one there before any full check.

Garbage anywhere is unknown, never fail: values count only in the types and words the backends write.
"""

from __future__ import annotations

from ..hw.sysfs import accel_match
from ..text import is_digits
from . import acceldevice, result
from .acceldevice import AMD, ASCEND, PREFIX, TOOL, bus_address, minor_of, shown

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

NOUN = {AMD: "GPU", ASCEND: "NPU"}
LABEL = {AMD: "AMD", ASCEND: "Ascend"}
# What the backends say when stune could not look (its install, its setup, no capture): unknown, not the node.
STUNE_SIDE = (
    "not installed",
    "not captured",
    "not found",
    "not executable",
    "not an absolute path",
    "cannot be imported",
    "cannot load",
    "could not run",
    "Permission denied",
    "NO_PERM",
)
ERROR_MAX = 300  # characters of a backend's error kept in a message


def vendor_of(snapshot: dict, profile: Profile) -> str | None:
    """The vendor judged: the profile's when it is amd or ascend; else the `accel` section's (a snapshot judged
    under an nvidia profile); None: nothing of this family to judge."""
    if profile.accelerator in (AMD, ASCEND):
        return profile.accelerator
    section = snapshot.get("accel")
    given = section.get("vendor") if isinstance(section, dict) else None
    return given if given in (AMD, ASCEND) else None


def check(snapshot, profile: Profile, previous: dict) -> tuple[list, dict]:
    if not profile.gpu.count or not isinstance(snapshot, dict):
        return [], {}
    vendor = vendor_of(snapshot, profile)
    if vendor is None:
        return [], {}
    results: list = []
    updates: dict = {}
    listed: list[str] = []
    if "accel" in snapshot:
        found, listed = judge_section(snapshot["accel"], vendor, profile)
        results += found
    if "pci_accel" in snapshot:
        found, on_bus = judge_bus(snapshot["pci_accel"], vendor, profile.gpu.count)
        results += found
        known = [a for a in listed if a in on_bus]
        if known:  # what the prolog checks by address: the devices the backend listed and the bus showed
            updates["gpu_pci"] = known
    if "accel" not in snapshot and "pci_accel" not in snapshot:
        results.append(
            result.unknown(
                "accel.backend",
                "node",
                f"the snapshot has no 'accel' section (taken without partition {profile.partition}'s profile?); "
                f"expected {profile.gpu.count} {LABEL[vendor]} {NOUN[vendor]}s",
            )
        )
    return results, updates


def backend_problem(section: dict) -> tuple[str, str]:
    """(fail or unknown, why) for a section whose backend did not answer."""
    error = section.get("error")
    error = " ".join(error.split())[:ERROR_MAX] if isinstance(error, str) and error.strip() else "no answer"
    stalled = section.get("stalled_at")
    if section.get("timeout") is True or "did not answer" in error or "still stuck" in error:
        at = (
            stalled[:80]
            if isinstance(stalled, str)
            else stalled
            if type(stalled) is int and 0 <= stalled < 1 << 16
            else None
        )
        where = f" (stalled at {at})" if at is not None and str(at) not in error else ""
        return result.FAIL, error + where
    if any(word in error for word in STUNE_SIDE):
        return result.UNKNOWN, error
    words = error.split()
    code = words[words.index("exited") + 1] if "exited" in words[:-1] else ""
    if (is_digits(code) and int(code) != 0) or "could not be opened" in error:
        return result.FAIL, error  # the driver made the tool fail: the node's devices, not stune
    return result.UNKNOWN, error  # anything else (e.g. a tool printing no row we can read) is not evidence


def judge_section(section, vendor: str, profile: Profile) -> tuple[list, list[str]]:
    """(results, the devices' bus addresses) of the `accel` section."""
    noun, tool, count = NOUN[vendor], TOOL[vendor], profile.gpu.count
    if not isinstance(section, dict) or type(section.get("answered")) is not bool:
        return [result.unknown("accel.backend", "node", "unreadable 'accel' section")], []
    given = section.get("vendor")
    if given != vendor:
        return [
            result.unknown(
                "accel.backend",
                "node",
                f"the 'accel' section is of vendor {shown(given)}; partition {profile.partition} expects {vendor} "
                "devices: not judged",
            )
        ], []
    if not section["answered"]:
        status, why = backend_problem(section)
        if status == result.FAIL:
            return [
                result.fail(
                    "accel.backend",
                    "node",
                    f"{tool} did not answer: {why}; expected {count} {noun}s to answer",
                    f"{tool} not answering",
                )
            ], []
        return [result.unknown("accel.backend", "node", f"{noun}s not judged: {why}")], []
    devices = section.get("devices")
    if not isinstance(devices, list):
        return [result.unknown("accel.backend", "node", "unreadable device list")], []
    out = [count_check(devices, vendor, count)]
    for pos, dev in enumerate(devices):
        out += acceldevice.check(dev, pos, vendor, profile)
    if vendor == ASCEND and profile.accel.hccn.check:
        from . import accelports

        out += accelports.check(section.get("ports"), devices, profile.accel.hccn)
    listed = [bus_address(d.get("bus_id")) for d in devices if isinstance(d, dict)]
    return out, list(dict.fromkeys(a for a in listed if a))


def count_check(devices: list, vendor: str, count: int) -> result.Result:
    """Every entry counts (a garbled one is its own unknown, never a missing device)."""
    n, noun, prefix = len(devices), NOUN[vendor], PREFIX[vendor]
    seen = f"{n} {noun}s answer {TOOL[vendor]}"
    if n < count:
        minors = {minor_of(d) for d in devices}
        missing = [f"{prefix}{m}" for m in range(count) if m not in minors]
        extra = f"; missing: {', '.join(missing)}" if missing and len(missing) <= count - n else ""
        return result.fail("accel.count", "node", f"{seen}; expected {count}{extra}", f"{n}/{count} {noun}s")
    if n > count:
        return result.degraded(
            "accel.count", "node", f"{seen}; the profile expects {count}", f"{n} {noun}s, expected {count}"
        )
    return result.ok("accel.count", "node", f"{seen}; expected {count}")


def judge_bus(section, vendor: str, count: int) -> tuple[list, set[str]]:
    """(results, the vendor's addresses seen) of the `pci_accel` section: the devices a full check listed
    (`known`) still there, else at least one of the vendor's on the bus. Chips per PCI function differ (a 310P
    card has two chips on one function, an MI300X in CPX mode eight partitions), so the count of functions is
    compared with what a full check saw, not with gpu.count."""
    if (
        not isinstance(section, dict)
        or section.get("answered") is not True
        or not isinstance(section.get("devices"), dict)
    ):
        why = section.get("error") if isinstance(section, dict) else None
        why = why[:ERROR_MAX] if isinstance(why, str) else "unreadable 'pci_accel' section"
        return [result.unknown("accel.pci", "node", f"cannot see the PCI bus: {why}")], set()
    known = section.get("known")
    known = [a for a in known if bus_address(a) == a] if isinstance(known, list) else []
    mine, gone, unreadable = [], [], []
    for address, dev in sorted((a, d) for a, d in section["devices"].items() if isinstance(a, str)):
        if isinstance(dev, dict) and dev.get("present") is False:
            gone.append(address)
            continue
        match = accel_match(vendor, dev.get) if isinstance(dev, dict) and dev.get("present") is True else None
        if match:
            mine.append(address)
        elif match is None:
            unreadable.append(address)  # (a readable other id is simply not one of these devices)
    noun = NOUN[vendor]
    seen = f"{len(mine)} {LABEL[vendor]} {noun}s on the PCI bus"
    expected = len(set(known)) if known else 1
    if gone:
        out = result.fail(
            "accel.pci", "node", f"{seen}; gone from the bus: {', '.join(gone)}", f"{gone[0]} gone from PCI"
        )
    elif len(mine) < expected and unreadable:
        out = result.unknown("accel.pci", "node", f"{seen}; unreadable ids of {', '.join(unreadable)}")
    elif len(mine) < expected:
        what = f"the {expected} a full check listed" if known else f"{count} (gpu.count)"
        total = expected if known else count
        out = result.fail(
            "accel.pci", "node", f"{seen}; expected {what}", f"{len(mine)}/{total} {noun}s on PCI"
        )
    else:
        basis = "as the last full check listed" if known else "(chips per PCI function vary by model)"
        out = result.ok("accel.pci", "node", f"{seen} {basis}")
    return [out], set(mine)
