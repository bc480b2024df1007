"""Detection on the node: which fabric ports are ACTIVE, which GID index is RoCE v2, which socket interface
is up. Each function returns its answer and, when the answer is empty or partial, the reason in words, so the
caller can say so instead of guessing."""

from __future__ import annotations

from ..frozen import Record
from ..hw.sysfs import Sysfs, gid_ipv4, gid_is_link_local, netdev_is_up, parse_gid, parse_port_state

ROCE_V2 = "RoCE v2"


class Port(Record):
    __slots__ = ("device", "port", "netdev")
    device: str
    port: str | int
    netdev: str | None

    def __str__(self):
        return f"{self.device}:{self.port}"


def port_state(sysfs: Sysfs, port: Port) -> str:
    """`ACTIVE`, `DOWN`, `INIT`, ... or `missing` when the device or port is not on this node."""
    info = sysfs.ib_port(port.device, port.port, counters=())  # the state only: no counter reads per task
    if not info.get("present"):
        return "missing"
    parsed = parse_port_state(info.get("state"))
    return parsed[1].upper() if parsed else "unreadable"


def active_ports(sysfs: Sysfs, ports: list[Port]) -> tuple[list[Port], dict[str, str]]:
    """(the ACTIVE ports in profile order, {port: state} of the others)."""
    active, others = [], {}
    for port in ports:
        state = port_state(sysfs, port)
        if state == "ACTIVE":
            active.append(port)
        else:
            others[str(port)] = state
    return active, others


def roce_v2_gid_index(sysfs: Sysfs, port: Port) -> tuple[int | None, str]:
    """The lowest GID index of `port` that is RoCE v2, an IPv4-mapped address (not zero, not fe80::) and
    bound to the port's netdev; (None, why not) when there is none."""
    table = sysfs.gid_table(port.device, port.port)
    if not table:
        return None, f"{port} has no populated GID table"
    seen = []
    for entry in table:
        gid = parse_gid(entry.get("gid"))
        kind = (entry.get("type") or "").strip()
        ndev = (entry.get("ndev") or "").strip()
        if kind != ROCE_V2:
            continue
        if not gid or gid_is_link_local(gid) or gid_ipv4(gid) is None:
            seen.append(f"{entry['index']} (RoCE v2, not IPv4-mapped)")
            continue
        if port.netdev and ndev != port.netdev:
            seen.append(f"{entry['index']} (RoCE v2 {gid_ipv4(gid)} on {ndev or 'no netdev'})")
            continue
        return entry["index"], ""
    detail = f"; RoCE v2 entries: {', '.join(seen)}" if seen else "; no RoCE v2 entry at all"
    return None, f"{port}: no RoCE v2 IPv4-mapped GID on {port.netdev or 'its netdev'}{detail}"


def gid_type(sysfs: Sysfs, port: Port, index: int) -> str | None:
    for entry in sysfs.gid_table(port.device, port.port):
        if entry["index"] == index:
            return (entry.get("type") or "").strip() or None
    return None


def ifname_matches(spec: str, name: str) -> bool:
    """NCCL_SOCKET_IFNAME matching: comma list of prefixes; `=` makes them exact, `^` excludes them."""
    text = spec.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    items = [i.strip() for i in text.split(",") if i.strip()]
    hit = any(name == i if exact else name.startswith(i) for i in items)
    return not hit if exclude else hit


def socket_interfaces(sysfs: Sysfs, spec: str) -> tuple[list[str], str]:
    """Interfaces that match `spec` and are up (loopback never counts); (the list, why it is empty)."""
    names = [n for n in sysfs.netdevs() if n != "lo"]
    matching = [n for n in names if ifname_matches(spec, n)]
    up = [n for n in matching if netdev_is_up(sysfs.netdev(n))]
    if up:
        return up, ""
    if matching:
        return (
            [],
            f"socket interface {spec}: {', '.join(matching)} {'is' if len(matching) == 1 else 'are'} not up",
        )
    others = [n for n in names if netdev_is_up(sysfs.netdev(n))]
    return [], (
        f"socket interface {spec} does not exist on this node"
        + (f" (up: {', '.join(others)})" if others else "")
    )


def ipv4_address(ifname: str) -> str | None:
    """The IPv4 address of the live interface `ifname` (SIOCGIFADDR), or None. This asks the kernel, not
    sysfs: an interface in a relocated fixture tree has no address here, and callers fall back to a name."""
    import socket

    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(
                sock.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15])
            )  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ValueError, UnicodeError):
        return None
