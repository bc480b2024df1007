"""The `accel` snapshot section: AMD and Huawei Ascend devices in one format (issue 26).

NVIDIA nodes keep their `gpus` section (NVML, hw/nvml.py). A partition whose profile says `accelerator: amd`
or `accelerator: ascend` gets an `accel` section instead, read by that vendor's backend:
- amd (hw/amd.py): AMD's `amdsmi` Python library (the optional `amd` extra), behind a deadline;
- ascend (hw/ascend.py): `npu-smi info` and `hccn_tool -i N -link/-net_health/-ip -g`, each run with a deadline
  and a bounded read, plus the driver, firmware and CANN version files.
Captured once, judged offline (health/accel.py), replayed from a file (`STUNE_GPU_SNAPSHOT`, `--gpu-snapshot`),
fuzzed: the same life as NVML's section. Values are kept as the tool gave them, converted to numbers where the
format is clear; anything missing, `-`, `N/A` or `NA` is None (unmeasured), never 0.

The section:

    {"answered": bool,           # the backend read the devices (False: `error` says why; `stalled_at` what)
     "vendor": "amd" | "ascend",
     "source": "amdsmi" | "npu-smi" | "replay",
     "elapsed_s": float,
     "error": str,               # only when not answered
     "system": {                 # the version matrix's parts; None where not found
        "driver_version": str | None,     # amdgpu driver / Ascend NPU driver
        "firmware_version": str | None,   # Ascend NPU firmware; AMD: None (per device in `firmware`)
        "cann_version": str | None,       # Ascend: ascend_toolkit_install.info
        "rocm_version": str | None,       # AMD: ROCm
        "tool_version": str | None,       # npu-smi / amdsmi library version
        "errors": {name: why}},
     "devices": [{
        "index": int,            # the device's id in its tool (npu-smi NPU ID, amdsmi index)
        "chip": int,             # Ascend: chip within the NPU (A3 and 310P cards have two); AMD: 0
        "minor": int | None,     # the device file's position: N of /dev/davinciN; AMD: the render node's place
                                 #   among the node's (renderD128 is 0; MI300's 8 nodes per GPU, D128, D136,
                                 #   ..., give 0, 1, ...; hw/amdvalues.fill_minors). Slurm's GRES ids follow
                                 #   gres.conf's files
        "render": int | None,    # AMD: the renderD number itself
        "firmware": {name: version},     # AMD: per-device firmware (amdsmi); {} where none
        "name": str | None,      # npu-smi Name (910B3), amdsmi market name (AMD Instinct MI300X)
        "health": str | None,    # Ascend: OK / Warning / Alarm / Critical as npu-smi prints it; AMD: None
        "bus_id": str | None,    # 0000:c1:00.0 (lower case; a masked 0000:xx:00.0 stays as printed)
        "serial": str | None,
        "power_w": float | None, "power_limit_w": float | None,
        "temperature_c": float | None,   # AMD: hotspot (junction), else edge; Ascend: the chip
        "util_pct": float | None,        # AMD: GFX activity; Ascend: AICore %
        "mem_util_pct": float | None,    # AMD: UMC activity; Ascend: HBM (or memory) used / total
        "mem_used_mb": float | None, "mem_total_mb": float | None,   # HBM where the device has it
        "ecc": {"uncorrected": int | None, "corrected": int | None},
        "pcie": {"width": int | None, "max_width": int | None, "gen": int | None, "max_gen": int | None},
        "links": [{"link": int, "kind": "xgmi", "up": bool}],         # AMD XGMI; [] where none
        "processes": [{"pid": int, "mem_mb": float | None}] | None,   # None: the tool cannot tell
        "errors": {field: why}}],
     "ports": {                  # Ascend: each NPU's on-card RoCE port (hccn_tool), by device id as text
        "0": {"link": "UP" | "DOWN" | None, "net_health": str | None,  # Success, Fault, ... as printed
              "ip": str | None, "netmask": str | None, "errors": {what: why}}}}

`index` and `minor` agree on every real node (npu-smi's NPU ID is the davinci number; amdsmi orders by
the render node), but a device is always named by `minor` where the job side needs Slurm's number.
"""

from __future__ import annotations

from ..vendors import AMD, ASCEND
from .nvml import GpuUtilization

__all__ = ["AMD", "ASCEND", "SECTION", "utilization_from_section"]

SECTION = "accel"


def _num(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return value if ok else None


def utilization_from_section(section) -> list[GpuUtilization]:
    """The sampler's reading of each device in an `accel` section: `index` is the device's `minor` (Slurm's GRES
    id follows the device files), else its position; a value the tool did not give is None (unmeasured, never
    0 %); procs is None where the tool cannot list processes. Garbage reads as no devices."""
    devices = section.get("devices") if isinstance(section, dict) else None
    out = []
    for pos, dev in enumerate(devices if isinstance(devices, list) else []):
        if not isinstance(dev, dict):
            continue
        minor = dev.get("minor")
        procs = dev.get("processes")
        used, total = _num(dev.get("mem_used_mb")), _num(dev.get("mem_total_mb"))
        out.append(
            GpuUtilization(
                minor if isinstance(minor, int) and not isinstance(minor, bool) and minor >= 0 else pos,
                dev.get("serial") if isinstance(dev.get("serial"), str) else None,
                dev.get("bus_id") if isinstance(dev.get("bus_id"), str) else None,
                _num(dev.get("util_pct")),
                _num(dev.get("mem_util_pct")),
                used * 1048576 if used is not None else None,
                total * 1048576 if total is not None else None,
                _num(dev.get("power_w")),
                len(procs) if isinstance(procs, list) else None,
            )
        )
    return out
