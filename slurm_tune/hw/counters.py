"""Node counters beside the GPU samples (issue 24 §1): bytes on the network ports, reads of the block devices
and NFS mounts behind the cache tier and the dataset sources, and a job's CPU time from its Slurm cgroup. Every
path is under the relocatable sysfs root (hw/sysfs.py), /proc included.

`select()` decides once what to read (a `Selection` of `Channel`s: one counter each); `read()` reads every
channel, each file once; `delta()` turns two readings into an increment, None where the interval cannot be
measured. The parse_* functions are pure and give None for anything they do not recognise.

What the kernel means (drivers/infiniband/core/sysfs.c and the mlx4/mlx5 PMA code, block/genhd.c,
fs/nfs/super.c, Slurm's cgroup/v1 and cgroup/v2 plugins):
- IB/RoCE `ports/<p>/counters/port_{xmit,rcv}_data` count octets divided by 4. The file is the 64-bit
  PortCountersExtended value where the HCA has it (the kernel then puts `unicast_xmit_packets` beside it),
  else the 32-bit PortCounters one, which *saturates* at 2^32-1 (IB spec; the drivers' ASSIGN_32BIT_COUNTER):
  a saturated reading is unmeasured. Old MLNX_OFED/mlx4 kernels give 64-bit copies in
  `counters_ext/port_{xmit,rcv}_data_64` (preferred). Ports without PMA counters (EFA) count bytes in
  `hw_counters/{tx,rx}_bytes`. `rate` ("200 Gb/sec (4X HDR)") is the port's line rate.
- A netdev's `statistics/{tx,rx}_bytes` and a block device's sectors are `unsigned long`: 64 bits on a 64-bit
  kernel, 32 (wrapping) on a 32-bit one. `/sys/block/<d>/stat` field 3 is sectors read, 512 bytes each
  whatever the device's block size; field 10, io_ticks, is milliseconds busy, 32 bits wide on every kernel
  (it wraps after 49.7 days). `speed` is Mb/s, -1 when unknown.
- NFS: `/proc/self/mountstats` `bytes:` normalread normalwrite directread directwrite serverread ...:
  serverreadbytes is what the server sent (read-ahead included), the load on the storage.
- cgroup v2: `sys/fs/cgroup/system.slice/[<node>_]slurmstepd.scope/job_<id>/cpu.stat` usage_usec and
  `cpuset.cpus.effective`; v1: `sys/fs/cgroup/cpuacct/slurm[_<node>]/uid_<uid>/job_<id>/cpuacct.usage` (ns)
  and `sys/fs/cgroup/cpuset/.../cpuset.cpus`.
A counter that goes backwards was reset (a driver reload, a counter clear): that interval is unmeasured, never
negative and never a wrap's 4 GiB. A wrap is taken only for a counter known to wrap, from its upper half.
"""

from __future__ import annotations

import os
import sys

from ..text import is_digits
from . import sysfs as sf
from .sysfs import IB_CLASS, NET_CLASS, Sysfs, parse_counter

LONG_BITS = 64 if sys.maxsize > 1 << 32 else 32  # the kernel's unsigned long, as this interpreter's
SATURATED_32 = (1 << 32) - 1
BLOCK = "sys/block"
DEV_BLOCK = "sys/dev/block"
CGROUP = "sys/fs/cgroup"
MOUNTINFO = "proc/self/mountinfo"
MOUNTSTATS = "proc/self/mountstats"
NFS_TYPES = ("nfs", "nfs4")
MEMORY_TYPES = ("tmpfs", "ramfs", "devtmpfs", "hugetlbfs")
VIRTUAL_DISKS = ("loop", "ram", "zram", "fd", "sr", "nbd")
TEXT_MAX = 1 << 20  # the longest mountinfo / mountstats text parsed (a node with thousands of mounts)
ESCAPES = {"\\040": " ", "\\011": "\t", "\\012": "\n", "\\134": "\\"}


class Channel:
    """One counter: `path` (relative to the root) and how to take the value out of it (`field`: None for a
    plain number, an int for a whitespace-separated field of a stat line, `nfs:<mount point>` for mountstats),
    `scale` (bytes, or seconds, per unit), `wrap_bits` (0: never wraps, backwards is a reset) and whether a
    2^32-1 reading is a saturated 32-bit counter."""

    __slots__ = ("field", "path", "saturates", "scale", "wrap_bits")

    def __init__(self, path: str, scale: float = 1.0, *, field=None, wrap_bits: int = 0, saturates=False):
        self.path, self.scale, self.field = path, scale, field
        self.wrap_bits, self.saturates = wrap_bits, saturates


class Port:
    """A network port: name (`mlx5_0/1`, `eth0`), kind (ib, roce, rdma, eth), line rate in bytes/s (None:
    unknown), and its tx and rx channels (bytes)."""

    __slots__ = ("kind", "name", "rate", "rx", "tx")

    def __init__(self, name: str, kind: str, rate: float | None, tx: Channel, rx: Channel):
        self.name, self.kind, self.rate, self.tx, self.rx = name, kind, rate, tx, rx


class Device:
    """Storage: name (`nvme0n1p2`, `nfs:srv:/export`), kind (block, nfs), roles (cache, source, disk), the
    paths it serves, a detail (partition of, dm over), and its read-bytes and busy-seconds channels."""

    __slots__ = ("busy", "detail", "kind", "name", "paths", "read", "roles")

    def __init__(self, name: str, kind: str, read: Channel, busy: Channel | None = None, detail: str = ""):
        self.name, self.kind, self.read, self.busy, self.detail = name, kind, read, busy, detail
        self.roles: list[str] = []
        self.paths: list[str] = []


class Selection:
    """What the sampler reads on this node: ports (and the rule that chose them), storage devices, storage
    that cannot be measured (path, role, reason code), and notes (a profile HCA that is not here...)."""

    __slots__ = ("devices", "notes", "ports", "rule", "unmeasured")

    def __init__(self):
        self.ports: list[Port] = []
        self.rule = ""
        self.devices: list[Device] = []
        self.unmeasured: list[tuple[str, str, str]] = []
        self.notes: list[str] = []

    def channels(self) -> list[Channel]:
        """Every channel in a fixed order: per port tx, rx; per device read, busy (when it has one)."""
        out = [c for p in self.ports for c in (p.tx, p.rx)]
        out += [c for d in self.devices for c in (d.read, d.busy) if c is not None]
        return out


# ---- parsers (pure; None for anything unrecognised) -----------------------------------------------------------
def parse_block_stat(text: str | None) -> tuple[int, int] | None:
    """`/sys/block/<d>/stat` -> (sectors read, io_ticks ms). 11 fields (old kernels) to 17 (5.5+)."""
    if not isinstance(text, str) or len(text) > 4096:
        return None
    fields = text.split()
    if not 11 <= len(fields) <= 32 or not all(len(f) <= 20 and is_digits(f) for f in fields):
        return None
    return int(fields[2]), int(fields[9])


def parse_cpu_stat(text: str | None) -> int | None:
    """cgroup v2 `cpu.stat` -> usage_usec."""
    if not isinstance(text, str) or len(text) > 65536:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return parse_counter(value)
    return None


def parse_speed(text: str | None) -> float | None:
    """A netdev's `speed` (Mb/s) -> bytes/s; None for -1, 0 and anything else unknown."""
    value = sf.parse_int(text)
    if value is None or not 0 < value < SATURATED_32:
        return None
    return value * 1e6 / 8


def _unescape(text: str) -> str:
    if "\\" in text:
        for code, char in ESCAPES.items():
            text = text.replace(code, char)
    return text


class Mount:
    __slots__ = ("dev", "fstype", "point", "source")

    def __init__(self, point: str, dev: str, fstype: str, source: str):
        self.point, self.dev, self.fstype, self.source = point, dev, fstype, source


def parse_mountinfo(text: str | None) -> list[Mount]:
    """`/proc/self/mountinfo` -> mounts in file order (later ones shadow earlier ones); bad lines skipped.
    `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw` has point /mnt2, dev 98:0, ext3."""
    out: list[Mount] = []
    if not isinstance(text, str):
        return out
    for line in text[:TEXT_MAX].splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        dev = fields[2]
        major, colon, minor = dev.partition(":")
        if not colon or not is_digits(major) or not is_digits(minor) or len(fields) < sep + 3:
            continue
        point = _unescape(fields[4])
        if point.startswith("/"):
            out.append(Mount(point, dev, fields[sep + 1], _unescape(fields[sep + 2])))
    return out


def parse_mountstats(text: str | None) -> dict[str, int]:
    """`/proc/self/mountstats` -> {mount point: serverreadbytes} of its NFS mounts."""
    out: dict[str, int] = {}
    if not isinstance(text, str):
        return out
    point = None
    for line in text[:TEXT_MAX].splitlines():
        if line.startswith("device "):
            words = line.split(" ")
            point = None
            if len(words) >= 8 and words[2:4] == ["mounted", "on"] and words[5:7] == ["with", "fstype"]:
                point = _unescape(words[4]) if words[7] in NFS_TYPES else None
        elif point is not None and line.strip().startswith("bytes:"):
            fields = line.split()[1:]
            value = parse_counter(fields[4]) if len(fields) >= 8 else None
            if value is not None:
                out[point] = value
            point = None
    return out


def delta(prev: int | None, cur: int | None, channel: Channel, limit: float | None = None) -> int | None:
    """The increment between two readings of `channel`; None when either is missing, a 32-bit counter sits
    saturated, or the counter went backwards and this is not a wrap (a reset: unmeasured). `limit` (units):
    the most the interval can hold; a wrap beyond it is a reset too."""
    if prev is None or cur is None:
        return None
    if channel.saturates and (cur == SATURATED_32 or prev == SATURATED_32):
        return None
    if cur >= prev:
        return cur - prev
    bits = channel.wrap_bits
    if bits and prev >> (bits - 1) == 1 and cur < prev and prev < 1 << bits:
        wrapped = cur + (1 << bits) - prev
        if limit is None or wrapped <= limit:
            return wrapped
    return None


# ---- reading --------------------------------------------------------------------------------------------------
def read(sysfs: Sysfs, channels: list[Channel]) -> list[int | None]:
    """One reading of every channel, in order; each file read and parsed once (a block stat's two fields,
    every NFS mount from one mountstats read)."""
    parsed: dict[str, object] = {}
    out: list[int | None] = []
    for ch in channels:
        if ch.path not in parsed:
            text = sysfs.read(ch.path)
            if ch.field is None:
                parsed[ch.path] = parse_counter(text)
            elif isinstance(ch.field, int):
                parsed[ch.path] = parse_block_stat(text)
            else:
                parsed[ch.path] = parse_mountstats(text)
        value = parsed[ch.path]
        if isinstance(value, tuple):  # (sectors read, io_ticks)
            out.append(value[0] if ch.field == 2 else value[1])
        elif isinstance(value, dict):
            out.append(value.get(str(ch.field)[4:]))
        else:
            out.append(value if isinstance(value, int) else None)
    return out


# ---- selection: network -----------------------------------------------------------------------------------------
def _ib_port(sysfs: Sysfs, device: str, port: str) -> Port | None:
    base = f"{IB_CLASS}/{device}/ports/{port}"
    if sysfs.exists(f"{base}/counters_ext/port_xmit_data_64"):
        tx = Channel(f"{base}/counters_ext/port_xmit_data_64", 4.0)
        rx = Channel(f"{base}/counters_ext/port_rcv_data_64", 4.0)
    elif sysfs.exists(f"{base}/counters/port_xmit_data"):
        narrow = not sysfs.exists(f"{base}/counters/unicast_xmit_packets")  # no extended set: maybe 32 bits
        tx = Channel(f"{base}/counters/port_xmit_data", 4.0, saturates=narrow)
        rx = Channel(f"{base}/counters/port_rcv_data", 4.0, saturates=narrow)
    elif sysfs.exists(f"{base}/hw_counters/tx_bytes"):
        tx, rx = Channel(f"{base}/hw_counters/tx_bytes"), Channel(f"{base}/hw_counters/rx_bytes")
    else:
        return None
    layer = (sysfs.read(f"{base}/link_layer") or "").lower()
    kind = {"infiniband": "ib", "ethernet": "roce"}.get(layer, "rdma")
    gbps = sf.parse_rate_gbps(sysfs.read(f"{base}/rate"))
    return Port(f"{device}/{port}", kind, gbps * 1e9 / 8 if gbps else None, tx, rx)


def _netdev_port(sysfs: Sysfs, name: str) -> Port:
    base = f"{NET_CLASS}/{name}"
    tx = Channel(f"{base}/statistics/tx_bytes", wrap_bits=LONG_BITS)
    rx = Channel(f"{base}/statistics/rx_bytes", wrap_bits=LONG_BITS)
    return Port(name, "eth", parse_speed(sysfs.read(f"{base}/speed")), tx, rx)


def _active(sysfs: Sysfs, device: str, port: str) -> bool:
    state = sf.parse_port_state(sysfs.read(f"{IB_CLASS}/{device}/ports/{port}/state"))
    return state is not None and state[0] == 4


def select_ports(sysfs: Sysfs, fabric: dict | None, sel: Selection) -> None:
    """The rule: the profile's fabric where the sampler has one (its `hcas` on ib/roce partitions, its
    `socket_ifname` on tcp ones); else every ACTIVE IB/RoCE port; else every up interface backed by a device
    (not loopback, bridge, veth or bond), or every up non-loopback one when none is."""
    fabric = fabric or {}
    if fabric.get("type") in ("ib", "roce") and fabric.get("hcas"):
        for device, port in fabric["hcas"]:
            found = _ib_port(sysfs, device, str(port))
            if found is None:
                sel.notes.append(f"profile HCA {device}/{port} has no counters on this node")
            else:
                sel.ports.append(found)
        if sel.ports:
            sel.rule = "the profile's fabric.hcas"
            return
    if fabric.get("type") == "tcp" and fabric.get("socket_ifname"):
        name = fabric["socket_ifname"]
        if sysfs.exists(f"{NET_CLASS}/{name}/statistics/tx_bytes"):
            sel.ports.append(_netdev_port(sysfs, name))
            sel.rule = "the profile's fabric.socket_ifname"
            return
        sel.notes.append(f"profile socket interface {name} is not on this node")
    for device in sysfs.ib_devices():
        for port in sysfs.ib_ports(device):
            found = _ib_port(sysfs, device, port) if _active(sysfs, device, port) else None
            if found is not None:
                sel.ports.append(found)
    if sel.ports:
        sel.rule = "every ACTIVE IB/RoCE port"
        return
    up = [n for n in sysfs.netdevs() if n != "lo" and sf.netdev_is_up(sysfs.netdev(n))]
    up = [n for n in up if sysfs.read(f"{NET_CLASS}/{n}/type") != "772"]  # ARPHRD_LOOPBACK
    physical = [n for n in up if sysfs.exists(f"{NET_CLASS}/{n}/device")]
    sel.ports.extend(_netdev_port(sysfs, n) for n in physical or up)
    sel.rule = "every up interface with a device" if physical else "every up non-loopback interface"


# ---- selection: storage -------------------------------------------------------------------------------------------
def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path`: the longest mount point above it, the later of equal ones."""
    best = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        if (path == point or path.startswith(point + "/") or point == "/") and (
            best is None or len(point) >= len(best.point.rstrip("/") or "/")
        ):
            best = m
    return best


def _block(sysfs: Sysfs, dev: str) -> Device | None:
    """The block device numbered `dev` (MAJ:MIN): its own stat (a partition's, a dm or md device's)."""
    base = f"{DEV_BLOCK}/{dev}"
    name = sysfs.realpath_name(base)
    if name is None or not sysfs.exists(f"{base}/stat"):
        return None
    detail = ""
    if sysfs.exists(f"{base}/partition"):
        target = os.readlink(sysfs.path(base)).rstrip("/")
        detail = f"partition of {os.path.basename(os.path.dirname(target))}"
    elif name.startswith(("dm-", "md")):
        label = sysfs.read(f"{base}/dm/name") or ""
        under = ",".join(sysfs.listdir(f"{base}/slaves"))
        detail = f"{label} over {under}".strip() if under else label
    read = Channel(f"{base}/stat", 512.0, field=2, wrap_bits=LONG_BITS)
    return Device(name, "block", read, Channel(f"{base}/stat", 0.001, field=9, wrap_bits=32), detail)


def storage_of(sysfs: Sysfs, path: str, mounts: list[Mount], st_dev: str | None = None) -> Device | str:
    """The device serving `path` (`st_dev`: its MAJ:MIN from stat() on a live node, else the mount's), or the
    reason code it is unmeasured (`not-mounted`, `in-memory`, `lustre-not-read`, ...)."""
    mount = mount_of(path, mounts)
    if mount is None:
        return "not-mounted"
    fstype = mount.fstype
    if fstype in NFS_TYPES:
        return Device(f"nfs:{mount.source}", "nfs", Channel(MOUNTSTATS, field=f"nfs:{mount.point}"))
    if fstype in MEMORY_TYPES:
        return "in-memory"
    dev = st_dev or mount.dev
    found = _block(sysfs, dev) if not dev.startswith("0:") else None
    if found is None and mount.source.startswith("/dev/"):  # btrfs: an anonymous st_dev; the source names it
        found = _block(sysfs, sysfs.read(f"sys/class/block/{os.path.basename(mount.source)}/dev") or "-")
    if found is not None:
        return found
    slug = "".join(c if c.isalnum() else "-" for c in fstype.lower())[:24] or "unknown"
    return f"{slug}-not-read"


def select_storage(sysfs: Sysfs, paths: list[tuple[str, str]], sel: Selection, live: bool) -> None:
    """The devices behind `paths` ((path, role): cache, source), one entry per device with every role and path
    it serves; with no path known, every physical disk (not loop, ram, zram...) with role `disk`."""
    mounts = parse_mountinfo(sysfs.read(MOUNTINFO)) if paths else []
    if paths and not mounts:
        sel.notes.append(f"{MOUNTINFO} unreadable: storage unmeasured")
    by_name: dict[str, Device] = {}
    for path, role in paths:
        norm = os.path.normpath(os.path.realpath(path) if live else path)
        try:
            st = os.stat(norm) if live else None
        except OSError:
            st = None
        st_dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}" if st is not None else None
        found = storage_of(sysfs, norm, mounts, st_dev) if mounts else "mounts-unreadable"
        if isinstance(found, str):
            sel.unmeasured.append((path, role, found))
            continue
        device = by_name.setdefault(found.name, found)
        if role not in device.roles:
            device.roles.append(role)
        device.paths.append(path)
    sel.devices.extend(by_name.values())
    if paths:
        return
    for name in sysfs.listdir(BLOCK):
        if name.startswith(VIRTUAL_DISKS) or not sysfs.exists(f"{BLOCK}/{name}/device"):
            continue
        dev = sysfs.read(f"{BLOCK}/{name}/dev")
        disk = _block(sysfs, dev) if dev and ":" in dev else None
        if disk is not None:
            disk.roles.append("disk")
            sel.devices.append(disk)
    if not sel.devices:
        sel.unmeasured.append(("*", "disk", "no-device"))


def select(
    sysfs: Sysfs, fabric: dict | None = None, paths: list[tuple[str, str]] | None = None, live: bool = False
) -> Selection:
    """The node's ports and storage devices; `live`: paths are this machine's (symlinks resolved)."""
    sel = Selection()
    select_ports(sysfs, fabric, sel)
    select_storage(sysfs, list(paths or []), sel, live)
    return sel


# ---- the job's cgroup -----------------------------------------------------------------------------------------------
class JobCgroup:
    """A job's Slurm cgroup: its CPU-time channel (seconds) and cpuset file, v2 or v1."""

    __slots__ = ("cpu", "cpuset", "version")

    def __init__(self, cpu: Channel, cpuset: str, version: str):
        self.cpu, self.cpuset, self.version = cpu, cpuset, version

    def cpu_value(self, sysfs: Sysfs) -> int | None:
        text = sysfs.read(self.cpu.path)
        return parse_cpu_stat(text) if self.version == "v2" else parse_counter(text)

    def cpus(self, sysfs: Sysfs) -> int | None:
        cpus = sf.parse_cpulist(sysfs.read(self.cpuset))
        return len(cpus) if cpus else None


def cgroup_jobs(sysfs: Sysfs) -> dict[str, str]:
    """{job id: its cgroup directory (v2; v1: the cpuacct controller's)} of every Slurm job with a cgroup on
    this node; {} without Slurm cgroups (proctrack/linuxproc and task/none make none)."""
    if sysfs.exists(f"{CGROUP}/cgroup.controllers"):
        scopes = sysfs.listdir(f"{CGROUP}/system.slice")
        parents = [f"{CGROUP}/system.slice/{s}" for s in scopes if s.endswith("slurmstepd.scope")]
    else:
        tops = [
            f"{CGROUP}/{c}/{t}" for c in ("cpuacct", "cpu,cpuacct") for t in sysfs.listdir(f"{CGROUP}/{c}")
        ]
        tops = [t for t in tops if t.rsplit("/", 1)[1] == "slurm" or t.rsplit("/", 1)[1].startswith("slurm_")]
        parents = [f"{t}/{uid}" for t in tops for uid in sysfs.listdir(t) if uid.startswith("uid_")]
    return {job[4:]: f"{p}/{job}" for p in parents for job in sysfs.listdir(p) if job.startswith("job_")}


def job_cgroup(sysfs: Sysfs, job_id: str, jobs: dict[str, str] | None = None) -> JobCgroup | str:
    """The job's cgroup (from `jobs`, a cgroup_jobs() reading, when given), or the reason code it is
    unmeasured (`no-cgroup`)."""
    where = (cgroup_jobs(sysfs) if jobs is None else jobs).get(job_id)
    if where is None:
        return "no-cgroup"
    if where.startswith(f"{CGROUP}/system.slice/"):
        return JobCgroup(Channel(f"{where}/cpu.stat", 1e-6), f"{where}/cpuset.cpus.effective", "v2")
    rel = where.split("/", 4)[4]  # slurm/uid_X/job_Y under the controller
    return JobCgroup(Channel(f"{where}/cpuacct.usage", 1e-9), f"{CGROUP}/cpuset/{rel}/cpuset.cpus", "v1")
