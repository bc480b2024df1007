"""Fixture pieces for the tuning-drift tests, in the formats Linux really writes: PCI config space (binary,
little-endian, as /sys/bus/pci/devices/<address>/config shows it to root), the PCIe switch hierarchy under
/sys/devices, and the host settings under /proc and /sys (/proc/modules, /proc/<pid>/limits, cpufreq,
transparent huge pages, NUMA balancing, sysctls, IOMMU groups).

hwtrees.py's node builders call these so every standard tree is tuned as its profile expects."""

from __future__ import annotations

import os
import struct
from pathlib import Path

ACS_CAP_DEFAULT = 0x005F  # SV TB RR CR UF DT: what a Broadcom PEX/Microchip switch port implements
ACS_LINUX = 0x001D  # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+: what Linux enables with an IOMMU
# Ext capability IDs (PCIe base spec): AER, ACS, power budgeting, LTR
AER, ACS, POWER_BUDGET, LTR = 0x0001, 0x000D, 0x0004, 0x0018

# /proc/modules of a DGX-like node (format: name size refcount deps state address [taint])
MODULES = [
    ("nvidia_peermem", 16384, 0, "-"),
    ("nvidia_uvm", 1437696, 0, "-"),
    ("nvidia_drm", 77824, 0, "-"),
    ("nvidia_modeset", 1314816, 1, "nvidia_drm,"),
    ("nvidia", 56725504, 3, "nvidia_peermem,nvidia_uvm,nvidia_modeset,"),
    ("ib_umad", 36864, 0, "-"),
    ("mlx5_ib", 446464, 0, "-"),
    ("ib_uverbs", 163840, 3, "nvidia_peermem,rdma_ucm,mlx5_ib,"),
    ("ib_core", 434176, 8, "rdma_ucm,ib_ipoib,ib_umad,rdma_cm,iw_cm,mlx5_ib,ib_uverbs,ib_cm,"),
    ("mlx5_core", 2043904, 1, "mlx5_ib,"),
]
LIMITS = [  # /proc/<pid>/limits: (name, soft, hard, units), as a systemd-started slurmd shows them
    ("Max cpu time", "unlimited", "unlimited", "seconds"),
    ("Max file size", "unlimited", "unlimited", "bytes"),
    ("Max data size", "unlimited", "unlimited", "bytes"),
    ("Max stack size", "8388608", "unlimited", "bytes"),
    ("Max core file size", "0", "unlimited", "bytes"),
    ("Max resident set", "unlimited", "unlimited", "bytes"),
    ("Max processes", "2061175", "2061175", "processes"),
    ("Max open files", "131072", "131072", "files"),
    ("Max locked memory", "MEMLOCK_SOFT", "MEMLOCK_HARD", "bytes"),
    ("Max address space", "unlimited", "unlimited", "bytes"),
    ("Max file locks", "unlimited", "unlimited", "locks"),
    ("Max pending signals", "2061175", "2061175", "signals"),
    ("Max msgqueue size", "819200", "819200", "bytes"),
    ("Max nice priority", "0", "0", ""),
    ("Max realtime priority", "0", "0", ""),
    ("Max realtime timeout", "unlimited", "unlimited", "us"),
]
SYSCTLS = {  # Debian 12 defaults
    "net/core/rmem_max": "212992",
    "net/core/wmem_max": "212992",
    "net/core/netdev_max_backlog": "1000",
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
    "net/ipv4/tcp_wmem": "4096\t16384\t4194304",
    "net/ipv4/tcp_mtu_probing": "0",
    "vm/zone_reclaim_mode": "0",
    "vm/swappiness": "60",
    "vm/max_map_count": "65530",
}
SLURMD_PID, FABRICMANAGER_PID = 2187, 1934


def put(root: Path, rel: str, text: str) -> Path:
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


# ---- PCI config space -----------------------------------------------------------------------------------


def ext_cap(cap_id: int, body: bytes, version: int = 1) -> tuple[int, int, bytes]:
    return cap_id, version, body


def acs_cap(ctrl: int, cap: int = ACS_CAP_DEFAULT) -> tuple[int, int, bytes]:
    """The ACS extended capability's registers after its header: ACS Capability (16 bits), ACS Control."""
    return ACS, 1, struct.pack("<HH", cap, ctrl)


def config_space(
    vendor: int,
    device: int,
    class_code: int,
    *,
    bridge: bool = False,
    caps: list[tuple[int, int, bytes]] | None = None,
    pcie: bool = True,
    size: int = 4096,
) -> bytes:
    """A config space: the standard header (type 1 for a bridge), a power-management and (when `pcie`) a PCI
    Express capability, and the extended capabilities `caps` chained from 0x100 (AER first, as on real
    ports), each at a dword-aligned offset."""
    data = bytearray(4096)
    struct.pack_into("<HHHH", data, 0, vendor, device, 0x0406, 0x0010)  # command; status: capability list
    struct.pack_into("<I", data, 0x08, (class_code << 8) | 0x01)  # class code over the revision id
    data[0x0E] = 0x01 if bridge else 0x00
    data[0x34] = 0x40
    data[0x40:0x42] = bytes([0x01, 0x60 if pcie else 0x00])  # power management, then PCIe
    if pcie:
        data[0x60:0x62] = bytes([0x10, 0x00])
        data[0x62] = 0x02 | ((0x6 if bridge else 0x0) << 4)  # version 2; downstream port / endpoint
    chain = [ext_cap(AER, bytes(0x44), 2), *(caps or [])] if pcie else []
    at = 0x100
    for i, (cap_id, version, body) in enumerate(chain):
        nxt = (at + 4 + len(body) + 3) & ~3 if i + 1 < len(chain) else 0
        struct.pack_into("<I", data, at, cap_id | (version << 16) | (nxt << 20))
        data[at + 4 : at + 4 + len(body)] = body
        at = nxt
    return bytes(data[:size])


def endpoint_config(vendor: str, device: str, cls: str) -> bytes:
    """A GPU's or NIC's config: AER, power budgeting, LTR; no ACS (a single-function endpoint has none)."""
    caps = [ext_cap(POWER_BUDGET, bytes(12)), ext_cap(LTR, bytes(4))]
    return config_space(int(vendor, 16), int(device, 16), int(cls, 16), caps=caps)


def bridge_config(acs_ctrl: int | None, device: int = 0xC010) -> bytes:
    """A PCIe switch port (Broadcom PEX 89xxx, 1000:c010) or root port with an ACS capability whose Control
    register is `acs_ctrl` (None: the port has no ACS capability)."""
    caps = [acs_cap(acs_ctrl)] if acs_ctrl is not None else []
    return config_space(0x1000, device, 0x060400, bridge=True, caps=[*caps, ext_cap(LTR, bytes(4))])


def write_config(device_dir: Path, data: bytes) -> None:
    (Path(device_dir) / "config").write_bytes(data)


def pci_dir(root: Path, address: str) -> Path:
    """The real directory of a device (what /sys/bus/pci/devices/<address> links to)."""
    return (Path(root) / "sys/bus/pci/devices" / address).resolve()


def set_acs(root: Path, address: str, ctrl: int | None) -> None:
    write_config(pci_dir(root, address), bridge_config(ctrl))


def bridge(root: Path, parent: Path, address: str, acs_ctrl: int | None = 0) -> Path:
    """A PCIe port under `parent` (a host bridge's directory or another port's)."""
    path = Path(parent) / address
    path.mkdir(parents=True, exist_ok=True)
    for name, value in (("vendor", "0x1000"), ("device", "0xc010"), ("class", "0x060400")):
        (path / name).write_text(value + "\n")
    write_config(path, bridge_config(acs_ctrl))
    link(root, address, path)
    return path


def link(root: Path, address: str, real: Path) -> None:
    bus = Path(root) / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    entry = bus / address
    if not entry.is_symlink() and not entry.exists():
        os.symlink(os.path.relpath(real, bus), entry)


def host_bridge(root: Path, domain_bus: str) -> Path:
    """/sys/devices/pci<domain>:<bus>, e.g. domain_bus '0000:40'."""
    path = Path(root) / "sys/devices" / f"pci{domain_bus}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def switch(root: Path, base: int, ports: int, acs_ctrl: int | None = 0) -> list[Path]:
    """Root port 0000:<base>:01.1 on host bridge pci0000:<base>, a switch's upstream port below it and
    `ports` downstream ports: their directories, for the endpoints below them."""
    top = host_bridge(root, f"0000:{base:02x}")
    rp = bridge(root, top, f"0000:{base:02x}:01.1", acs_ctrl)
    up = bridge(root, rp, f"0000:{base + 1:02x}:00.0", None)  # upstream ports have no ACS
    return [bridge(root, up, f"0000:{base + 2:02x}:{i:02x}.0", acs_ctrl) for i in range(ports)]


def iommu_group(root: Path, address: str, group: int, kind: str = "identity") -> None:
    """The device in IOMMU group `group` of type `kind` (identity: passthrough; DMA, DMA-FQ: translated)."""
    g = Path(root) / "sys/kernel/iommu_groups" / str(group)
    g.mkdir(parents=True, exist_ok=True)
    (g / "type").write_text(kind + "\n")
    dev = pci_dir(root, address)
    target = dev / "iommu_group"
    if target.is_symlink():
        target.unlink()
    os.symlink(os.path.relpath(g, dev), target)
    (Path(root) / "sys/class/iommu/dmar0").mkdir(parents=True, exist_ok=True)


# ---- host settings ----------------------------------------------------------------------------------------


def modules_text(names_out: tuple[str, ...] = ()) -> str:
    return "\n".join(
        f"{name} {size} {refs} {deps} Live 0xffffffffc{i:04x}000 (POE)"
        for i, (name, size, refs, deps) in enumerate(MODULES)
        if name not in names_out
    )


def limits_text(soft: str = "unlimited", hard: str = "unlimited") -> str:
    lines = [f"{'Limit':<25} {'Soft Limit':<20} {'Hard Limit':<20} {'Units':<10}"]
    for name, s, h, unit in LIMITS:
        s = soft if s == "MEMLOCK_SOFT" else s
        h = hard if h == "MEMLOCK_HARD" else h
        lines.append(f"{name:<25} {s:<20} {h:<20} {unit:<10}")
    return "\n".join(lines)


def process(root: Path, pid: int, comm: str, limits: str | None = None) -> None:
    put(root, f"proc/{pid}/comm", comm)
    if limits is not None:
        put(root, f"proc/{pid}/limits", limits)


def host(
    root: Path,
    *,
    gdr_module: bool = True,
    governor: str = "performance",
    policies: int = 8,
    thp: str = "always [madvise] never",
    numa_balancing: str = "0",
    memlock: tuple[str, str] = ("unlimited", "unlimited"),
    fabricmanager: bool = True,
) -> Path:
    """The host settings of a node tuned for RDMA training; each one can be set to a drifted value."""
    root = Path(root)
    put(root, "proc/modules", modules_text(() if gdr_module else ("nvidia_peermem",)))
    put(root, "proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.1.0-18-amd64 root=/dev/md0 ro quiet")
    for i in range(policies):
        put(root, f"sys/devices/system/cpu/cpufreq/policy{i}/scaling_governor", governor)
    put(root, "sys/kernel/mm/transparent_hugepage/enabled", thp)
    put(root, "proc/sys/kernel/numa_balancing", numa_balancing)
    for name, value in SYSCTLS.items():
        put(root, f"proc/sys/{name}", value)
    process(root, 1, "systemd")
    process(root, SLURMD_PID, "slurmd", limits_text(*memlock))
    if fabricmanager:
        process(root, FABRICMANAGER_PID, "nv-fabricmanage")
    return root
