"""A node's full hardware state as one JSON snapshot: capture it live, save it, load it back.

`stune-health capture` writes one; `stune-health check --snapshot FILE` judges one offline ("why was n17
drained?"); the tests replay fixtures shaped like real ConnectX and A100/H100 nodes. Sysfs values are kept
raw (`4: ACTIVE`), exactly as the node showed them; parsing happens in the checks.

Each section is read by its own probe under a deadline and says whether it `answered`.
"""

from __future__ import annotations

import time

from ..errors import StuneError
from ..thisnode import node_name
from .sysfs import FORMAT, Sysfs

BOOT_ID = "proc/sys/kernel/random/boot_id"


class SnapshotError(StuneError):
    """A snapshot file cannot be read or is not a snapshot."""


def _section(result, key: str) -> dict:
    from .deadline import OK  # hot path: see docs/speed.md

    value = result.value if isinstance(result.value, dict) else {}
    section = {"answered": result.status == OK, key: value}
    if result.status != OK:
        section["error"] = result.message
        section.update(result.timed_out())
    section["elapsed_s"] = round(result.elapsed_s, 4)
    return section


def _capture_each(probe_name: str, timeout_s: float, names, read) -> dict:
    """One probe reading `read(name)` for each of `names()`; a stall keeps what was read before it, and
    says what it was reading (`stalled_at`)."""
    reading: list = [None]

    def probe(partial):
        out: dict = {}
        partial.value = out
        for name in names():
            reading[0] = name
            out[name] = read(name)
        return out

    from .deadline import TIMEOUT, run_probe

    result = run_probe(probe_name, probe, timeout_s)
    section = _section(result, "devices")
    if result.status == TIMEOUT and isinstance(reading[0], str):
        section["stalled_at"] = reading[0]
    return section


def capture_ib(sysfs: Sysfs, timeout_s: float, gids: bool = True, devices: list[str] | None = None) -> dict:
    """The `ib` section: every HCA (or just `devices`) with its ports, counters, firmware and GID tables."""
    return _capture_each(
        "sysfs-ib",
        timeout_s,
        sysfs.ib_devices if devices is None else lambda: devices,
        lambda dev: sysfs.ib_device(dev, gids=gids),
    )


def capture_net(sysfs: Sysfs, timeout_s: float) -> dict:
    return _capture_each("sysfs-net", timeout_s, sysfs.netdevs, sysfs.netdev)


def capture_pci_gpus(sysfs: Sysfs, timeout_s: float) -> dict:
    """NVIDIA GPUs as the PCI bus sees them: present even when NVML is not, with NUMA node and link state."""
    return _capture_each("sysfs-pci", timeout_s, sysfs.nvidia_gpus, sysfs.pci_device)


def capture_kernel(root: str, timeout_s: float) -> dict:
    """NVIDIA Xid events still in the kernel log, with their sequence numbers so checks can tell which are new,
    and the boot id, so they can tell a reboot (which resets the GPUs and restarts the sequence numbers)."""
    from .deadline import run_probe
    from .kernellog import read_xid_events

    def probe(partial):
        return {"xid": read_xid_events(root), "boot_id": Sysfs(root).read(BOOT_ID)}

    return _section(run_probe("kmsg", probe, timeout_s), "events")


def _read_gpus(timeout_s: float, nvml_module) -> dict:
    from .nvml import read_gpus

    return read_gpus(timeout_s, nvml_module)


def capture(
    root: str = "/",
    *,
    timeout_s: float = 5.0,
    nvml: bool = True,
    nvml_module=None,
    gids: bool = True,
    node: str | None = None,
    no_nvml: str = "not captured (--no-nvml)",
) -> dict:
    """The whole node. Never raises on hardware trouble: every section records whether it answered. NVML
    (and pynvml: hot path, see docs/speed.md) only when `nvml`."""
    sysfs = Sysfs(root)
    snap = {
        "format": FORMAT,
        "node": node or node_name(),
        "captured_at": round(time.time(), 3),
        "sysfs_root": root,
        "ib": capture_ib(sysfs, timeout_s, gids=gids),
        "net": capture_net(sysfs, timeout_s),
        "pci_gpus": capture_pci_gpus(sysfs, timeout_s),
        "kernel": capture_kernel(root, timeout_s),
        "gpus": _read_gpus(timeout_s, nvml_module)
        if nvml
        else {"answered": False, "devices": [], "error": no_nvml},
    }
    snap["problems"] = list(sysfs.problems)
    return snap


def save(snapshot: dict, path: str) -> None:
    import json

    from ..safeio import write_atomic

    write_atomic(path, json.dumps(snapshot, indent=1, sort_keys=True) + "\n")


def load(path: str) -> dict:
    """A snapshot from a file, through the fast JSON path (hot path: see docs/speed.md). Unreadable,
    non-JSON or non-snapshot input is a SnapshotError naming the file (and line, for JSON syntax errors)."""
    from ..fastjson import load_file

    try:
        data = load_file(path)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SnapshotError(f"{path}: not a text file") from None
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise SnapshotError(
            f"{path}:{line}: not JSON: {getattr(exc, 'msg', exc)}" if line else f"{path}: not JSON: {exc}"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f'{path}: not a stune snapshot (expected "format": "{FORMAT}")')
    return data
