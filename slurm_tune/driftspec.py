"""The profile's `drift` section: the host settings a partition's nodes are tuned to (health/drift.py judges
them), with defaults per fabric. Loaded with the schema only (profilecheck.py: a profile cache miss).

A key the profile (or site.yaml) sets wins; a key it leaves out takes its fabric's default from
FABRIC_DEFAULTS, else the schema's; `~` (null) switches a check off. docs/health.md, "Tuning drift", has the
table.
"""

from __future__ import annotations

from .schema import Bool, Int, List, Map, Nullable, Section, Str

IOMMU_MODES = ("off", "passthrough", "translated")
THP_MODES = ("always", "madvise", "never")
SYSCTL_MAX = 64  # names a profile may list
_SYSCTL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./")


class SysctlName(Str):
    """`net.core.rmem_max` (dots, as sysctl(8) writes them) or `net/ipv4/conf/eth0.100/rp_filter` (slashes,
    for names with a dot in a component): a path below /proc/sys, nothing that could leave it."""

    def check(self, value, key, where):
        value = super().check(value, key, where)
        parts = value.split("/" if "/" in value else ".")
        if (
            len(value) > 200
            or not set(value) <= _SYSCTL_CHARS
            or any(p in ("", ".", "..") for p in parts)
            or len(parts) < 2
        ):
            raise where.error(key, f"{value!r} is not a sysctl name (e.g. net.core.rmem_max)")
        return value


class SysctlValue(Str):
    """The value expected: the text sysctl(8) shows (`1`, `4096 87380 6291456`), or `>=N` for a floor."""

    def check(self, value, key, where):
        value = super().check(value, key, where)
        if value.startswith(">="):
            floor = value[2:].strip()
            if not floor.isascii() or not floor.isdigit() or len(floor) > 20:
                raise where.error(key, f"{value!r}: `>=` needs a whole number, e.g. '>=67108864'")
        elif len(value) > 200 or "\n" in value:
            raise where.error(key, f"{value!r} is not a sysctl value (one line, at most 200 characters)")
        return value


class SysctlMap(Map):
    def check(self, value, key, where):
        out = super().check(value, key, where)
        if len(out) > SYSCTL_MAX:
            raise where.error(key, f"{len(out)} sysctls: at most {SYSCTL_MAX}")
        return out


DRIFT = Section(
    {
        "gdr_module": Bool(
            True,
            doc="where GPUDirect RDMA is expected (an ib/roce fabric with nccl.net_gdr_level set, not LOC), "
            "nvidia-peermem (or nv_peer_mem) must be loaded",
        ),
        "pcie_acs": Bool(
            True,
            doc="where GPUDirect RDMA is expected, no ACS P2P redirect on the PCIe path between a GPU and a "
            "fabric HCA that share a switch",
        ),
        "iommu": Nullable(
            List(Str(choices=IOMMU_MODES), min_items=1, unique=True),
            doc="the IOMMU modes allowed for the GPUs and fabric HCAs (off, passthrough, translated); "
            "default per fabric",
        ),
        "cpu_governor": Nullable(Str(), doc="every cpufreq policy's scaling_governor; default per fabric"),
        "thp": Nullable(
            List(Str(choices=THP_MODES), min_items=1, unique=True),
            default=["always", "madvise"],
            doc="transparent huge pages modes allowed (/sys/kernel/mm/transparent_hugepage/enabled)",
        ),
        "numa_balancing": Nullable(
            Bool(), doc="kernel.numa_balancing on (true) or off (false); default per fabric"
        ),
        "slurmd_memlock": Bool(
            False,
            doc="slurmd's locked-memory limit (soft and hard) must be unlimited (RDMA registers memory); "
            "default per fabric",
        ),
        "fabricmanager": Bool(True, doc="on a node with NVSwitches on the PCI bus, nv-fabricmanager runs"),
        "gpu_power_limit_w": Nullable(Int(min=1, max=5000), doc="each GPU's enforced power limit (W)"),
        "gpu_sm_clock_mhz": Nullable(Int(min=1, max=10000), doc="each GPU's SM application clock (MHz)"),
        "gpu_mem_clock_mhz": Nullable(Int(min=1, max=50000), doc="each GPU's memory application clock (MHz)"),
        "roce_mtu_min": Nullable(
            Int(min=576, max=65535), doc="RoCE: lowest MTU of each fabric HCA's netdev; default per fabric"
        ),
        "sysctls": SysctlMap(
            SysctlValue(nonempty=False),
            key_spec=SysctlName(),
            doc="sysctl name -> the value expected (`>=N`: at least N), e.g. net.core.rmem_max: '>=67108864'",
        ),
    }
)

# What a fabric's nodes are tuned to when the profile does not say. RDMA fabrics are self-built or bare-metal
# clusters: CPUs at full clock, no NUMA page migration under the job, untranslated DMA, an unlimited memlock
# for slurmd (whose limit the job's RDMA registrations inherit), jumbo frames for RoCE's 4096-byte MTU (4096 +
# RoCEv2 headers). A tcp fabric is mostly a cloud VM, whose hypervisor owns CPU frequency and the IOMMU.
FABRIC_DEFAULTS: dict[str, dict] = {
    "ib": {
        "iommu": ["off", "passthrough"],
        "cpu_governor": "performance",
        "numa_balancing": False,
        "slurmd_memlock": True,
        "roce_mtu_min": None,
    },
    "roce": {
        "iommu": ["off", "passthrough"],
        "cpu_governor": "performance",
        "numa_balancing": False,
        "slurmd_memlock": True,
        "roce_mtu_min": 4200,
    },
    "tcp": {
        "iommu": None,
        "cpu_governor": None,
        "numa_balancing": None,
        "slurmd_memlock": False,
        "roce_mtu_min": None,
    },
}


def with_fabric_defaults(merged: dict) -> dict:
    """`merged` (a profile over site.yaml, checked, not yet completed) with the drift keys it leaves out set
    to its fabric's defaults."""
    fabric = merged.get("fabric")
    defaults = FABRIC_DEFAULTS.get(str(fabric.get("type")) if isinstance(fabric, dict) else "")
    if not defaults:
        return merged  # a missing fabric type is the schema's error, reported by complete()
    drift = merged.get("drift")
    drift = dict(drift) if isinstance(drift, dict) else {}
    for key, value in defaults.items():
        drift.setdefault(key, list(value) if isinstance(value, list) else value)
    return {**merged, "drift": drift}
