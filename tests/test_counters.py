"""hw/counters.py: the node counters beside the GPU samples (issue 24 §1), over sysfs/procfs trees in the
formats Linux writes, and the stand-in that advances them (`Counters`) for the sampler tests.

The trees extend tests/hwtrees.py's nodes: IB port data counters (64-bit extended, with the extended set's
`unicast_*` files beside them; or the 32-bit saturating PortCounters; or MLNX_OFED's `counters_ext`), block
devices as /sys/dev/block links into /sys/devices (NVMe with partitions, an md RAID, an LVM dm device),
/proc/self/mountinfo and mountstats (an NFS 4.2 client), and Slurm's cgroups (v2 and v1)."""

from __future__ import annotations

import os
from pathlib import Path

import hwtrees
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw import counters
from slurm_tune.hw.sysfs import Sysfs

EXTENDED = ("unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets")
NVME_PCI = "sys/devices/pci0000:5d/0000:5d:02.0/0000:5e:00.0"
NVME_DEVS = {"nvme0n1": ("259:0", "0000:5e:00.0"), "nvme1n1": ("259:3", "0000:5f:00.0")}
STAT_FIELDS = 17  # /sys/block/<d>/stat on 5.5+ kernels


def put(root: Path, rel: str, text: str) -> Path:
    return hwtrees.put(root, rel, text)


def link(root: Path, rel: str, target_rel: str) -> None:
    """A relative symlink inside the tree (as sysfs's are), so the tree can be moved."""
    path = Path(root) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    os.symlink(os.path.relpath(Path(root) / target_rel, path.parent), path)


def stat_line(sectors_read: int = 0, io_ticks_ms: int = 0, reads: int = 0) -> str:
    """A /sys/block/<d>/stat line as the kernel prints it (%8lu fields, 17 of them)."""
    fields = [0] * STAT_FIELDS
    fields[0], fields[2], fields[9] = reads, sectors_read, io_ticks_ms
    return " ".join(f"{v:8d}" for v in fields)


# ---- trees -----------------------------------------------------------------------------------------------------
def ib_node(root: Path, *, extended: bool = True, legacy_ext: bool = False) -> Path:
    """The DGX-A100 IB node of hwtrees (8 compute HCAs and the storage HCA mlx5_8, all ACTIVE HDR200), whose
    port counters are 64-bit extended ones (the kernel adds the unicast/multicast files), or the 32-bit
    PortCounters (`extended=False`), or with MLNX_OFED's `counters_ext` copies too (`legacy_ext`)."""
    hwtrees.dgx_a100_ib(root)
    for i in range(9):
        base = f"sys/class/infiniband/mlx5_{i}/ports/1"
        for name in EXTENDED if extended else ():
            put(root, f"{base}/counters/{name}", "0")
        if legacy_ext:
            put(root, f"{base}/counters_ext/port_xmit_data_64", "0")
            put(root, f"{base}/counters_ext/port_rcv_data_64", "0")
    return root


def netdev_stats(root: Path, name: str, *, speed: str = "25000", physical: bool = True) -> None:
    base = f"sys/class/net/{name}"
    put(root, f"{base}/speed", speed)
    put(root, f"{base}/statistics/tx_bytes", "0")
    put(root, f"{base}/statistics/rx_bytes", "0")
    if physical:
        pci = put(root, f"sys/devices/pci0000:00/0000:00:05.0/net/{name}/uevent", "").parent
        link(root, f"{base}/device", str(pci.parent.parent.relative_to(root)))


def block_disk(
    root: Path, name: str, majmin: str, pci: str, partitions: dict[str, str] | None = None
) -> None:
    """An NVMe namespace as sysfs shows it: the device under its PCI function, /sys/block/<name> and
    /sys/dev/block/<maj:min> links to it, a `device` link, partitions as subdirectories with `partition`."""
    dev = f"sys/devices/pci0000:5d/0000:5d:02.0/{pci}/nvme/{name[:-2]}/{name}"
    put(root, f"{dev}/stat", stat_line())
    put(root, f"{dev}/dev", majmin)
    put(root, f"sys/devices/pci0000:5d/0000:5d:02.0/{pci}/vendor", "0x144d")
    link(root, f"{dev}/device", f"sys/devices/pci0000:5d/0000:5d:02.0/{pci}/nvme/{name[:-2]}")
    link(root, f"sys/block/{name}", dev)
    link(root, f"sys/class/block/{name}", dev)
    link(root, f"sys/dev/block/{majmin}", dev)
    for part, part_dev in (partitions or {}).items():
        put(root, f"{dev}/{part}/stat", stat_line())
        put(root, f"{dev}/{part}/dev", part_dev)
        put(root, f"{dev}/{part}/partition", part[-1])
        link(root, f"sys/class/block/{part}", f"{dev}/{part}")
        link(root, f"sys/dev/block/{part_dev}", f"{dev}/{part}")


def virtual_block(root: Path, name: str, majmin: str, slaves: list[str], dm_name: str | None = None) -> None:
    """An md or dm device: /sys/devices/virtual/block/<name>, with slaves (and dm/name for LVM)."""
    dev = f"sys/devices/virtual/block/{name}"
    put(root, f"{dev}/stat", stat_line())
    put(root, f"{dev}/dev", majmin)
    if dm_name:
        put(root, f"{dev}/dm/name", dm_name)
    for slave in slaves:
        (Path(root) / dev / "slaves").mkdir(parents=True, exist_ok=True)
        link(root, f"{dev}/slaves/{slave}", f"sys/class/block/{slave}")
    link(root, f"sys/block/{name}", dev)
    link(root, f"sys/class/block/{name}", dev)
    link(root, f"sys/dev/block/{majmin}", dev)


MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
25 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw
26 22 0:24 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw
61 22 9:127 / /local/nvme rw,noatime shared:30 - xfs /dev/md127 rw,attr2,inode64,logbufs=8,logbsize=32k,noquota
62 22 253:0 / /scratch rw,noatime shared:31 - xfs /dev/mapper/vg0-scratch rw,attr2,inode64,noquota
70 22 0:52 / /datasets rw,relatime shared:40 - nfs4 10.1.0.5:/export/datasets rw,vers=4.2,rsize=1048576,\
wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.1.0.17,local_lock=none,\
addr=10.1.0.5
71 22 0:53 / /lustre rw,relatime shared:41 - lustre 10.2.0.1@o2ib:/scratch rw,flock,lazystatfs
72 22 0:45 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64
73 22 0:54 / /home/with\\040space rw,relatime shared:42 - ext4 /dev/nvme0n1p2 rw
"""


def mountstats(server_read: int = 0, normal_read: int = 0) -> str:
    """/proc/self/mountstats with one NFS 4.2 mount (fs/nfs/super.c's format) among the others."""
    return f"""\
device /dev/nvme0n1p2 mounted on / with fstype ext4
device proc mounted on /proc with fstype proc
device /dev/md127 mounted on /local/nvme with fstype xfs
device 10.1.0.5:/export/datasets mounted on /datasets with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,hard,proto=tcp,timeo=600
\tage:\t86400
\tcaps:\tcaps=0x3ffdf,wtmult=512,dtsize=32768,bsize=0,namlen=255
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t52 3076 0 27 29 35 4253 0 0 2 0 0 0 0 28 0 0 0 0 0 0 0 0 0 0 0 0
\tbytes:\t{normal_read} 0 0 0 {server_read} 0 {server_read // 4096} 0
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 1 0 29 3290 3290 0 3290 0 2 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t        READ: 2176 2176 0 316032 2281920768 18 3871 3898 0
device 10.2.0.1@o2ib:/scratch mounted on /lustre with fstype lustre
device tmpfs mounted on /dev/shm with fstype tmpfs
"""


def storage_node(root: Path) -> Path:
    """Two NVMe drives: nvme0n1 (p1 /boot/efi, p2 the root fs, p3 in md127), nvme1n1 (p1 in md127) with
    the cache tier on md127 (RAID 0), an LVM volume on nvme1n1p2 at /scratch; NFS /datasets, Lustre /lustre,
    tmpfs /dev/shm."""
    block_disk(root, "nvme0n1", "259:0", "0000:5e:00.0", {"nvme0n1p1": "259:1", "nvme0n1p2": "259:2"})
    block_disk(root, "nvme1n1", "259:3", "0000:5f:00.0", {"nvme1n1p1": "259:4", "nvme1n1p2": "259:5"})
    virtual_block(root, "md127", "9:127", ["nvme0n1p1", "nvme1n1p1"])
    virtual_block(root, "dm-0", "253:0", ["nvme1n1p2"], dm_name="vg0-scratch")
    block_disk(root, "loop0", "7:0", "0000:00:00.0")  # a loop device is never a "disk"
    put(root, counters.MOUNTINFO, MOUNTINFO)
    put(root, counters.MOUNTSTATS, mountstats())
    return root


def cgroup_v2(root: Path, job: str, usage_usec: int, cpus: str = "0-15,64-79", node: str = "") -> Path:
    base = Path(root) / "sys/fs/cgroup"
    put(root, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc")
    scope = base / "system.slice" / f"{node + '_' if node else ''}slurmstepd.scope"
    job_dir = scope / f"job_{job}"
    put(
        root,
        str((job_dir / "cpu.stat").relative_to(root)),
        f"usage_usec {usage_usec}\nuser_usec {usage_usec * 9 // 10}\nsystem_usec {usage_usec // 10}\n"
        "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0",
    )
    put(root, str((job_dir / "cpuset.cpus.effective").relative_to(root)), cpus)
    (scope / "system").mkdir(exist_ok=True)  # slurmstepd's own cgroup
    return job_dir / "cpu.stat"


def cgroup_v1(root: Path, job: str, usage_ns: int, cpus: str = "0-7", uid: str = "1000") -> Path:
    cpu = put(root, f"sys/fs/cgroup/cpu,cpuacct/slurm/uid_{uid}/job_{job}/cpuacct.usage", str(usage_ns))
    link(root, "sys/fs/cgroup/cpuacct", "sys/fs/cgroup/cpu,cpuacct")
    put(root, f"sys/fs/cgroup/cpuset/slurm/uid_{uid}/job_{job}/cpuset.cpus", cpus)
    return cpu


class Counters:
    """The stand-in for a node's traffic: advances the counters of a fixture tree in the kernel's units (IB
    data in 4-byte words, sectors of 512 bytes, io_ticks in ms, cgroup usage in us), written atomically, so a
    sampler reading it meanwhile sees one value or the next, never half a number."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.values: dict[str, int] = {}

    def _write(self, rel: str, text: str) -> None:
        path = self.root / rel
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)

    def set(self, rel: str, value: int) -> None:
        self.values[rel] = value
        self._write(rel, str(value))

    def add(self, rel: str, amount: int) -> None:
        self.set(rel, self.values.get(rel, 0) + amount)

    def ib(self, device: str, tx_bytes: int, rx_bytes: int, port: int = 1, where: str = "counters") -> None:
        base = f"sys/class/infiniband/{device}/ports/{port}/{where}"
        suffix = "_64" if where == "counters_ext" else ""
        self.add(f"{base}/port_xmit_data{suffix}", tx_bytes // 4)
        self.add(f"{base}/port_rcv_data{suffix}", rx_bytes // 4)

    def netdev(self, name: str, tx_bytes: int, rx_bytes: int) -> None:
        self.add(f"sys/class/net/{name}/statistics/tx_bytes", tx_bytes)
        self.add(f"sys/class/net/{name}/statistics/rx_bytes", rx_bytes)

    def disk(self, majmin: str, read_bytes: int, busy_ms: int) -> None:
        key = f"sys/dev/block/{majmin}/stat"
        sectors, ticks = (
            self.values.get(key + "#s", 0) + read_bytes // 512,
            self.values.get(key + "#t", 0) + busy_ms,
        )
        self.values[key + "#s"], self.values[key + "#t"] = sectors, ticks
        self._write(key, stat_line(sectors, ticks % (1 << 32), reads=sectors // 256))

    def nfs(self, read_bytes: int) -> None:
        self.values["nfs"] = self.values.get("nfs", 0) + read_bytes
        self._write(counters.MOUNTSTATS, mountstats(self.values["nfs"], self.values["nfs"]).rstrip("\n"))


# ---- parsers ----------------------------------------------------------------------------------------------------
def test_block_stat_reads_sectors_and_io_ticks_from_every_kernel_layout():
    assert counters.parse_block_stat(stat_line(4096, 250)) == (4096, 250)
    old = "   12345        7   987654     3456      100        2     800       10        0     3000     3466"
    assert counters.parse_block_stat(old) == (987654, 3000)  # 11 fields: before 4.18
    assert counters.parse_block_stat(stat_line()[: -9 * 2]) == (0, 0)  # 15 fields: 4.18-5.4
    for bad in ("", "1 2 3", stat_line().replace("0", "x", 1), "-1 " * 17, "9" * 30 + " 0" * 16, None, 42):
        assert counters.parse_block_stat(bad) is None


def test_cgroup_v2_cpu_stat_and_netdev_speed():
    assert counters.parse_cpu_stat("usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n") == 1234567
    assert (
        counters.parse_cpu_stat("user_usec 5\n") is None and counters.parse_cpu_stat("usage_usec -5") is None
    )
    assert counters.parse_speed("25000") == 25e9 / 8 and counters.parse_speed("400000") == 400e9 / 8
    for unknown in ("-1", "0", "4294967295", "", "fast", None):  # -1: no link; old kernels print -1 as u32
        assert counters.parse_speed(unknown) is None


def test_mountinfo_and_mountstats():
    mounts = counters.parse_mountinfo(MOUNTINFO)
    by_point = {m.point: m for m in mounts}
    assert by_point["/local/nvme"].dev == "9:127" and by_point["/local/nvme"].fstype == "xfs"
    assert (
        by_point["/datasets"].fstype == "nfs4" and by_point["/datasets"].source == "10.1.0.5:/export/datasets"
    )
    assert "/home/with space" in by_point  # \040 is a space
    assert counters.mount_of("/local/nvme/stune-cache/x", mounts).point == "/local/nvme"
    assert counters.mount_of("/local/nvmex", mounts).point == "/"  # a component boundary, not a prefix
    assert counters.parse_mountstats(mountstats(2281701376, 2147483648)) == {"/datasets": 2281701376}
    assert counters.parse_mountinfo("garbage\n1 2 3\n") == [] and counters.parse_mountstats("device x") == {}


# ---- deltas: wrap, saturation, reset ----------------------------------------------------------------------------
def test_a_counter_that_goes_backwards_was_reset_not_wrapped():
    sixty_four = counters.Channel("x", 4.0)
    assert counters.delta(100, 250, sixty_four) == 150
    assert counters.delta(10**12, 5, sixty_four) is None  # a reset: unmeasured, never negative
    assert counters.delta(None, 5, sixty_four) is None and counters.delta(5, None, sixty_four) is None


def test_a_32_bit_counter_wraps_only_from_its_upper_half_and_within_the_interval():
    io_ticks = counters.Channel("stat", 0.001, field=9, wrap_bits=32)
    top = (1 << 32) - 500
    assert counters.delta(top, 1500, io_ticks) == 2000  # wrapped: 500 to the top, 1500 after it
    assert counters.delta(top, 1500, io_ticks, limit=1000) is None  # more than the interval can hold
    assert counters.delta(1000, 10, io_ticks) is None  # from the lower half: a reset, not 4 GiB
    assert counters.delta(1 << 40, 5, io_ticks) is None  # not a 32-bit value at all


def test_a_saturated_32_bit_port_counter_is_unmeasured():
    narrow = counters.Channel("counters/port_xmit_data", 4.0, saturates=True)
    assert counters.delta(1000, 2000, narrow) == 1000
    assert counters.delta(4_000_000_000, counters.SATURATED_32, narrow) is None  # stuck at the top
    assert counters.delta(counters.SATURATED_32, counters.SATURATED_32, narrow) is None  # not "0 bytes"


# ---- selection ----------------------------------------------------------------------------------------------------
def test_every_active_ib_port_is_chosen_with_its_rate_and_64_bit_counters(tmp_path):
    root = ib_node(tmp_path, extended=True)
    hwtrees.put(root, "sys/class/infiniband/mlx5_3/ports/1/state", "1: DOWN")
    sel = counters.select(Sysfs(str(root)))
    assert sel.rule == "every ACTIVE IB/RoCE port"
    names = [p.name for p in sel.ports]
    assert "mlx5_3/1" not in names and names[:3] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1"] and len(names) == 8
    port = sel.ports[0]
    assert port.kind == "ib" and port.rate == 200e9 / 8
    assert port.tx.path.endswith("counters/port_xmit_data") and port.tx.scale == 4.0 and not port.tx.saturates


def test_without_the_extended_set_a_port_counter_may_be_32_bits_and_saturate(tmp_path):
    sel = counters.select(Sysfs(str(ib_node(tmp_path, extended=False))))
    assert all(p.tx.saturates and p.rx.saturates for p in sel.ports)


def test_mlnx_ofed_counters_ext_are_preferred(tmp_path):
    sel = counters.select(Sysfs(str(ib_node(tmp_path, legacy_ext=True))))
    assert sel.ports[0].tx.path.endswith("counters_ext/port_xmit_data_64") and not sel.ports[0].tx.saturates


def test_the_profile_fabric_leaves_out_the_storage_hca(tmp_path):
    root = ib_node(tmp_path)
    fabric = {"type": "ib", "hcas": [(f"mlx5_{i}", 1) for i in range(8)] + [("mlx5_12", 1)]}
    sel = counters.select(Sysfs(str(root)), fabric)
    assert sel.rule == "the profile's fabric.hcas" and len(sel.ports) == 8
    assert "mlx5_8/1" not in [p.name for p in sel.ports]  # the storage HCA: the parallel filesystem's
    assert sel.notes == ["profile HCA mlx5_12/1 has no counters on this node"]
    assert len(counters.select(Sysfs(str(root))).ports) == 9  # without a profile: every ACTIVE port


def test_roce_ports_are_roce(tmp_path):
    sel = counters.select(Sysfs(str(hwtrees.h100_roce(tmp_path))))
    assert {p.kind for p in sel.ports} == {"roce"} and len(sel.ports) == 8


def test_a_node_without_rdma_uses_its_physical_up_interfaces(tmp_path):
    root = hwtrees.vpc_tcp(tmp_path)
    netdev_stats(root, "ens5")
    hwtrees.netdev(root, "docker0")  # a bridge: up, but no device behind it
    netdev_stats(root, "docker0", physical=False)
    sel = counters.select(Sysfs(str(root)))
    assert sel.rule == "every up interface with a device" and [p.name for p in sel.ports] == ["ens5"]
    assert sel.ports[0].kind == "eth" and sel.ports[0].rate == 25e9 / 8
    assert sel.ports[0].tx.wrap_bits == counters.LONG_BITS  # unsigned long: wraps on a 32-bit kernel
    tcp = counters.select(Sysfs(str(root)), {"type": "tcp", "socket_ifname": "ens5"})
    assert tcp.rule == "the profile's fabric.socket_ifname" and [p.name for p in tcp.ports] == ["ens5"]


def test_paths_map_to_their_devices_and_unmeasured_storage_says_why(tmp_path):
    root = storage_node(tmp_path)
    paths = [
        ("/local/nvme/stune-cache", "cache"),
        ("/datasets/imagenet", "source"),
        ("/lustre/proj", "source"),
        ("/dev/shm/x", "source"),
        ("/", "source"),
        ("/scratch/run", "source"),
        ("/local/nvme/other", "source"),
    ]
    sel = counters.select(Sysfs(str(root)), paths=paths)
    devices = {d.name: d for d in sel.devices}
    assert set(devices) == {"md127", "nfs:10.1.0.5:/export/datasets", "nvme0n1p2", "dm-0"}
    md = devices["md127"]
    assert md.roles == ["cache", "source"] and md.paths == ["/local/nvme/stune-cache", "/local/nvme/other"]
    assert md.detail == "over nvme0n1p1,nvme1n1p1" and md.read.path == "sys/dev/block/9:127/stat"
    assert devices["nvme0n1p2"].detail == "partition of nvme0n1"
    assert devices["dm-0"].detail == "vg0-scratch over nvme1n1p2"
    assert devices["nfs:10.1.0.5:/export/datasets"].kind == "nfs"
    assert sel.unmeasured == [
        ("/lustre/proj", "source", "lustre-not-read"),
        ("/dev/shm/x", "source", "in-memory"),
    ]


def test_with_no_path_known_every_physical_disk_is_measured(tmp_path):
    sel = counters.select(Sysfs(str(storage_node(tmp_path))))
    assert [(d.name, d.roles) for d in sel.devices] == [("nvme0n1", ["disk"]), ("nvme1n1", ["disk"])]
    bare = counters.select(
        Sysfs(str(tmp_path / "none"))
    )  # a node tree without block devices (the dev cluster's)
    assert bare.devices == [] and bare.unmeasured == [("*", "disk", "no-device")]


def test_reading_every_channel_reads_each_file_once(tmp_path, monkeypatch):
    root = storage_node(ib_node(tmp_path))
    paths = [("/local/nvme/c", "cache"), ("/datasets", "source"), ("/", "source")]
    sysfs = Sysfs(str(root))
    sel = counters.select(sysfs, paths=paths)
    stand_in = Counters(root)
    stand_in.ib("mlx5_0", 4096, 8192)
    stand_in.disk("9:127", 1 << 20, 30)
    stand_in.nfs(5 << 20)
    opened: list[str] = []
    real = sysfs.read
    monkeypatch.setattr(sysfs, "read", lambda rel: opened.append(rel) or real(rel))
    values = counters.read(sysfs, sel.channels())
    assert (
        len(opened) == len(set(opened)) == 9 * 2 + 2 + 1
    )  # ports x 2; md127, nvme0n1p2 once each; mountstats
    assert values[:2] == [1024, 2048]  # words
    index = {id(c): i for i, c in enumerate(sel.channels())}
    md = next(d for d in sel.devices if d.name == "md127")
    assert values[index[id(md.read)]] == 2048 and values[index[id(md.busy)]] == 30
    nfs = next(d for d in sel.devices if d.kind == "nfs")
    assert values[index[id(nfs.read)]] == 5 << 20


# ---- the job's cgroup ------------------------------------------------------------------------------------------
def test_slurm_cgroup_v2_cpu_time_and_cpuset(tmp_path):
    cgroup_v2(tmp_path, "4242", 3_500_000)
    cgroup_v2(tmp_path, "4243", 10)
    sysfs = Sysfs(str(tmp_path))
    assert set(counters.cgroup_jobs(sysfs)) == {"4242", "4243"}
    cg = counters.job_cgroup(sysfs, "4242")
    assert isinstance(cg, counters.JobCgroup) and cg.version == "v2"
    assert cg.cpu_value(sysfs) * cg.cpu.scale == pytest.approx(3.5) and cg.cpus(sysfs) == 32
    assert counters.job_cgroup(sysfs, "999") == "no-cgroup"


def test_slurm_cgroup_v2_with_the_node_name_in_the_scope(tmp_path):
    cgroup_v2(tmp_path, "7", 5, node="gpu-a017")  # multiple-slurmd: <node>_slurmstepd.scope
    assert isinstance(counters.job_cgroup(Sysfs(str(tmp_path)), "7"), counters.JobCgroup)


def test_slurm_cgroup_v1_cpuacct(tmp_path):
    cgroup_v1(tmp_path, "77", 2_000_000_000)
    sysfs = Sysfs(str(tmp_path))
    cg = counters.job_cgroup(sysfs, "77")
    assert isinstance(cg, counters.JobCgroup) and cg.version == "v1"
    assert cg.cpu_value(sysfs) * cg.cpu.scale == pytest.approx(2.0) and cg.cpus(sysfs) == 8


def test_no_slurm_cgroup_is_unmeasured(tmp_path):
    """proctrack/linuxproc and task/none (the dev cluster): no job cgroup at all."""
    assert counters.cgroup_jobs(Sysfs(str(tmp_path))) == {}
    assert counters.job_cgroup(Sysfs(str(tmp_path)), "1") == "no-cgroup"


# ---- fuzz: garbage is None, never an exception -------------------------------------------------------------------
garbage = st.one_of(
    st.binary(max_size=600).map(lambda b: b.decode("utf-8", "replace")), st.text(max_size=300)
)
PARSERS = (
    counters.parse_block_stat,
    counters.parse_cpu_stat,
    counters.parse_speed,
    counters.parse_mountinfo,
    counters.parse_mountstats,
)


@settings(max_examples=300, deadline=None)
@given(garbage)
def test_the_parsers_never_raise_on_garbage(text):
    for parse in PARSERS:
        parse(text)
    counters.parse_mountinfo(MOUNTINFO[: len(text)] + text)
    counters.parse_mountstats(mountstats()[: len(text)] + text)


_FUZZ_TREE: list[Path] = []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["counters/port_xmit_data", "rate", "state", "link_layer"]))
def test_garbage_counter_files_read_as_unmeasured(tmp_path_factory, data, name):
    if not _FUZZ_TREE:  # one tree for every example: only the file under test changes
        _FUZZ_TREE.append(ib_node(tmp_path_factory.mktemp("fuzz")))
    path = _FUZZ_TREE[0] / f"sys/class/infiniband/mlx5_0/ports/1/{name}"
    kept = path.read_bytes()
    path.write_bytes(data)
    try:
        sysfs = Sysfs(str(_FUZZ_TREE[0]))
        sel = counters.select(sysfs)
        values = counters.read(sysfs, sel.channels())
    finally:
        path.write_bytes(kept)
    assert all(v is None or 0 <= v < 1 << 64 for v in values)


def test_a_live_paths_own_st_dev_names_its_device(tmp_path):
    """On a live node the path's stat() st_dev wins over the mount table's (a bind mount, another namespace)."""
    root = storage_node(tmp_path)
    mounts = counters.parse_mountinfo(MOUNTINFO)
    sysfs = Sysfs(str(root))
    assert counters.storage_of(sysfs, "/local/nvme/x", mounts).name == "md127"
    assert counters.storage_of(sysfs, "/local/nvme/x", mounts, st_dev="259:2").name == "nvme0n1p2"
    st = os.stat(tmp_path)
    live = counters.select(Sysfs("/"), paths=[(str(tmp_path), "cache")], live=True)
    for device in live.devices:  # where this machine's sysfs shows the device: the one stat() names
        assert device.read.path == f"sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    assert len(live.devices) + len(live.unmeasured) == 1
