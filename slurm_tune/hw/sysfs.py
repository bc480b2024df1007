"""The one sysfs reader. Every path is under a relocatable root (`--sysfs-root`, default `/`), so checks and
detection run the same against a live node, a fixture tree, or a copy taken from a broken node.

Reads return the raw text Linux gives (`4: ACTIVE`, `200 Gb/sec (4X HDR)`); the parse_* functions turn it into
values and return None for anything they do not recognise, so garbage never raises. Hot path: see
docs/speed.md.
"""

from __future__ import annotations

import os

from ..text import is_digits
from ..thisnode import expand

FORMAT = (
    "stune-snapshot/1"  # a node snapshot's format tag (hw/snapshot.py); here: hot path: see docs/speed.md
)
IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"
PCI_DEVICES = "sys/bus/pci/devices"
NUMA_NODES = "sys/devices/system/node"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x030000", "0x030200")  # VGA controller, 3D controller
# Other vendors' accelerators on the bus: vendor id and (class prefixes, device ids); docs/accelerators.md.
# AMD: VGA (0x0300), display controller (0x0380: MI50/MI100/MI200) and processing accelerator (0x1200:
# MI300X/MI325X); the HDMI audio and the CPU's functions are other classes or vendor 0x1022. Huawei (0x19e5,
# whose NICs share the vendor): the Ascend ids of Huawei's driver log-collection script, 310 d100, 310P d500,
# 910 d801, 910B d802, 910_93 (A3) d803.
ACCEL_PCI = {
    "amd": ("0x1002", ("0x0300", "0x0380", "0x1200"), ()),
    "ascend": ("0x19e5", (), ("0xd100", "0xd500", "0xd801", "0xd802", "0xd803")),
}
# The error counters the health checks judge; capture takes every file in counters/ regardless.
IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors")
IFF_UP = 0x1
COUNTER_MAX = (1 << 64) - 1  # sysfs counters are at most 64 bits wide; anything larger is garbage
INT_TEXT_MAX = 24  # longest integer text any parsed sysfs value can have (a 64-bit value has 20 digits)


MISSING = "missing"


def _isdir(mode: int) -> bool:
    return mode & 0o170000 == 0o040000  # stat.S_ISDIR; hot path: see docs/speed.md


def resolve_root(text: str | None, environ=None, node: str | None = None) -> str:
    """The sysfs root to read under: `text` (from --sysfs-root or STUNE_SYSFS_ROOT), default `/`.
    `%n` becomes the node name (`node`, else $SLURMD_NODENAME), so one setting serves every node of the
    one-machine development cluster, where each node's tree lives in its own directory."""
    environ = os.environ if environ is None else environ
    return expand(text or environ.get("STUNE_SYSFS_ROOT") or "/", node, environ)


class Sysfs:
    """Reads under `root`. Missing files read as None; a file that exists but cannot be read also reads as
    None and is remembered in `problems`, so a capture can say what it could not see."""

    def __init__(self, root: str = "/"):
        self.root = root or "/"
        self.problems: list[str] = []

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel: str) -> str | None:
        # os.open/os.read, not open(): half the cost per file, and the prolog reads a couple of hundred
        try:
            fd = os.open(self.path(rel), os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, 65536)  # one read returns a whole sysfs attribute (at most a page)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # e.g. EINVAL reading the type of an empty GID slot
            if exc.errno not in (22, 61):  # EINVAL, ENODATA are how sysfs says "no value here"
                self.problems.append(f"{rel}: {exc.strerror}")
            return None
        return data.decode("utf-8", "replace").strip()

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            self.problems.append(f"{rel}: {exc.strerror}")
            return []

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def entry(self, rel: str) -> str | None:
        """Whether a sysfs directory can be used: None when it is a readable directory, MISSING when nothing
        is there, else why it cannot be read (a symlink loop, a file where a directory belongs, a dangling
        link, no permission). Missing and unreadable are different findings: only missing is the hardware's."""
        path = self.path(rel)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            try:
                os.lstat(path)
            except FileNotFoundError:
                return MISSING
            except OSError as exc:
                return f"{rel}: {exc.strerror}"
            return f"{rel}: dangling symbolic link"
        except OSError as exc:  # ELOOP, ENOTDIR (a file where a directory belongs above it), EACCES, EIO
            return f"{rel}: {exc.strerror}"
        if not _isdir(st.st_mode):
            return f"{rel}: not a directory"
        return None

    def listdir_checked(self, rel: str) -> tuple[list[str], str | None]:
        """(names, None); ([], MISSING) when nothing is there; ([], why) when it cannot be listed."""
        try:
            return sorted(os.listdir(self.path(rel))), None
        except FileNotFoundError:
            return [], (MISSING if self.entry(rel) == MISSING else f"{rel}: cannot be listed")
        except OSError as exc:
            return [], f"{rel}: {exc.strerror}"

    def realpath_name(self, rel: str) -> str | None:
        """Basename of what a sysfs symlink points at (e.g. device -> .../0000:07:00.0)."""
        try:
            target = os.readlink(self.path(rel))
        except OSError:
            return None
        return os.path.basename(target.rstrip("/"))

    # ---- InfiniBand / RoCE ---------------------------------------------------------------------------
    def ib_devices(self) -> list[str]:
        return self.listdir(IB_CLASS)

    def ib_ports(self, device: str) -> list[str]:
        return [p for p in self.listdir(f"{IB_CLASS}/{device}/ports") if is_digits(p)]

    def ib_device(
        self,
        device: str,
        *,
        ports: list[str] | None = None,
        gids: bool = False,
        counters: tuple[str, ...] | None = None,
    ) -> dict | None:
        """Raw facts of one HCA (None when it is not there): fw_ver, board_id, hca_type, node_guid, PCI address, netdevs, and its ports.
        An HCA entry that is there but cannot be read is {"unreadable": why}; a port list that cannot be
        read leaves `ports_error`, so no port is taken for missing."""
        base = f"{IB_CLASS}/{device}"
        problem = self.entry(base)
        if problem == MISSING:
            return None
        if problem is not None:
            return {"unreadable": problem}
        out: dict[str, object] = {
            "fw_ver": self.read(f"{base}/fw_ver"),
            "board_id": self.read(f"{base}/board_id"),
            "hca_type": self.read(f"{base}/hca_type"),
            "node_guid": self.read(f"{base}/node_guid"),
            "pci": self.realpath_name(f"{base}/device"),
            "netdevs": self.listdir(f"{base}/device/net"),
        }
        if not ports:
            names, why = self.listdir_checked(f"{base}/ports")
            ports = [p for p in names if is_digits(p)]
            if why is not None and why != MISSING:
                out["ports_error"] = why
        out["ports"] = {p: self.ib_port(device, p, gids=gids, counters=counters) for p in ports}
        return out

    def ib_port(
        self, device: str, port: str | int, *, gids: bool = False, counters: tuple[str, ...] | None = None
    ) -> dict:
        """One port's raw facts. `counters`: just these counter files (the prolog reads the four it judges),
        default every file in counters/."""
        base = f"{IB_CLASS}/{device}/ports/{port}"
        problem = self.entry(base)
        if problem is not None:
            return {"present": False} if problem == MISSING else {"unreadable": problem}
        out: dict[str, object] = {
            "present": True,
            "state": self.read(f"{base}/state"),
            "phys_state": self.read(f"{base}/phys_state"),
            "rate": self.read(f"{base}/rate"),
            "link_layer": self.read(f"{base}/link_layer"),
            "counters": {
                name: self.read(f"{base}/counters/{name}")
                for name in (self.listdir(f"{base}/counters") if counters is None else counters)
            },
        }
        if gids:
            out["gids"] = self.gid_table(device, port)
        return out

    def gid_table(self, device: str, port: str | int) -> list[dict]:
        """Populated GID slots: index, gid (sysfs form), type (`RoCE v2`, `IB/RoCE v1`), ndev (netdev)."""
        base = f"{IB_CLASS}/{device}/ports/{port}"
        table: list[dict] = []
        for name in self.listdir(f"{base}/gids"):
            if not is_digits(name):
                continue
            gid = self.read(f"{base}/gids/{name}")
            if gid is None or parse_gid(gid) in (None, 0):
                continue  # empty slot: its attributes read as EINVAL
            table.append(
                {
                    "index": int(name),
                    "gid": gid,
                    "type": self.read(f"{base}/gid_attrs/types/{name}"),
                    "ndev": self.read(f"{base}/gid_attrs/ndevs/{name}"),
                }
            )
        table.sort(key=lambda g: g["index"])
        return table

    # ---- network interfaces ----------------------------------------------------------------------------
    def netdevs(self) -> list[str]:
        return self.listdir(NET_CLASS)

    def netdev(self, name: str) -> dict:
        base = f"{NET_CLASS}/{name}"
        problem = self.entry(base)
        if problem is not None:
            return {"present": False} if problem == MISSING else {"unreadable": problem}
        return {
            "present": True,
            "operstate": self.read(f"{base}/operstate"),
            "flags": self.read(f"{base}/flags"),
            "carrier": self.read(f"{base}/carrier"),
            "mtu": self.read(f"{base}/mtu"),
            "type": self.read(f"{base}/type"),
            "address": self.read(f"{base}/address"),
        }

    # ---- PCI and NUMA ------------------------------------------------------------------------------------
    def pci_device(self, address: str) -> dict:
        base = f"{PCI_DEVICES}/{address}"
        problem = self.entry(base)
        if problem is not None:
            return {"present": False} if problem == MISSING else {"unreadable": problem}
        fields = (
            "vendor",
            "device",
            "class",
            "numa_node",
            "local_cpulist",
            "current_link_speed",
            "current_link_width",
            "max_link_speed",
            "max_link_width",
        )
        out: dict[str, object] = {"present": True}
        out.update({f: self.read(f"{base}/{f}") for f in fields})
        return out

    def nvidia_gpus(self) -> list[str]:
        """PCI addresses of NVIDIA GPUs, in bus order (which is CUDA's PCI_BUS_ID order)."""
        found = []
        for address in self.listdir(PCI_DEVICES):
            if (self.read(f"{PCI_DEVICES}/{address}/vendor") or "").lower() != NVIDIA_VENDOR:
                continue
            cls = (self.read(f"{PCI_DEVICES}/{address}/class") or "").lower()
            if cls in GPU_CLASSES:
                found.append(address)
        return found

    def vendor_devices(self, vendor: str) -> list[str]:
        """PCI addresses of an accelerator vendor's devices (ACCEL_PCI: "amd", "ascend"), in bus order."""
        found = self.listdir(PCI_DEVICES)
        return [a for a in found if accel_match(vendor, lambda f, a=a: self.read(f"{PCI_DEVICES}/{a}/{f}"))]

    def numa_cpulist(self, node: int) -> str | None:
        return self.read(f"{NUMA_NODES}/node{node}/cpulist")

    def numa_nodes(self) -> list[int]:
        return sorted(
            int(n[4:]) for n in self.listdir(NUMA_NODES) if n.startswith("node") and is_digits(n[4:])
        )


# ---- parsing raw sysfs text (pure; None for anything unrecognised) --------------------------------------------


def parse_port_state(text: str | None) -> tuple[int, str] | None:
    """`4: ACTIVE` -> (4, 'ACTIVE'); `5: LinkUp` -> (5, 'LinkUp'); `7: Phy Test` -> (7, 'Phy Test'). The name
    is words of letters, digits and `_`, one space apart (as the kernel's own names are)."""
    if not isinstance(text, str):
        return None
    num, sep, name = text.partition(":")
    num, name = num.strip(), name.strip()
    if not sep or not is_digits(num) or not all(w.replace("_", "").isalnum() for w in name.split(" ")):
        return None
    return int(num), name


def _number_before(text, unit: str) -> float | None:
    """The finite, non-negative number in `<number> <unit> ...`, else None."""
    if not isinstance(text, str):
        return None
    parts = text.split()
    if len(parts) < 2 or parts[1] != unit:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


def parse_rate_gbps(text: str | None) -> float | None:
    """`200 Gb/sec (4X HDR)` -> 200.0; `100 Gb/sec (2X HDR)` -> 100.0; `2.5 Gb/sec (1X SDR)` -> 2.5."""
    return _number_before(text, "Gb/sec")


def parse_counter(text: str | None) -> int | None:
    """A counter's decimal text, at most 64 bits (sysfs counters are); anything else - a sign, a 21-digit or a
    5000-digit number - is None, so one garbled counter is unknown without touching its neighbours."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > 20 or not is_digits(text):
        return None
    value = int(text)
    return value if value <= COUNTER_MAX else None


def parse_gid(text: str | None) -> int | None:
    """The 128-bit GID as an int, from sysfs's `fe80:0000:...:1c20` or any IPv6 text form (`::ffff:10.0.0.5`)."""
    if not isinstance(text, str):
        return None
    text = text.strip().lower()
    if "." in text:  # a dotted IPv4 tail: rewrite it as two hex groups
        head, _, last = text.rpartition(":")
        v4 = parse_ipv4(last)
        if v4 is None or not head:
            return None
        text = f"{head}:{v4 >> 16:x}:{v4 & 0xFFFF:x}"
    if text.count("::") > 1:
        return None
    head, sep, tail = text.partition("::")
    groups = head.split(":") if head else []
    if sep:
        tail_groups = tail.split(":") if tail else []
        missing = 8 - len(groups) - len(tail_groups)
        if missing < 1:
            return None
        groups = groups + ["0"] * missing + tail_groups
    if len(groups) != 8:
        return None
    value = 0
    for g in groups:
        if not 1 <= len(g) <= 4 or any(c not in "0123456789abcdef" for c in g):
            return None
        value = (value << 16) | int(g, 16)
    return value


def parse_ipv4(text: str) -> int | None:
    parts = text.split(".")
    if len(parts) != 4 or not all(is_digits(p) and len(p) <= 3 and int(p) <= 255 for p in parts):
        return None
    return (int(parts[0]) << 24) | (int(parts[1]) << 16) | (int(parts[2]) << 8) | int(parts[3])


def gid_ipv4(gid: int | None) -> str | None:
    """`a.b.c.d` when the GID is an IPv4-mapped address (::ffff:a.b.c.d), else None."""
    if gid is None or gid >> 32 != 0xFFFF:
        return None
    v4 = gid & 0xFFFFFFFF
    return f"{v4 >> 24}.{(v4 >> 16) & 255}.{(v4 >> 8) & 255}.{v4 & 255}"


def gid_is_link_local(gid: int | None) -> bool:
    return gid is not None and gid >> 118 == 0x3FA  # fe80::/10


def parse_cpulist(text: str | None) -> frozenset[int] | None:
    """`0-31,64-95` -> {0..31, 64..95}. None for garbage; an empty string is the empty set."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text:
        return frozenset()
    cpus: set[int] = set()
    for chunk in text.split(","):
        lo, sep, hi = chunk.strip().partition("-")
        if not is_digits(lo) or (sep and not is_digits(hi)) or len(lo) > 7 or len(hi) > 7:
            return None
        start, end = int(lo), int(hi) if sep else int(lo)
        if end < start or end - start > 65536:
            return None
        cpus.update(range(start, end + 1))
    return frozenset(cpus)


def accel_match(vendor: str, read) -> bool | None:
    """Whether a PCI device is one of `vendor`'s accelerators (ACCEL_PCI); `read(name)` gives the text of its
    vendor, class or device file. None: an id that cannot be read (never taken for another vendor's)."""
    vendor_id, classes, ids = ACCEL_PCI[vendor]
    texts = [read("vendor")]
    if parse_int(texts[0]) is not None and texts[0].strip().lower() == vendor_id:
        texts.append(read("class" if classes else "device"))
    if any(parse_int(t) is None for t in texts):
        return None
    last = texts[-1].strip().lower()
    return len(texts) == 2 and (last[:6] in classes if classes else last in ids)


def parse_int(text: str | None) -> int | None:
    """Decimal or 0x-hex integer text (numa_node `-1`, flags `0x1003`)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > INT_TEXT_MAX:  # bounded: no text makes int() slow or raise on its digit limit
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def netdev_is_up(info: dict) -> bool:
    """Administratively up and with a link: operstate `up`, or `unknown` with IFF_UP (some virtual NICs)."""
    if not info.get("present"):
        return False
    state = (info.get("operstate") or "").strip().lower()
    if state == "up":
        return True
    flags = parse_int(info.get("flags"))
    return state == "unknown" and flags is not None and bool(flags & IFF_UP)


def pci_address(bus_id: str | None) -> str | None:
    """Normalise NVML's `00000000:07:00.0` and sysfs's `0000:07:00.0` to the sysfs form, lower case."""
    if not isinstance(bus_id, str):
        return None
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1 or "." not in rest:
        return None
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return None
