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
  PCI bus with the vendor's id; before any full check, said (unknown) only when none of the vendor's is.

Garbage anywhere is unknown, never fail: values count only in the types and words the backends write.
"""

from __future__ import annotations

from ..hw.sysfs import ACCEL_PCI, accel_match, parse_int
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
        found, on_bus = judge_bus(snapshot["pci_accel"], vendor, profile.gpu.count, listed)
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
            hung = section.get("timeout") is True or "did not answer" in why or "still stuck" in why
            said, reason = ("did not answer", "not answering") if hung else ("failed", "failing")
            return [
                result.fail(
                    "accel.backend",
                    "node",
                    f"{tool} {said}: {why}; expected {count} {noun}s to answer",
                    f"{tool} {reason}",
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


def judge_bus(section, vendor: str, count: int, listed=()) -> tuple[list, set[str]]:
    """(results, the vendor's addresses seen) of the `pci_accel` section. Judged by address: each device a
    full check listed (the node state's `known`, and in a full snapshot what the backend lists) must still be
    on the bus with the vendor's id; a known address gone fails, naming it. Chips per PCI function differ (a
    310P card has two chips on one, an MI300X in CPX mode eight partitions) and a new model brings a device
    id stune's table lacks, so before any full check only "none of the vendor's devices at all" is said, as
    unknown: the count is the full check's."""
    if (
        not isinstance(section, dict)
        or section.get("answered") is not True
        or not isinstance(section.get("devices"), dict)
    ):
        why = section.get("error") if isinstance(section, dict) else None
        why = why[:ERROR_MAX] if isinstance(why, str) else "unreadable 'pci_accel' section"
        return [result.unknown("accel.pci", "node", f"cannot see the PCI bus: {why}")], set()
    given = section.get("known")
    known = [a for a in [*(given if isinstance(given, list) else []), *listed] if bus_address(a) == a]
    known = list(dict.fromkeys(known))
    devices = {a: d for a, d in section["devices"].items() if isinstance(a, str)}
    mine: list[str] = []
    gone: list[str] = []
    unreadable: list[str] = []
    for address in sorted(set(devices) | set(known)):
        dev = devices.get(address)
        present = dev.get("present") if isinstance(dev, dict) else None
        if present is False:
            if address in known:  # (an address no full check listed is simply not one of these devices)
                gone.append(address)
            continue
        match = accel_match(vendor, dev.get) if present is True and isinstance(dev, dict) else None
        if match is False and address in known and isinstance(dev, dict):
            match = vendor_id(dev.get("vendor"), vendor)  # listed by the backend: any device id of the vendor
        if match:
            mine.append(address)
        elif match is None:
            unreadable.append(address)
    noun = NOUN[vendor]
    seen = f"{len(mine)} {LABEL[vendor]} {noun}s on the PCI bus"
    lost = [a for a in known if a not in mine and a not in unreadable]  # another vendor's device there
    if gone:
        out = result.fail(
            "accel.pci", "node", f"{seen}; gone from the bus: {', '.join(gone)}", f"{gone[0]} gone from PCI"
        )
    elif lost:
        out = result.fail(
            "accel.pci",
            "node",
            f"{seen}; not the {LABEL[vendor]} device a full check listed at {', '.join(lost)}",
            f"{lost[0]} not an {LABEL[vendor]} {noun}",
        )
    elif [a for a in unreadable if a in known] or (unreadable and not mine):
        out = result.unknown("accel.pci", "node", f"{seen}; unreadable ids of {', '.join(unreadable)}")
    elif not mine:
        out = result.unknown(
            "accel.pci",
            "node",
            f"no device with an {LABEL[vendor]} id stune knows on the PCI bus; expected {count} {noun}s "
            "(gpu.count): the full check lists them",
        )
    else:
        basis = f"as the last full check listed {len(known)}" if known else "(before any full check)"
        out = result.ok("accel.pci", "node", f"{seen} {basis}")
    return [out], set(mine)


def vendor_id(text, vendor: str) -> bool | None:
    """Whether a PCI vendor id (sysfs text) is the vendor's; None when it cannot be read."""
    if parse_int(text) is None:
        return None
    return text.strip().lower() == ACCEL_PCI[vendor][0]
