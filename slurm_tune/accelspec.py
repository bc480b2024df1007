"""The profile's accelerator keys (issue 26): which vendor's devices a partition has, their thresholds, and the
communication library settings of AMD (RCCL) and Huawei Ascend (HCCL) partitions. Loaded with the schema only
(profilecheck.py: a profile cache miss). docs/accelerators.md has the defaults per vendor and model.

`accelerator` picks the backend behind hw/ (NVML, amdsmi, npu-smi and hccn_tool), the health checks, the
sampler's device source and which environment rules apply. `gpu.count` and `gpu.model` count and name the
devices whatever the vendor (an NPU is a "gpu" there); `gpu.gres` is the GRES Slurm schedules them as.
"""

from __future__ import annotations

from .schema import Bool, Float, Int, Map, Nullable, Section, Str
from .vendors import AMD, ASCEND, DEFAULT_GRES, DEFAULT_MAX_TEMP_C, NVIDIA, VENDORS

__all__ = ["AMD", "ASCEND", "DEFAULT_GRES", "DEFAULT_MAX_TEMP_C", "NVIDIA", "VENDORS"]


class EnvName(Str):
    """A variable name with one of `prefixes` (`RCCL_`, `HSA_`): upper case, digits and underscores."""

    def __init__(self, prefixes: tuple[str, ...], doc: str = ""):
        super().__init__(doc=doc)
        self.prefixes = prefixes

    def check(self, value, key, where):
        value = super().check(value, key, where)
        ok = value.replace("_", "").isalnum() and value.isupper() and value.isascii()
        if not ok or not value.startswith(self.prefixes):
            raise where.error(
                key, f"{value!r}: expected a variable name starting with {' or '.join(self.prefixes)}"
            )
        return value


ACCELERATOR = Str(
    NVIDIA,
    choices=VENDORS,
    doc="the devices' vendor: which backend reads them (NVML, amdsmi, npu-smi/hccn_tool), judges and samples "
    "them, and which communication library's settings apply (NCCL, RCCL, HCCL)",
)

GPU_GRES = Nullable(
    Str(), doc="the GRES name Slurm schedules the devices as; empty: gpu (nvidia, amd), npu (ascend)"
)

# Thresholds for AMD and Ascend devices (NVIDIA keeps health.max_gpu_temp_c and the gpu section's keys).
ACCEL = Section(
    {
        "max_temp_c": Nullable(
            Int(min=30, max=150),
            doc="above it the device is degraded; empty: amd 100 (hotspot), ascend 85 (chip)",
        ),
        "max_power_w": Nullable(Float(min=1.0), doc="above it the device is degraded; empty: not judged"),
        "health_warning": Str(
            "degraded",
            choices=("degraded", "fail"),
            doc="Ascend: npu-smi's health Warning (Alarm and Critical always fail)",
        ),
        "ecc_uncorrected": Str(
            "fail", choices=("degraded", "fail"), doc="uncorrectable ECC/RAS errors since boot"
        ),
        "ecc_corrected_max": Nullable(
            Int(min=0), doc="correctable ECC/RAS errors since boot above which degraded; empty: not judged"
        ),
        "links_down": Str("fail", choices=("degraded", "fail"), doc="AMD: an XGMI link down"),
        "hccn": Section(
            {
                "check": Bool(True, doc="Ascend: judge each NPU's on-card RoCE port through hccn_tool"),
                "require_ip": Bool(True, doc="an NPU port without an IPv4 address fails the node"),
                "net_health": Str(
                    "degraded",
                    choices=("degraded", "fail"),
                    doc="a net_health result other than Success (the port cannot reach its detect IP)",
                ),
            }
        ),
        "tools": Map(
            Str(absolute_path=True),
            doc="tool name -> absolute path (npu-smi, hccn_tool); default: found on PATH and in the vendor's "
            "install directories",
        ),
    }
)

# Huawei Ascend: HCCL's variables (docs/accelerators.md). Empty keys are left to HCCL's own defaults.
HCCL = Section(
    {
        "socket_ifname": Nullable(
            Str(), doc="HCCL_SOCKET_IFNAME (host NIC for HCCL's bootstrap); empty: fabric.socket_ifname"
        ),
        "if_ip": Bool(True, doc="HCCL_IF_IP: that interface's IPv4 address, detected on each node"),
        "connect_timeout": Nullable(
            Int(min=120, max=7200), doc="HCCL_CONNECT_TIMEOUT (s; HCCL's default 120)"
        ),
        "exec_timeout": Nullable(
            Int(min=0, max=2147483647), doc="HCCL_EXEC_TIMEOUT (s; HCCL's default 1836)"
        ),
        "buffsize": Nullable(Int(min=1, max=65536), doc="HCCL_BUFFSIZE (MB; HCCL's default 200)"),
        "rank_table": Bool(
            False,
            doc="multi-node jobs get RANK_TABLE_FILE, written on each node from the allocation and the nodes' "
            "device IPs (for frameworks that need one)",
        ),
        "env": Map(Str(), key_spec=Str(prefix="HCCL_"), doc="further HCCL_* variables, verbatim"),
    }
)

# AMD: RCCL reads the NCCL_* names (the nccl section applies as it is); these are the ROCm-specific ones.
RCCL = Section(
    {
        "fine_grain_pcie": Bool(
            True,
            doc="HSA_FORCE_FINE_GRAIN_PCIE=1 where GPUDirect RDMA is expected (nccl.net_gdr_level set on an "
            "ib/roce fabric): RCCL's RDMA from GPU memory needs it",
        ),
        "env": Map(
            Str(),
            key_spec=EnvName(("RCCL_", "HSA_", "HIP_", "ROCR_")),
            doc="further ROCm variables (RCCL_*, HSA_*, HIP_*, ROCR_*), verbatim",
        ),
    }
)


def version_keys(rule) -> dict:
    """The accelerator entries of the `versions` section, each a `rule(doc)` (profilecheck's version rule)."""
    return {
        "npu_driver": rule("Ascend NPU driver (npu-smi), e.g. 24.1.rc2"),
        "npu_firmware": rule("Ascend NPU firmware, e.g. 7.5.0.1.129"),
        "cann": rule("CANN toolkit (ascend_toolkit_install.info), e.g. 8.0.RC2"),
        "rocm": rule("ROCm, e.g. 6.2.0"),
        "amdgpu_driver": rule("amdgpu kernel driver, e.g. 6.8.5"),
    }


VERSIONS = ("npu_driver", "npu_firmware", "cann", "rocm", "amdgpu_driver")
SECTIONS = {"accelerator": ACCELERATOR, "accel": ACCEL, "hccl": HCCL, "rccl": RCCL}


def gres_name(profile) -> str:
    """The GRES a partition's devices are scheduled as (`profile`: a Profile or its validated dict)."""
    gpu = profile["gpu"] if isinstance(profile, dict) else profile.gpu
    vendor = profile["accelerator"] if isinstance(profile, dict) else profile.accelerator
    given = gpu["gres"] if isinstance(gpu, dict) else gpu.gres
    return given or DEFAULT_GRES[vendor]


def max_temp_c(profile) -> int:
    """The temperature above which an AMD or Ascend device is degraded (accel.max_temp_c, else the vendor's)."""
    given = profile.accel.max_temp_c
    return given if given is not None else DEFAULT_MAX_TEMP_C.get(profile.accelerator, 85)


def check(data: dict, where) -> None:
    """Cross-checks of the accelerator keys."""
    vendor = data["accelerator"]
    if vendor != ASCEND and data["hccl"]["rank_table"]:
        raise where.error(
            "hccl.rank_table", f"HCCL's rank table is for Ascend partitions (accelerator: {vendor})"
        )
