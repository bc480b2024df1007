"""Sysfs fixture trees shaped like real nodes, in the formats Linux really writes.

Used by the hardware-layer, health and stune-sbatch detection tests. Values come from real hardware:
ConnectX-6 HDR (MT4123, board MT_0000000223, fw 20.x), ConnectX-7 (MT4129, MT_0000000838, fw 28.x),
A100-SXM4-80GB (10de:20b2) and H100 SXM5 80GB (10de:2330), DGX-style PCI addresses and NUMA layouts.
"""

from __future__ import annotations

import os
from pathlib import Path

import drifttrees

IB_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
DGX_GPU_PCI = [
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
]
DGX_HCA_PCI = [
    "0000:0c:00.0",
    "0000:12:00.0",
    "0000:4b:00.0",
    "0000:54:00.0",
    "0000:8d:00.0",
    "0000:94:00.0",
    "0000:ba:00.0",
    "0000:cc:00.0",
]
STORAGE_HCA_PCI = "0000:e1:00.0"
NUMA_CPUS = {0: "0-31,64-95", 1: "32-63,96-127"}


def put(root: Path, rel: str, text: str) -> Path:
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def gid_text(value: int) -> str:
    """128-bit GID in sysfs's form: eight groups of four hex digits."""
    h = f"{value:032x}"
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def ipv4_mapped_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return gid_text((0xFFFF << 32) | (a << 24) | (b << 16) | (c << 8) | d)


def link_local_gid(guid_low: int) -> str:
    return gid_text((0xFE80 << 112) | guid_low)


def numa(root: Path, layout: dict[int, str] = NUMA_CPUS) -> None:
    for node, cpus in layout.items():
        put(root, f"sys/devices/system/node/node{node}/cpulist", cpus)


def pci_device(
    root: Path,
    address: str,
    *,
    vendor: str,
    device: str,
    cls: str,
    numa_node: int,
    local_cpulist: str,
    link_speed: str = "16.0 GT/s PCIe",
    link_width: str = "16",
    max_link_speed: str | None = None,
    max_link_width: str | None = None,
    parent: Path | None = None,
) -> Path:
    """One PCI device, laid out as sysfs does: its directory below /sys/devices (under `parent`, a PCIe port's
    directory; default: right on its host bridge), /sys/bus/pci/devices/<address> a link to it, and its binary
    config space. Called again for the same address, it rewrites the attributes where the device is."""
    entry = Path(root) / "sys/bus/pci/devices" / address
    if entry.is_symlink() or entry.exists():
        real = entry.resolve()
    else:
        domain, bus = address.split(":")[:2]
        real = Path(parent or drifttrees.host_bridge(root, f"{domain}:{bus}")) / address
        real.mkdir(parents=True, exist_ok=True)
        drifttrees.link(root, address, real)
    if not (real / "config").exists():
        drifttrees.write_config(real, drifttrees.endpoint_config(vendor, device, cls))
    for name, value in (
        ("vendor", vendor),
        ("device", device),
        ("class", cls),
        ("numa_node", str(numa_node)),
        ("local_cpulist", local_cpulist),
        ("current_link_speed", link_speed),
        ("current_link_width", link_width),
        ("max_link_speed", max_link_speed or link_speed),
        ("max_link_width", max_link_width or link_width),
    ):
        (real / name).write_text(value + "\n")
    return real


def remove_pci(root: Path, address: str) -> None:
    """The device gone from the bus: its /sys/bus/pci/devices entry and its directory."""
    import shutil

    entry = Path(root) / "sys/bus/pci/devices" / address
    real = entry.resolve()
    entry.unlink()
    shutil.rmtree(real)


def nvswitch(root: Path, address: str) -> Path:
    """An NVSwitch as the host's PCI bus shows it (NVIDIA, "bridge: other", 10de:1af1 on HGX A100)."""
    return pci_device(
        root, address, vendor="0x10de", device="0x1af1", cls="0x068000", numa_node=-1, local_cpulist=""
    )


def gpu(
    root: Path, address: str, *, numa_node: int, model: str = "a100", parent: Path | None = None, **link
) -> Path:
    device, speed = {
        "a100": ("0x20b2", "16.0 GT/s PCIe"),
        "h100": ("0x2330", "32.0 GT/s PCIe"),
        "a10g": ("0x2237", "16.0 GT/s PCIe"),
    }[model]
    link.setdefault("link_speed", speed)
    cpus = NUMA_CPUS.get(numa_node, "") if numa_node >= 0 else ""
    return pci_device(
        root,
        address,
        vendor="0x10de",
        device=device,
        cls="0x030200",
        numa_node=numa_node,
        local_cpulist=cpus,
        parent=parent,
        **link,
    )


def netdev(
    root: Path,
    name: str,
    *,
    operstate: str = "up",
    flags: str = "0x1003",
    carrier: str = "1",
    mtu: str = "9000",
    kind: str = "1",
    address: str = "b8:59:9f:0a:1c:20",
) -> None:
    base = f"sys/class/net/{name}"
    for key, value in (
        ("operstate", operstate),
        ("flags", flags),
        ("carrier", carrier),
        ("mtu", mtu),
        ("type", kind),
        ("address", address),
    ):
        put(root, f"{base}/{key}", value)


def hca(
    root: Path,
    name: str,
    *,
    pci: str,
    numa_node: int = 0,
    ports: int = 1,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "200 Gb/sec (4X HDR)",
    link_layer: str = "InfiniBand",
    fw_ver: str = "20.31.1014",
    board_id: str = "MT_0000000223",
    hca_type: str = "MT4123",
    counters: dict[str, int] | None = None,
    netdevs: tuple[str, ...] = (),
    gids: list[tuple[str, str | None, str | None]] | None = None,
    guid: int = 0xB8599F030019C8A2,
    parent: Path | None = None,
) -> Path:
    """One HCA. `gids` lists (gid, type, ndev) per slot from index 0; by default an IB port has only its
    link-local GID. Ports beyond the first share the first one's settings."""
    base = Path(root) / "sys/class/infiniband" / name
    pci_dir = pci_device(
        root,
        pci,
        vendor="0x15b3",
        device="0x101b" if hca_type == "MT4123" else "0x1021",
        cls="0x020700" if link_layer == "InfiniBand" else "0x020000",
        numa_node=numa_node,
        local_cpulist=NUMA_CPUS.get(numa_node, ""),
        parent=parent,
    )
    for key, value in (
        ("fw_ver", fw_ver),
        ("board_id", board_id),
        ("hca_type", hca_type),
        ("node_guid", gid_text(guid)[20:]),
    ):
        put(root, f"sys/class/infiniband/{name}/{key}", value)
    base.mkdir(parents=True, exist_ok=True)
    link = base / "device"
    if not link.exists():
        os.symlink(os.path.relpath(pci_dir, base), link)
    for dev in netdevs:
        (pci_dir / "net" / dev).mkdir(parents=True, exist_ok=True)
    for port in range(1, ports + 1):
        p = f"sys/class/infiniband/{name}/ports/{port}"
        for key, value in (
            ("state", state),
            ("phys_state", phys_state),
            ("rate", rate),
            ("link_layer", link_layer),
        ):
            put(root, f"{p}/{key}", value)
        values = dict.fromkeys(IB_COUNTERS, 0)
        values.update({"port_xmit_data": 81920512, "port_rcv_data": 80216064})
        values.update(counters or {})
        for counter, value in values.items():
            put(root, f"{p}/counters/{counter}", str(value))
        table = gids if gids is not None else [(link_local_gid(guid), "IB/RoCE v1", None)]
        for index in range(max(len(table), 8)):
            gid, kind, ndev = table[index] if index < len(table) else (ZERO_GID, None, None)
            put(root, f"{p}/gids/{index}", gid)
            (Path(root) / p / "gid_attrs/types").mkdir(parents=True, exist_ok=True)
            (Path(root) / p / "gid_attrs/ndevs").mkdir(parents=True, exist_ok=True)
            if kind is not None:  # an empty slot's attribute files exist but read EINVAL on a real node
                put(root, f"{p}/gid_attrs/types/{index}", kind)
            if ndev is not None:
                put(root, f"{p}/gid_attrs/ndevs/{index}", ndev)
    return base


SWITCH_BASES = (0x00, 0x40, 0x80, 0xB0)  # the host bridges of a DGX's four GPU/HCA PCIe switches
DGX_NVSWITCH_PCI = [f"0000:{b:02x}:00.0" for b in range(0xC1, 0xC7)]  # HGX A100: six NVSwitches


def pcie_switches(root: Path, acs_ctrl: int | None = 0) -> dict[str, Path]:
    """DGX-style PCIe: four switches, each with two GPUs and the two compute HCAs beside them (GPU 2g, HCA 2g,
    GPU 2g+1, HCA 2g+1 on its downstream ports), every port's ACS Control `acs_ctrl`: the directory each of
    those devices sits in, by PCI address."""
    parents = {}
    for g, base in enumerate(SWITCH_BASES):
        ports = drifttrees.switch(root, base, 4, acs_ctrl)
        below = (DGX_GPU_PCI[2 * g], DGX_HCA_PCI[2 * g], DGX_GPU_PCI[2 * g + 1], DGX_HCA_PCI[2 * g + 1])
        parents.update(zip(below, ports))
    return parents


def dgx_a100_ib(root: Path, *, hca_overrides: dict[str, dict] | None = None) -> Path:
    """A DGX-A100-like IB HDR node: 8 GPUs and 8 compute HCAs on 2 NUMA nodes, ib0..ib7, plus the storage
    HCA mlx5_8 (ib8) that NCCL must not use; the GPUs and HCAs in pairs under four PCIe switches, six
    NVSwitches, and the host tuned as the hdr profile expects (drifttrees.host). `hca_overrides` changes one
    HCA, e.g. {"mlx5_2": {"state": "1: DOWN", "phys_state": "3: Disabled"}}."""
    root = Path(root)
    numa(root)
    parents = pcie_switches(root)
    for i, address in enumerate(DGX_GPU_PCI):
        gpu(root, address, numa_node=i // 4, model="a100", parent=parents[address])
    for i, address in enumerate([*DGX_HCA_PCI, STORAGE_HCA_PCI]):
        name = f"mlx5_{i}"
        settings = {
            "pci": address,
            "numa_node": min(i, 7) // 4,
            "netdevs": (f"ib{i}",),
            "guid": 0xB8599F0300190000 + i,
            "parent": parents.get(address),
        }
        settings.update((hca_overrides or {}).get(name, {}))
        hca(root, name, **settings)
        netdev(
            root,
            f"ib{i}",
            kind="32",
            mtu="4092",
            address=f"00:00:10:29:fe:80:00:00:00:00:00:00:b8:59:9f:03:00:19:00:0{i}",
        )
    netdev(root, "eno1", mtu="1500")
    for address in DGX_NVSWITCH_PCI:
        nvswitch(root, address)
    drifttrees.host(root)
    return root


def h100_roce(
    root: Path, *, hca_overrides: dict[str, dict] | None = None, roce_ip_base: str = "10.0.0."
) -> Path:
    """A cloud RoCE v2 node: 8 H100s, 8 ConnectX-7 ports (mlx5_0..7 bound to eth1..eth8) with real GID
    tables (v1/v2 link-local, then v1/v2 IPv4-mapped), and eth0 for the VPC; the GPUs and HCAs in pairs
    under four PCIe switches, four NVSwitches, the host tuned as the roce profile expects."""
    root = Path(root)
    numa(root)
    parents = pcie_switches(root)
    for i, address in enumerate(DGX_GPU_PCI):
        gpu(root, address, numa_node=i // 4, model="h100", parent=parents[address])
    for i, address in enumerate(DGX_HCA_PCI):
        name, dev = f"mlx5_{i}", f"eth{i + 1}"
        guid = 0x0A5C2FFFFE3B0000 + i
        ip = f"{roce_ip_base}{5 + i}"
        table = [
            (link_local_gid(guid), "IB/RoCE v1", dev),
            (link_local_gid(guid), "RoCE v2", dev),
            (ipv4_mapped_gid(ip), "IB/RoCE v1", dev),
            (ipv4_mapped_gid(ip), "RoCE v2", dev),
        ]
        settings = {
            "pci": address,
            "numa_node": i // 4,
            "link_layer": "Ethernet",
            "rate": "200 Gb/sec (4X HDR)",
            "fw_ver": "28.39.1002",
            "board_id": "MT_0000000838",
            "hca_type": "MT4129",
            "netdevs": (dev,),
            "gids": table,
            "guid": guid,
            "parent": parents[address],
        }
        settings.update((hca_overrides or {}).get(name, {}))
        hca(root, name, **settings)
        netdev(root, dev, mtu="4200", address=f"0a:5c:2f:3b:00:0{i}")
    netdev(root, "eth0", mtu="9001")
    for address in DGX_NVSWITCH_PCI[:4]:  # HGX H100: four NVSwitches
        nvswitch(root, address)
    drifttrees.host(root)
    return root


def vpc_tcp(root: Path, *, gpus: int = 4, numa_node: int = -1) -> Path:
    """A cloud VM without RDMA: one ENA interface ens5, A10G GPUs, and (as in most VMs) no NUMA info, no
    NVSwitch and no fabric manager."""
    root = Path(root)
    numa(root, {0: "0-47"})
    drifttrees.host(root, fabricmanager=False)
    for i in range(gpus):
        gpu(root, f"0000:00:{0x1B + i:02x}.0", numa_node=numa_node, model="a10g")
    netdev(root, "ens5", mtu="9001")
    netdev(root, "lo", operstate="unknown", flags="0x9", kind="772")
    return root


def kmsg(root: Path, records: list[str]) -> Path:
    """A kernel-log copy in /dev/kmsg record form (`prio,seq,usec,flags;message`)."""
    return put(root, "dev/kmsg", "\n".join(records))


def boot_id(root: Path, value: str = "3b2f0c5e-8d1a-4f6b-9c2e-7a5d4e1f0b93") -> Path:
    """/proc/sys/kernel/random/boot_id: a new one after every reboot."""
    return put(root, "proc/sys/kernel/random/boot_id", value)
