"""Helpers for the health tests: snapshots made by the real capture code over fixture sysfs trees
(tests/hwtrees.py) and the NVML stand-in (tests/fakenvml.py), and profile directories to vary a policy."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import fakenvml
import hwtrees

from slurm_tune.hw import snapshot
from slurm_tune.hw.nvml import read_gpus
from slurm_tune.profiles import load_profile

REPO = Path(__file__).resolve().parent.parent
NODES = {  # profile -> (tree builder, GPU model, driver)
    "hdr": (hwtrees.dgx_a100_ib, "a100", "535.104.05"),
    "roce": (hwtrees.h100_roce, "h100", "535.129.03"),
    "vpc": (hwtrees.vpc_tcp, "a10g", "535.104.05"),
}


def gpu_devices(kind: str, n: int = 8, **overrides_by_index) -> list[dict]:
    """n healthy GPUs of a kind; overrides_by_index={"gpu3": {...}} changes one."""
    out = []
    for i in range(n):
        extra = dict(overrides_by_index.get(f"gpu{i}", {}))
        if kind == "a10g":
            extra.setdefault("bus_id", f"00000000:00:{0x1B + i:02X}.0")
            extra.setdefault("nvlinks", 0)
        out.append(fakenvml.device(i, kind, **extra))
    return out


def tree(root: Path, partition: str = "hdr", **kw) -> Path:
    builder = NODES[partition][0]
    return builder(Path(root), **kw)


def take(
    root: Path,
    partition: str = "hdr",
    devices: list[dict] | None = None,
    node: str = "n1",
    nvml: fakenvml.FakeNvml | None = None,
    **fake_kw,
) -> dict:
    """A full snapshot of the tree at `root`, NVML answered by the stand-in."""
    _, kind, driver = NODES[partition]
    if nvml is None:
        n = 4 if partition == "vpc" else 8
        nvml = fakenvml.FakeNvml(
            devices if devices is not None else gpu_devices(kind, n), driver=driver, **fake_kw
        )
    return snapshot.capture(str(root), nvml_module=nvml, node=node, timeout_s=2)


def node_snapshot(
    tmp: Path, partition: str = "hdr", hca_overrides=None, devices=None, kmsg=None, **fake_kw
) -> dict:
    root = tree(tmp, partition, **({"hca_overrides": hca_overrides} if hca_overrides else {}))
    if kmsg:
        hwtrees.kmsg(root, kmsg)
    return take(root, partition, devices, **fake_kw)


def gpu_file(
    path: Path, kind: str = "a100", n: int = 8, devices=None, driver: str = "535.104.05", **fake_kw
) -> Path:
    """A GPU snapshot file for --gpu-snapshot / STUNE_GPU_SNAPSHOT."""
    nvml = fakenvml.FakeNvml(
        devices if devices is not None else gpu_devices(kind, n), driver=driver, **fake_kw
    )
    doc = {"format": snapshot.FORMAT, "gpus": read_gpus(2, nvml)}
    path.parent.mkdir(parents=True, exist_ok=True)
    snapshot.save(doc, str(path))
    return path


def profile_dir(tmp: Path, edits: dict | None = None) -> Path:
    """A copy of partitions/ with edits: {"hdr.yaml": [(old, new), ...]} replaces text (each `old` must be
    there), {"hdr.yaml": "..."} replaces the whole file."""
    target = Path(tmp)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(REPO / "partitions", target)
    for name, change in (edits or {}).items():
        path = target / name
        if isinstance(change, str):
            path.write_text(change)
            continue
        text = path.read_text()
        for old, new in change:
            assert old in text, f"{old!r} is not in {name}"
            text = text.replace(old, new)
        path.write_text(text)
    return target


def profile(partition: str = "hdr", directory: Path | None = None):
    return load_profile(partition, str(directory) if directory else None)


def mutate(snap: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(snap)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out
