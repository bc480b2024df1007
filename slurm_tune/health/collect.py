"""Read the node into a snapshot for the checks: the prolog's fast subset, or everything.

The prolog reads only what its checks need (the profile's HCA ports and netdevs, the GPUs on the PCI bus)
through the hardware layer's section readers, each under the profile's probe deadline, and never loads
NVML. The epilog and the periodic run take a full capture. In tests and replays the NVML part comes from a
snapshot file (`--gpu-snapshot`, `$STUNE_GPU_SNAPSHOT`) instead of the driver.

An AMD or Ascend partition (`accelerator: amd | ascend`) never touches NVML: its prolog reads the PCI bus's
view of the vendor's devices (`pci_accel`; no vendor tool runs), its full capture the `accel` section through
hw/amd.py or hw/ascend.py, or replays one from the same snapshot file (issue 26; health/accel.py judges both).
"""

from __future__ import annotations

import time

from .. import fastjson
from ..hw.sysfs import FORMAT, IB_ERROR_COUNTERS, Sysfs

NVIDIA = "nvidia"  # the profile's default accelerator (accelspec.VENDORS): NVML and the NVIDIA bus view

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


def add_known_gpus(sysfs: Sysfs, snap: dict, known) -> None:
    """Read the GPUs NVML listed before by address as well, even if the bus no longer shows them as NVIDIA
    GPUs: a GPU gone from the bus must say which one, and a garbled vendor id must not look like one gone."""
    section = snap.get("pci_gpus")
    if not isinstance(section, dict) or section.get("answered") is not True or not isinstance(known, list):
        return
    devices = section.get("devices")
    if not isinstance(devices, dict):
        return
    for address in known:
        if isinstance(address, str) and address not in devices and "/" not in address:
            devices[address] = sysfs.pci_device(address)


def addresses(known) -> list[str]:
    """The PCI addresses a node state lists (`gpu_pci`), without anything that could leave the bus directory."""
    return [a for a in known if isinstance(a, str) and "/" not in a] if isinstance(known, list) else []


def fast(root: str, profile: Profile, node: str, known_gpus=None) -> dict:
    """The prolog's snapshot: the required HCA ports (the four judged counters, no GID tables), the needed
    netdevs and the GPUs on the PCI bus (an AMD or Ascend partition's: `pci_accel`, the devices a full check
    listed by address, else the vendor's on the bus), read by ONE probe under the profile's deadline (a
    thread per section would cost more than the reads). Sections the probe did not finish say they did not
    answer and keep what was read."""
    sysfs = Sysfs(root)
    plan: list[tuple] = []  # (section, names or a function listing them, read one)
    if profile.fabric.type in ("ib", "roce"):
        devices = list(dict.fromkeys(h.device for h in profile.fabric.hcas))
        # an absent HCA reads as None and is left out: judged missing; an unreadable one says why
        plan.append(("ib", devices, lambda d: sysfs.ib_device(d, gids=False, counters=IB_ERROR_COUNTERS)))
    names = [profile.fabric.socket_ifname] if profile.fabric.socket_ifname else []
    names += [h.netdev for h in profile.fabric.hcas if h.netdev]
    if names:
        plan.append(("net", list(dict.fromkeys(names)), sysfs.netdev))
    known = addresses(known_gpus)
    vendor = profile.accelerator
    if profile.gpu.count and vendor == NVIDIA:
        # the GPUs NVML listed last time, by address; a scan of the whole bus only until that is known
        plan.append(
            ("pci_gpus", known if len(known) >= profile.gpu.count else sysfs.nvidia_gpus, sysfs.pci_device)
        )
    elif (
        profile.gpu.count
    ):  # amd, ascend: the devices a full check listed, by address; else the vendor's on the bus
        plan.append(("pci_accel", known or (lambda: sysfs.vendor_devices(vendor)), sysfs.pci_device))
    snap: dict = {
        "format": FORMAT,
        "node": node,
        "captured_at": round(time.time(), 3),
        "sysfs_root": root,
        "scope": "fast",
    }
    snap.update(read_sections(sysfs, plan, profile.health.probe_timeout_s))
    if "pci_accel" in snap:
        snap["pci_accel"].update(vendor=vendor, known=known)
    add_known_gpus(sysfs, snap, known_gpus)
    snap["problems"] = list(sysfs.problems)
    return snap


def read_sections(sysfs: Sysfs, plan: list[tuple], timeout_s: float) -> dict:
    """{section: {"answered", "devices", "elapsed_s"[, "error"]}} of a plan of (section, names or a function
    giving them, read one), read by ONE probe under the deadline (a thread per section would cost more than
    the reads). Sections the probe did not finish say they did not answer and keep what was read."""
    from ..hw.deadline import ERROR, run_probe

    finished: list = []

    def probe(partial):
        out: dict = {}
        partial.value = out
        for section, wanted, read in plan:
            found = out[section] = {}
            for name in wanted() if callable(wanted) else wanted:
                value = read(name)
                if value is not None:
                    found[name] = value
            finished.append(section)
        return out

    result = run_probe("sysfs", probe, timeout_s)
    read = result.value if isinstance(result.value, dict) else {}
    sections: dict = {}
    for section, _, _ in plan:
        sections[section] = {
            "answered": section in finished,
            "devices": read.get(section, {}),
            "elapsed_s": round(result.elapsed_s, 4),
        }
        if section not in finished:
            sections[section]["error"] = (
                result.message if result.status != ERROR else f"sysfs probe failed: {result.message}"
            )
    return sections


def full(
    root: str,
    profile: Profile | None,
    node: str,
    gpu_snapshot: str | None = None,
    gids: bool = False,
    timeout_s: float | None = None,
    known_gpus=None,
    nvml: bool = True,
    drift: bool = False,
    environ=None,
) -> dict:
    """Everything (`stune-health capture`), with NVML replayed from `gpu_snapshot` when given. GID tables
    only when asked for: the checks do not need them, a capture for triage does. A profile without GPUs
    (gpu.count 0) neither imports pynvml nor probes NVML, and an amd or ascend one takes its `accel` section
    instead (add_accel). `drift`: the host settings too (add_drift): the periodic run and `stune-health
    capture`, never a hook. `environ`: where an Ascend node's tools are looked for ($STUNE_ACCEL_TOOLS; default
    this process's environment; doctor passes the site's env file)."""
    from ..hw.snapshot import capture

    timeout = timeout_s or (profile.health.probe_timeout_s if profile is not None else 5.0)
    vendor = profile.accelerator if profile is not None else NVIDIA
    if profile is not None and (not profile.gpu.count or vendor != NVIDIA):
        # a CPU/IB-only partition: no pynvml, no NVML probe; an amd or ascend one: its own backend, never NVML
        why = "has gpu.count 0" if not profile.gpu.count else f"is {vendor}: NVML is not used"
        snap = capture(
            root,
            timeout_s=timeout,
            nvml=False,
            node=node,
            gids=gids,
            no_nvml=f"not captured (partition {profile.partition} {why})",
        )
        if profile.gpu.count:
            add_accel(snap, root, profile, node, timeout, gpu_snapshot, known_gpus, environ)
        return add_drift(snap, root, profile, timeout) if drift else snap
    snap = capture(root, timeout_s=timeout, nvml=nvml and gpu_snapshot is None, node=node, gids=gids)
    if gpu_snapshot:
        snap["gpus"] = replay_gpus(gpu_snapshot)
        if profile is None:  # a capture for triage keeps a replayed accel section too
            data, _ = snapshot_file(gpu_snapshot)
            if isinstance(data, dict) and isinstance(data.get("accel"), dict):
                snap["accel"] = data["accel"]
    add_known_gpus(Sysfs(root), snap, known_gpus)
    return add_drift(snap, root, profile, timeout) if drift else snap


def add_accel(
    snap: dict,
    root: str,
    profile: Profile,
    node: str,
    timeout_s: float,
    gpu_snapshot=None,
    known_gpus=None,
    environ=None,
) -> dict:
    """`snap` with the `accel` section of an amd or ascend partition (replayed from `gpu_snapshot` when given,
    else read by hw/amd.py or hw/ascend.py) and `pci_accel`, the bus's view of the vendor's devices (those on
    the bus, and those a full check listed before, by address)."""
    vendor = profile.accelerator
    snap["accel"] = (
        replay_accel(gpu_snapshot, vendor)
        if gpu_snapshot
        else capture_accel(root, profile, node, timeout_s, environ)
    )
    from .acceldevice import bus_address

    sysfs, known = Sysfs(root), addresses(known_gpus)
    devices = snap["accel"].get("devices") if isinstance(snap["accel"], dict) else None
    listed = (
        [bus_address(d.get("bus_id")) for d in devices if isinstance(d, dict)]
        if isinstance(devices, list)
        else []
    )
    extra = [
        a for a in known + listed if a
    ]  # read by address too: a device the backend lists or listed before

    def names():
        return list(dict.fromkeys(sysfs.vendor_devices(vendor) + extra))

    plan = [("pci_accel", names, sysfs.pci_device)]
    snap.update(read_sections(sysfs, plan, timeout_s))
    snap["pci_accel"].update(vendor=vendor, known=known)
    snap["problems"] = list(dict.fromkeys([*snap.get("problems", []), *sysfs.problems]))
    return snap


def capture_accel(root: str, profile: Profile, node: str, timeout_s: float, environ=None) -> dict:
    """The node's `accel` section from its vendor's backend, imported here only (like hw/nvml.py: the prolog
    never runs a vendor tool): hw.ascend.capture or hw.amd.capture. A backend that cannot be imported or
    breaks its never-raise promise is stune's problem: "not captured" (judged unknown), never the node's."""
    import importlib

    vendor = profile.accelerator
    blank = {"answered": False, "vendor": vendor, "source": "stune", "devices": []}
    try:
        backend = importlib.import_module(f"slurm_tune.hw.{vendor}")
        if vendor == "ascend":
            section = backend.capture(root, timeout_s, tools=profile.accel.tools, environ=environ, node=node)
        else:  # the ROCm version file is read under the relocatable root where amdsmi cannot say it
            section = backend.capture(timeout_s, root=root)
    except ImportError as exc:
        return dict(blank, error=f"not captured: stune's {vendor} backend cannot be imported: {exc}")
    except Exception as exc:
        return dict(
            blank, error=f"not captured: stune's {vendor} backend failed: {type(exc).__name__}: {exc}"
        )
    if not isinstance(section, dict):
        return dict(blank, error=f"not captured: stune's {vendor} backend gave no section")
    return section


def add_drift(snap: dict, root: str, profile: Profile | None, timeout_s: float, sysctls=()) -> dict:
    """`snap` with its `drift` section (hw/drift.py): the host settings, and the PCI paths and config space
    of the GPUs and HCAs the capture found; the sysctls read are the built-in ones, the profile's and
    `sysctls`."""
    from ..hw.drift import capture

    pci: list[str] = []
    for name, key in (("pci_gpus", None), ("ib", "pci")):
        section = snap.get(name)
        devices = section.get("devices") if isinstance(section, dict) else None
        for address, dev in (devices if isinstance(devices, dict) else {}).items():
            found = address if key is None else (dev.get(key) if isinstance(dev, dict) else None)
            if isinstance(found, str):
                pci.append(found)
    names = [*(profile.drift.sysctls if profile is not None else ()), *sysctls]
    snap["drift"] = capture(root, timeout_s, pci=pci, sysctls=names)
    return snap


def snapshot_file(path: str) -> tuple[object, str]:
    """(the JSON of a GPU snapshot file, "") or (None, why not). Root replays only from a file root alone can
    write (safeio.require_trusted). A file that cannot be read is a setup problem, not the devices': the
    reason says "not captured", which the checks judge unknown."""
    from ..safeio import UnsafePathError, require_trusted

    try:
        require_trusted(path)
        return fastjson.load_file(path), ""
    except UnsafePathError as exc:
        return None, f"not captured: GPU snapshot {exc}"
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        return None, f"not captured: GPU snapshot {path}: {why}"


def replay_gpus(path: str) -> dict:
    """The `gpus` section of a snapshot file, as NVML would have answered it."""
    data, why = snapshot_file(path)
    if why:
        return {"answered": False, "devices": [], "error": why}
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {path} has no 'gpus'"}
    return gpus


def replay_accel(path: str, vendor: str) -> dict:
    """The `accel` section of a snapshot file (beside or instead of `gpus`), as the vendor's backend would have
    given it; the same trust rule as replay_gpus."""
    data, why = snapshot_file(path)
    accel = data.get("accel") if isinstance(data, dict) else None
    if why or not isinstance(accel, dict):
        why = why or f"not captured: GPU snapshot {path} has no 'accel'"
        return {"answered": False, "vendor": vendor, "source": "replay", "devices": [], "error": why}
    return accel
