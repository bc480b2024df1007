"""Which CPUs and NUMA node a task should run on: those of its GPU.

The task's GPU: CUDA_VISIBLE_DEVICES (as Slurm set it for the step) indexed by SLURM_LOCALID (modulo the
count, so 8 ranks on 4 GPUs share them in order). An index is mapped through SLURM_STEP_GPUS (or
SLURM_JOB_GPUS) when both lists have the same length: under ConstrainDevices Slurm renumbers
CUDA_VISIBLE_DEVICES from 0 while those keep the node's own GPU numbers. The node's GPU number is the device
minor (/proc/driver/nvidia/gpus/*/information) when the driver shows it, else the position in PCI bus order
(nvidia-smi's order). A UUID (GPU-..., MIG-...) needs NVML. From the PCI address, sysfs gives numa_node and
local_cpulist; the CPUs are intersected with the cpuset Slurm already gave the task, so stune never widens it.
"""

from __future__ import annotations

import os

from ..frozen import Record
from ..hw.sysfs import Sysfs, parse_cpulist, parse_int, pci_address
from ..text import is_digits


class BindPlan(Record):
    """cpus: what to bind to (None: run unbound, `note` says why); allowed: the task's CPUs before."""

    __slots__ = ("gpu", "pci", "numa_node", "cpus", "allowed", "note")
    gpu: str | None
    pci: str | None
    numa_node: int | None
    cpus: frozenset[int] | None
    allowed: frozenset[int]
    note: str


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def task_gpu(environ) -> tuple[str | None, str]:
    """(this task's GPU as the node names it: a number or a UUID, or None; a description or the reason)."""
    visible = _split(environ.get("CUDA_VISIBLE_DEVICES"))
    physical = _split(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"))
    if not visible:
        if not physical:
            return None, "no GPU for this task (CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS are not set)"
        visible = physical
    try:
        local = int(environ.get("SLURM_LOCALID") or 0)
    except ValueError:
        local = 0
    position = local % len(visible)
    chosen = visible[position]
    if is_digits(chosen) and len(physical) == len(visible) and is_digits(physical[position]):
        chosen = physical[position]
    return chosen, f"local task {local} -> GPU {chosen}"


def gpu_pci(sysfs: Sysfs, gpu: str) -> tuple[str | None, str]:
    """PCI address of the node's GPU `gpu` (a number or a UUID); (None, why) when it cannot be found."""
    if not is_digits(gpu):
        return _pci_from_nvml(gpu)
    number = int(gpu)
    by_minor = {}
    for address in sysfs.listdir("proc/driver/nvidia/gpus"):
        info = sysfs.read(f"proc/driver/nvidia/gpus/{address}/information") or ""
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and is_digits(value.strip()):
                by_minor[int(value.strip())] = pci_address(address)
    if by_minor:
        if number in by_minor:
            return by_minor[number], ""
        return None, f"GPU {number}: no NVIDIA device with minor number {number}"
    gpus = sysfs.nvidia_gpus()
    if number < len(gpus):
        return gpus[number], ""
    return None, f"GPU {number}: the node shows {len(gpus)} NVIDIA GPU(s) in sysfs"


def _pci_from_nvml(uuid: str) -> tuple[str | None, str]:
    from ..hw.nvmluuid import pci_bus_id_of_uuid

    bus, problem = pci_bus_id_of_uuid(uuid)
    if bus is None:  # no NVML, no driver, unknown UUID, a hung GPU: all mean "cannot tell"
        return None, f"GPU {uuid}: cannot map a UUID to its PCI address without NVML ({problem})"
    return pci_address(bus), ""


def plan_binding(environ, sysfs: Sysfs, allowed: frozenset[int]) -> BindPlan:
    gpu, what = task_gpu(environ)
    if gpu is None:
        return BindPlan(None, None, None, None, allowed, what)
    pci, problem = gpu_pci(sysfs, gpu)
    if pci is None:
        return BindPlan(gpu, None, None, None, allowed, problem)
    info = sysfs.pci_device(pci)
    node = parse_int(info.get("numa_node")) if info.get("present") else None
    if node is None or node < 0:
        return BindPlan(
            gpu,
            pci,
            None,
            None,
            allowed,
            f"GPU {gpu} ({pci}) has no NUMA node (numa_node {info.get('numa_node') or 'missing'}, "
            "as in most VMs): running unbound, since binding to a guessed node can hurt",
        )
    local = parse_cpulist(info.get("local_cpulist")) or parse_cpulist(sysfs.numa_cpulist(node)) or frozenset()
    cpus = local & allowed
    if not cpus:
        return BindPlan(
            gpu,
            pci,
            node,
            None,
            allowed,
            f"GPU {gpu} ({pci}) is on NUMA node {node} (CPUs {format_cpus(local)}), but Slurm gave "
            f"this task CPUs {format_cpus(allowed)}: keeping Slurm's",
        )
    return BindPlan(gpu, pci, node, cpus, allowed, "")


def format_cpus(cpus) -> str:
    """{0,1,2,5} -> '0-2,5'."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus or ()):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "none"


# ---- applying it -------------------------------------------------------------------------------------------------

MPOL_BIND = 2
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261}


def set_membind(node: int) -> str:
    """Bind this process's (and, across exec, its command's) memory to `node` with set_mempolicy(2).
    Returns '' on success, else why not."""
    number = SYS_SET_MEMPOLICY.get(os.uname().machine)
    if number is None:
        return f"set_mempolicy: unknown syscall number on {os.uname().machine}"
    import ctypes

    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        return f"set_mempolicy(MPOL_BIND, node {node}): {os.strerror(ctypes.get_errno())}"
    return ""


def numactl_path(environ) -> str | None:
    for directory in (environ.get("PATH") or "/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or ".", "numactl")
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None
