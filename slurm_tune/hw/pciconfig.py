"""PCI config space as sysfs shows it (`/sys/bus/pci/devices/<address>/config`: the device's registers,
binary, little-endian), and where a device sits in the PCI hierarchy.

What the drift checks need from it is PCIe Access Control Services: the ACS extended capability (ID 0x000D,
found by walking the extended capability list from offset 0x100: a 32-bit header, ID in bits 15:0, version
in 19:16, the next capability's offset in 31:20), whose ACS Capability register (16 bits at +4) says what
the port implements and whose ACS Control register (16 bits at +6) what is enabled. P2P Request Redirect,
P2P Completion Redirect and P2P Egress Control send peer-to-peer traffic up to the root complex instead of
across the switch: GPUDirect RDMA between a GPU and the HCA beside it then crawls or fails. The same bits
Linux's p2pdma reads (drivers/pci/p2pdma.c, pci_bridge_has_acs_redir).

Pure parsers over bytes and path text; never raise on garbage (fuzzed: tests/test_drift_fuzz.py).
"""

from __future__ import annotations

import os

CONFIG_MAX = 4096  # PCIe config space; conventional PCI has 256 bytes, and an unprivileged read gets 64
HEADER = 64
EXT_CAP_BASE = 0x100
EXT_CAP_TTL = (CONFIG_MAX - EXT_CAP_BASE) // 8  # Linux's bound on a capability list walk
STD_CAP_TTL = 48
PCI_STATUS, PCI_STATUS_CAP_LIST, PCI_CAPABILITY_LIST = 0x06, 0x10, 0x34
PCI_CAP_ID_EXP = 0x10  # PCI Express
EXT_CAP_ID_ACS = 0x000D
ACS_CAP, ACS_CTRL = 0x04, 0x06
ACS_SV, ACS_TB, ACS_RR, ACS_CR, ACS_UF, ACS_EC, ACS_DT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
ACS_REDIRECT = ACS_RR | ACS_CR | ACS_EC
# lspci's words for the control bits (`ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...`)
ACS_WORDS = (
    (ACS_SV, "SrcValid"),
    (ACS_TB, "TransBlk"),
    (ACS_RR, "ReqRedir"),
    (ACS_CR, "CmpltRedir"),
    (ACS_UF, "UpstreamFwd"),
    (ACS_EC, "EgressCtrl"),
    (ACS_DT, "DirectTrans"),
)
_HEX = frozenset("0123456789abcdef")


def _u16(data: bytes | bytearray, at: int) -> int:
    return data[at] | data[at + 1] << 8


def _u32(data: bytes | bytearray, at: int) -> int:
    return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24


def _is_pcie(data: bytes | bytearray) -> bool | None:
    """Whether the standard capability list has a PCI Express capability (None: the list runs past what
    was read, so it cannot be told)."""
    if not _u16(data, PCI_STATUS) & PCI_STATUS_CAP_LIST:
        return False
    at, seen = data[PCI_CAPABILITY_LIST] & 0xFC, set()
    for _ in range(STD_CAP_TTL):
        if at < HEADER or at in seen:
            return (
                False  # the end of the list (0), or a pointer into the header or back: no more capabilities
            )
        if at + 2 > len(data):
            return None
        if data[at] == PCI_CAP_ID_EXP:
            return True
        seen.add(at)
        at = data[at + 1] & 0xFC
    return False


def parse_acs(data) -> dict:
    """{"size": bytes read, "acs": None (no ACS capability) or {"offset", "cap", "ctrl"}, "problem": None or
    why it cannot be told}. Anything that is not a plausible config space is a problem, never "no ACS"."""
    if not isinstance(data, (bytes, bytearray)):
        return {"size": 0, "acs": None, "problem": "no config space read"}
    out: dict = {"size": len(data), "acs": None, "problem": None}
    if len(data) < HEADER:
        out["problem"] = f"config space truncated ({len(data)} bytes)"
    elif _u16(data, 0) == 0xFFFF:
        out["problem"] = "vendor id ffff: the device does not answer config reads"
    elif len(data) < EXT_CAP_BASE + 4:
        pcie = _is_pcie(data)
        if pcie is not False:  # PCIe, or cannot tell: the extended space (where ACS lives) was not readable
            out["problem"] = (
                f"only {len(data)} bytes of config space readable (the extended capabilities need root)"
            )
    else:
        out.update(_walk_ext(data))
    return out


def _walk_ext(data) -> dict:
    at, seen = EXT_CAP_BASE, set()
    header = _u32(data, at)
    if header == 0:
        return {}  # no extended capabilities
    for _ in range(EXT_CAP_TTL):
        if header == 0xFFFFFFFF:
            return {"problem": f"extended capability header at {at:#x} reads all ones"}
        if header & 0xFFFF == EXT_CAP_ID_ACS:
            if at + ACS_CTRL + 2 > len(data):
                return {"problem": f"ACS capability at {at:#x} runs past the {len(data)} bytes read"}
            return {"acs": {"offset": at, "cap": _u16(data, at + ACS_CAP), "ctrl": _u16(data, at + ACS_CTRL)}}
        seen.add(at)
        at = (header >> 20) & 0xFFC
        if at == 0:
            return {}
        if at < EXT_CAP_BASE or at in seen:
            return {"problem": f"extended capability list points at {at:#x} (below 0x100, or a loop)"}
        if at + 4 > len(data):
            return {"problem": f"extended capability at {at:#x} runs past the {len(data)} bytes read"}
        header = _u32(data, at)
    return {"problem": "extended capability list too long"}


def acs_words(ctrl: int) -> str:
    """`ReqRedir+ CmpltRedir+ EgressCtrl-`: the redirect bits as lspci spells them."""
    return " ".join(f"{w}{'+' if ctrl & bit else '-'}" for bit, w in ACS_WORDS if bit & ACS_REDIRECT)


def read_config(path: str) -> tuple[bytes | None, str | None]:
    """(the first CONFIG_MAX bytes of a config file, None), (None, None) when there is none, (None, why) when
    it cannot be read."""
    return read_file(path, CONFIG_MAX)


def read_file(path: str, most: int) -> tuple[bytes | None, str | None]:
    """(a file's first `most` bytes, None), (None, None) when it is missing, (None, why) when it cannot be
    read: opened through safeio (no symlink at the last component, no hang on a FIFO, a regular file only),
    as sysfs and procfs attributes are."""
    from .. import safeio

    try:
        fd = safeio.open_file(path, single_link=False)
    except FileNotFoundError:
        return None, None
    except (OSError, safeio.UnsafePathError) as exc:
        return None, getattr(exc, "strerror", None) or str(exc)
    chunks, size = [], 0
    try:
        while size < most:
            chunk = os.read(fd, min(65536, most - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)
    return b"".join(chunks), None


# ---- where a device sits ----------------------------------------------------------------------------------


def is_pci_address(text) -> bool:
    """`0000:07:00.0` (domain:bus:device.function, lower-case hex, as sysfs names devices; a VMD domain has
    five digits)."""
    if not isinstance(text, str) or not 12 <= len(text) <= 13:
        return False
    domain, sep, rest = text.partition(":")
    if not sep or len(rest) != 7 or rest[2] != ":" or rest[5] != ".":
        return False
    return (
        set(domain + rest[:2] + rest[3:5]) <= _HEX
        and len(domain) in (4, 5)
        and rest[6] in "01234567"
        and int(rest[3:5], 16) < 32
    )


def is_host_bridge(text) -> bool:
    """`pci0000:00`: a PCI host bridge (root complex) as sysfs names it."""
    if not isinstance(text, str) or not text.startswith("pci") or len(text) > 16:
        return False
    domain, sep, bus = text[3:].partition(":")
    return bool(sep) and 4 <= len(domain) <= 8 and len(bus) == 2 and set(domain + bus) <= _HEX


def split_device_path(components) -> tuple[list[str] | None, str | None]:
    """A device's sysfs path below sys/devices, top down (`["pci0000:00", "0000:00:01.1", ...,
    "0000:07:00.0"]`) -> (its PCI ancestors and itself, nearest the host bridge first, None), or (None, why).
    The walk stops at the nearest host bridge: what sits above it (a Hyper-V VMBus, say) is not PCI."""
    if not isinstance(components, list) or not components or len(components) > 64:
        return None, "no device path"
    chain: list[str] = []
    for name in reversed(components):
        if is_pci_address(name):
            chain.append(name)
        elif is_host_bridge(name):
            return (list(reversed(chain)), None) if chain else (None, "no device below the host bridge")
        else:
            return None, f"{name!r} in the device path is neither a PCI device nor a host bridge"
    return None, "no host bridge in the device path"


def device_path(root: str, rel: str) -> tuple[list[str] | None, str | None]:
    """(the components of `<root>/<rel>`'s real path below <root>/sys/devices, top down, None), or (None,
    why): sysfs's /sys/bus/pci/devices/<address> is a link into /sys/devices/pci<domain>:<bus>/..."""
    base = os.path.realpath(root or "/")
    real = os.path.realpath(os.path.join(root or "/", rel))
    try:
        os.stat(real)
    except OSError as exc:
        return None, f"{rel}: {exc.strerror}"
    inner = os.path.relpath(real, base).split(os.sep)
    if len(inner) < 3 or inner[:2] != ["sys", "devices"]:
        return None, f"{rel} is not a link into sys/devices (it resolves to {'/'.join(inner)[:120]})"
    return inner[2:], None
