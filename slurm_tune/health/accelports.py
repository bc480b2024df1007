"""The accel family's checks of Ascend's on-card RoCE ports (health/accel.py), one per NPU chip, as hccn_tool
read them into the `accel` section's `ports` (by device id as text): `-link -g` UP (DOWN fails, naming the NPU:
`stune: npu3 port link DOWN`), `-net_health -g` Success (anything hccn_tool reports instead is
accel.hccn.net_health), `-ip -g` an IPv4 address (none fails when accel.hccn.require_ip). A port that did not
answer, or whose answer is not in hccn_tool's words, is unknown.
"""

from __future__ import annotations

from ..text import is_digits
from ..vendors import HCCN_NET_HEALTH, NET_HEALTH_OK
from . import result
from .acceldevice import minor_of, shown

LINK_UP, LINK_DOWN = "UP", "DOWN"


def ipv4(text) -> bool:
    parts = text.split(".") if isinstance(text, str) and len(text) <= 15 else []
    return len(parts) == 4 and all(is_digits(p) and len(p) <= 3 and int(p) <= 255 for p in parts)


def _why(port: dict, key: str) -> str:
    """Why a port's reading is missing: its own error, the tool's, or the section's silence."""
    errors = port.get("errors")
    errors = errors if isinstance(errors, dict) else {}
    for name in (key, "hccn_tool"):
        why = errors.get(name)
        if isinstance(why, str) and why.strip():
            return " ".join(why.split())[:200]
    return "not read"


def check(ports, devices: list, hccn) -> list:
    """The findings of every port the section has, and of every NPU chip (by minor) that has none."""
    if not isinstance(ports, dict):
        return [result.unknown("accel.hccn", "node", f"unreadable hccn_tool ports {shown(ports, 80)}")]
    ids: dict[int, object] = {}
    out = []
    for key, port in ports.items():
        if isinstance(key, str) and is_digits(key) and len(key) <= 5:
            ids[int(key)] = port
        else:
            out.append(result.unknown("accel.hccn", "node", f"unreadable port id {shown(key)}"))
    for minor in (minor_of(d) for d in devices):
        if minor is not None and minor not in ids:
            ids[minor] = None
    for n in sorted(ids):
        out += _port(n, ids[n], hccn)
    return out


def _port(n: int, port, hccn) -> list:
    subject, name = f"npu{n} port", f"npu{n}"
    if not isinstance(port, dict):
        what = "no hccn_tool reading" if port is None else "unreadable port entry"
        return [result.unknown("accel.hccn", subject, what)]
    try:
        return [
            _link(n, port, subject, name),
            _net_health(n, port, subject, name, hccn),
            _ip(n, port, subject, name, hccn),
        ]
    except Exception as exc:  # a bug one port's data triggers is that port's unknown
        return [
            result.unknown(
                "accel.internal", subject, f"internal error judging {subject}: {type(exc).__name__}: {exc}"
            )
        ]


def _link(n, port, subject, name) -> result.Result:
    link = port.get("link")
    command = f"hccn_tool -i {n} -link -g"
    if link == LINK_UP:
        return result.ok("accel.hccn_link", subject, f"link UP ({command})")
    if link == LINK_DOWN:
        return result.fail(
            "accel.hccn_link", subject, f"link DOWN ({command}); expected UP", f"{name} port link DOWN"
        )
    if link is None:
        return result.unknown("accel.hccn_link", subject, f"link state not read: {_why(port, 'link')}")
    return result.unknown("accel.hccn_link", subject, f"unreadable link state {shown(link)}")


def _net_health(n, port, subject, name, hccn) -> result.Result:
    health = port.get("net_health")
    command = f"hccn_tool -i {n} -net_health -g"
    if health == NET_HEALTH_OK:
        return result.ok("accel.hccn_health", subject, f"net_health Success ({command})")
    if health in HCCN_NET_HEALTH:
        maker = result.fail if hccn.net_health == result.FAIL else result.degraded
        return maker(
            "accel.hccn_health",
            subject,
            f"net_health {health} ({command}); expected Success (accel.hccn.net_health: {hccn.net_health})",
            f"{name} port net_health {health}",
        )
    if health is None:
        return result.unknown(
            "accel.hccn_health", subject, f"net_health not read: {_why(port, 'net_health')}"
        )
    return result.unknown("accel.hccn_health", subject, f"unreadable net_health {shown(health)}")


def _ip(n, port, subject, name, hccn) -> result.Result:
    ip, mask = port.get("ip"), port.get("netmask")
    command = f"hccn_tool -i {n} -ip -g"
    if ipv4(ip):
        return result.ok("accel.hccn_ip", subject, f"{ip}" + (f" netmask {mask}" if ipv4(mask) else ""))
    if ip is not None or "ip" not in port:
        return result.unknown("accel.hccn_ip", subject, f"unreadable address {shown(ip)}")
    errors = port.get("errors")
    if isinstance(errors, dict) and (errors.get("ip") or errors.get("hccn_tool")):
        return result.unknown("accel.hccn_ip", subject, f"address not read: {_why(port, 'ip')}")
    if not isinstance(errors, dict) and errors is not None:
        return result.unknown("accel.hccn_ip", subject, f"unreadable port errors {shown(errors)}")
    if hccn.require_ip:
        return result.fail(
            "accel.hccn_ip",
            subject,
            f"no IPv4 address ({command}); expected one (accel.hccn.require_ip)",
            f"{name} port no IP",
        )
    return result.ok("accel.hccn_ip", subject, "no IPv4 address (not required: accel.hccn.require_ip false)")
