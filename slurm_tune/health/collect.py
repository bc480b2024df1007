"""Read the node into a snapshot for the checks: the prolog's fast subset, or everything.

The prolog reads only what its checks need (the profile's HCA ports and netdevs, the GPUs on the PCI bus)
through the hardware layer's section readers, each under the profile's probe deadline, and never loads
NVML. The epilog and the periodic run take a full capture. In tests and replays the NVML part comes from a
snapshot file (`--gpu-snapshot`, `$STUNE_GPU_SNAPSHOT`) instead of the driver.
"""
from __future__ import annotations

import os
import time

from ..hw.snapshot import FORMAT, capture_ib, capture_net, capture_pci_gpus
from ..hw.sysfs import Sysfs
from . import fastjson


def add_known_gpus(sysfs: Sysfs, snap: dict, known) -> None:
    """Read the GPUs NVML listed before by address as well, even if the bus no longer shows them as NVIDIA
    GPUs: a GPU gone from the bus must say which one, and a garbled vendor id must not look like one gone."""
    section = snap.get("pci_gpus")
    devices = section.get("devices") if isinstance(section, dict) else None
    if not isinstance(devices, dict) or not isinstance(known, list) or section.get("answered") is not True:
        return
    for address in known:
        if isinstance(address, str) and address not in devices and "/" not in address:
            devices[address] = sysfs.pci_device(address)


def fast(root: str, profile, node: str, known_gpus=None) -> dict:
    """The prolog's snapshot: required HCA ports (no GID tables), netdevs and the GPUs on the PCI bus."""
    sysfs = Sysfs(root)
    timeout = profile.health.probe_timeout_s
    snap = {"format": FORMAT, "node": node, "captured_at": round(time.time(), 3), "sysfs_root": root,
            "scope": "fast"}
    if profile.fabric.type in ("ib", "roce"):
        devices = list(dict.fromkeys(h.device for h in profile.fabric.hcas))
        snap["ib"] = capture_ib(sysfs, timeout, gids=False, devices=devices)
        # capture_ib reads any name it is given; a device that is not there reads as all-None: drop it
        found = snap["ib"].get("devices")
        if isinstance(found, dict):
            for name in devices:
                if name in found and not sysfs.exists(f"sys/class/infiniband/{name}"):
                    del found[name]
    if profile.fabric.socket_ifname or profile.fabric.type == "roce":
        snap["net"] = capture_net(sysfs, timeout)
    if profile.gpu.count:
        snap["pci_gpus"] = capture_pci_gpus(sysfs, timeout)
        add_known_gpus(sysfs, snap, known_gpus)
    snap["problems"] = list(sysfs.problems)
    return snap


def full(root: str, profile, node: str, gpu_snapshot: str | None = None, gids: bool = False,
         timeout_s: float | None = None, known_gpus=None) -> dict:
    """Everything (`stune-health capture`), with NVML replayed from `gpu_snapshot` when given. GID tables
    only when asked for: the checks do not need them, a capture for triage does."""
    from ..hw.snapshot import capture

    timeout = timeout_s or (profile.health.probe_timeout_s if profile is not None else 5.0)
    snap = capture(root, timeout_s=timeout, nvml=gpu_snapshot is None, node=node, gids=gids)
    if gpu_snapshot:
        snap["gpus"] = replay_gpus(gpu_snapshot)
    add_known_gpus(Sysfs(root), snap, known_gpus)
    return snap


def replay_gpus(path: str) -> dict:
    """The `gpus` section of a snapshot file, as NVML would have answered it. A file that cannot be read is
    a setup problem, not the GPUs': the section says "not captured", which the checks judge unknown."""
    try:
        data = fastjson.load_file(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {path}: {why}"}
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        return {"answered": False, "devices": [], "error": f"not captured: GPU snapshot {path} has no 'gpus'"}
    return gpus
