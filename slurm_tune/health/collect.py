"""Read the node into a snapshot for the checks: the prolog's fast subset, or everything.

The prolog reads only what its checks need (the profile's HCA ports and netdevs, the GPUs on the PCI bus)
through the hardware layer's section readers, each under the profile's probe deadline, and never loads
NVML. The epilog and the periodic run take a full capture. In tests and replays the NVML part comes from a
snapshot file (`--gpu-snapshot`, `$STUNE_GPU_SNAPSHOT`) instead of the driver.
"""

from __future__ import annotations

import time

from .. import fastjson
from ..hw.sysfs import FORMAT, IB_ERROR_COUNTERS, Sysfs

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


def fast(root: str, profile: Profile, node: str, known_gpus=None) -> dict:
    """The prolog's snapshot: the required HCA ports (the four judged counters, no GID tables), the needed
    netdevs and the GPUs on the PCI bus, read by ONE probe under the profile's deadline (a thread per section
    would cost more than the reads). Sections the probe did not finish say they did not answer and keep what
    was read."""
    from ..hw.deadline import ERROR, run_probe

    sysfs = Sysfs(root)
    plan: list[tuple] = []  # (section, names or None for every NVIDIA GPU, read one)
    if profile.fabric.type in ("ib", "roce"):
        devices = list(dict.fromkeys(h.device for h in profile.fabric.hcas))
        # an absent HCA reads as None and is left out: judged missing; an unreadable one says why
        plan.append(("ib", devices, lambda d: sysfs.ib_device(d, gids=False, counters=IB_ERROR_COUNTERS)))
    names = [profile.fabric.socket_ifname] if profile.fabric.socket_ifname else []
    names += [h.netdev for h in profile.fabric.hcas if h.netdev]
    if names:
        plan.append(("net", list(dict.fromkeys(names)), sysfs.netdev))
    if profile.gpu.count:
        # the GPUs NVML listed last time, by address; a scan of the whole bus only until that is known
        known = (
            [a for a in known_gpus if isinstance(a, str) and "/" not in a]
            if isinstance(known_gpus, list)
            else []
        )
        plan.append(("pci_gpus", known if len(known) >= profile.gpu.count else None, sysfs.pci_device))
    finished: list = []

    def probe(partial):
        out: dict = {}
        partial.value = out
        for section, wanted, read in plan:
            found = out[section] = {}
            for name in sysfs.nvidia_gpus() if wanted is None else wanted:
                value = read(name)
                if value is not None:
                    found[name] = value
            finished.append(section)
        return out

    result = run_probe("sysfs", probe, profile.health.probe_timeout_s)
    read = result.value if isinstance(result.value, dict) else {}
    snap: dict = {
        "format": FORMAT,
        "node": node,
        "captured_at": round(time.time(), 3),
        "sysfs_root": root,
        "scope": "fast",
    }
    for section, _, _ in plan:
        snap[section] = {
            "answered": section in finished,
            "devices": read.get(section, {}),
            "elapsed_s": round(result.elapsed_s, 4),
        }
        if section not in finished:
            snap[section]["error"] = (
                result.message if result.status != ERROR else f"sysfs probe failed: {result.message}"
            )
    add_known_gpus(sysfs, snap, known_gpus)
    snap["problems"] = list(sysfs.problems)
    return snap


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
) -> dict:
    """Everything (`stune-health capture`), with NVML replayed from `gpu_snapshot` when given. GID tables
    only when asked for: the checks do not need them, a capture for triage does. A profile without GPUs
    (gpu.count 0) neither imports pynvml nor probes NVML. `drift`: the host settings too (add_drift): the
    periodic run and `stune-health capture`, never a hook."""
    from ..hw.snapshot import capture

    timeout = timeout_s or (profile.health.probe_timeout_s if profile is not None else 5.0)
    if profile is not None and not profile.gpu.count:  # a CPU/IB-only partition: no pynvml, no NVML probe
        snap = capture(
            root,
            timeout_s=timeout,
            nvml=False,
            node=node,
            gids=gids,
            no_nvml=f"not captured (partition {profile.partition} has gpu.count 0)",
        )
        return add_drift(snap, root, profile, timeout) if drift else snap
    snap = capture(root, timeout_s=timeout, nvml=nvml and gpu_snapshot is None, node=node, gids=gids)
    if gpu_snapshot:
        snap["gpus"] = replay_gpus(gpu_snapshot)
    add_known_gpus(Sysfs(root), snap, known_gpus)
    return add_drift(snap, root, profile, timeout) if drift else snap


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


def replay_gpus(path: str) -> dict:
    """The `gpus` section of a snapshot file, as NVML would have answered it. A file that cannot be read is
    a setup problem, not the GPUs': the section says "not captured", which the checks judge unknown."""
    from ..safeio import UnsafePathError, require_trusted

    try:
        require_trusted(path)  # root replays NVML only from a file root alone can write
        data = fastjson.load_file(path)
    except UnsafePathError as exc:
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {exc}"}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {path}: {why}"}
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {path} has no 'gpus'"}
    return gpus
