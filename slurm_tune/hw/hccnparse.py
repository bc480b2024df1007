"""hccn_tool's outputs (an Ascend NPU's on-card RoCE port) and the Ascend version files: pure parsers.

Each hccn_tool parser takes what one command printed and returns (value, why): the value as the tool gave it,
or None and one line saying why not. A value is taken only in the form the tool prints it; anything else is
None (unknown), so noise can never read as a port that is DOWN or unhealthy.

    hccn_tool -i N -link -g         link status: UP                  (UP or DOWN)
    hccn_tool -i N -net_health -g   net health status: Success       (NET_HEALTH's words)
    hccn_tool -i N -ip -g           ipaddr:10.86.1.80                (`key:value`, with or without a space;
                                    netmask:255.255.255.0             an empty ipaddr: no address set)
    hccn_tool -i N -lldp -g         `Chassis ID TLV`, then its indented lines (the switch port it is cabled to)
    hccn_tool -i N -stat -g         [devid 3] qp_alloc: 1            (counters)

Version files (key=value lines): /usr/local/Ascend/driver/version.info and firmware/version.info
(`Version=24.1.rc2`), the CANN toolkit's ascend_toolkit_install.info (`version=8.1.RC1.alpha001`).
"""

from __future__ import annotations

from ..vendors import HCCN_LINK, HCCN_NET_HEALTH
from .amdvalues import count, text, version

LINK, NET_HEALTH = HCCN_LINK, HCCN_NET_HEALTH  # hccn_tool's words (vendors.py)
_NET_HEALTH = {word.lower(): word for word in NET_HEALTH}
ERROR_COUNTER_WORDS = ("err", "drop", "fail", "bad")
MAX_LINES = 4096  # more than any of these outputs has; the rest is not looked at


def _lines(output: str) -> list[str]:
    return output.splitlines()[:MAX_LINES] if isinstance(output, str) else []


def _keyed(output: str, key: str) -> list[str]:
    """The values of every `key: value` line whose key is `key` (any case, any spacing around the colon)."""
    found = []
    for line in _lines(output):
        name, sep, value = line.partition(":")
        if sep and " ".join(name.split()).lower() == key:
            found.append(value.strip())
    return found


def _said(output: str) -> str:
    """The output's first non-empty line, short and printable, to say what the tool printed instead."""
    line = next((s.strip() for s in _lines(output) if s.strip()), "")
    return repr(line[:60]) if line else "nothing"


def parse_link(output: str) -> tuple[str | None, str]:
    """UP or DOWN from `link status: UP`."""
    found = _keyed(output, "link status")
    if len(found) == 1 and found[0].upper() in LINK:
        return found[0].upper(), ""
    return None, f"no link status in hccn_tool's output ({_said(output)})"


def parse_net_health(output: str) -> tuple[str | None, str]:
    """One of NET_HEALTH from `net health status: Success`."""
    found = _keyed(output, "net health status")
    word = _NET_HEALTH.get(" ".join(found[0].split()).lower()) if len(found) == 1 else None
    if word is not None:
        return word, ""
    return None, f"no net health status in hccn_tool's output ({_said(output)})"


def ipv4(value) -> str | None:
    """A dotted-quad IPv4 address as given, else None."""
    parts = value.split(".") if isinstance(value, str) and len(value) <= 15 else []
    ok = len(parts) == 4 and all(p.isascii() and p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts)
    return value if ok else None


def parse_ip(output: str) -> tuple[str | None, str | None, str]:
    """(ip, netmask, why) from `ipaddr:...` and `netmask:...` (two lines, or one). Both keys there with an
    empty ipaddr is a port without an address: (None, None, ""); anything else unreadable (a cut output
    included) is (None, None, why). A readable ipaddr with a garbled netmask keeps the ipaddr."""
    ips, masks = _keyed(output, "ipaddr"), _keyed(output, "netmask")
    ip_text, _, rest = ips[0].partition(" ") if len(ips) == 1 else ("", "", "")
    key, sep, value = rest.strip().partition(":")
    if sep and key.strip().lower() == "netmask":  # `ipaddr:10.30.12.9 netmask:255.255.255.0`
        masks.append(value.strip())
    elif rest.strip():
        ips = []
    if len(ips) != 1 or len(masks) != 1:
        return None, None, f"no ipaddr and netmask in hccn_tool's output ({_said(output)})"
    if not ip_text:  # no address, when that is all the output says (a stray line: something else happened)
        if sum(1 for line in _lines(output) if line.strip()) == 1 + (not sep):
            return None, None, ""
        return None, None, f"an empty ipaddr among other lines ({_said(output)})"
    ip, mask = ipv4(ip_text), ipv4(masks[0])
    if ip is None:
        return None, None, f"ipaddr is not an IPv4 address ({_said(output)})"
    return ip, mask, "" if mask is not None or not masks[0] else "netmask is not an IPv4 address"


def parse_lldp(output: str) -> dict:
    """{"tlvs": {TLV name: [its lines]}, "peer": {...}} of `hccn_tool -lldp -g`: the switch end of the link.
    peer: chassis_id, port (`Ifname: 400GE1/1/20:2`), system_name, system_description (its first line),
    capabilities, mgmt_ip (IPv4; a masked one is None), max_frame_size; None where not given."""
    tlvs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in _lines(output):
        stripped = line.strip()
        if stripped.endswith(" TLV") and line[:1] not in (" ", "\t") and len(stripped) <= 80:
            current = tlvs.setdefault(" ".join(stripped[:-4].split()), [])
        elif current is not None and stripped and len(current) < 64:
            current.append(" ".join(stripped.split())[:256])

    def first(tlv: str, key: str | None = None) -> str | None:
        """The TLV's first line (its value after `Name: `), or the value of its line `key: value`."""
        for line in tlvs.get(tlv, []):
            name, sep, value = line.partition(": ")
            if key is None:
                return text(value if sep else line)
            if sep and name.lower() == key:
                return text(value)
        return None

    frame = count(first("Maximum Frame Size"))
    peer = {
        "chassis_id": first("Chassis ID"),
        "port": first("Port ID"),
        "system_name": first("System Name"),
        "system_description": first("System Description"),
        "capabilities": first("System Capabilities", "enabled capabilities"),
        "mgmt_ip": ipv4(first("Management Address", "ipv4")),
        "max_frame_size": frame if frame is not None and 0 < frame <= 1 << 20 else None,
    }
    return {"tlvs": tlvs, "peer": peer}


def parse_stat(output: str) -> dict:
    """{"devid": int | None, "counters": {name: int}, "error_counters": {name: int}} of `hccn_tool -stat -g`
    (`[devid 3] qp_alloc: 1`); error_counters are those named for errors, drops and failures."""
    devids: set[int] = set()
    counters: dict[str, int] = {}
    for line in _lines(output):
        head, sep, rest = line.strip().partition("]")
        words = head.split()
        if not sep or len(words) != 2 or words[0] != "[devid":
            continue
        devid = count(words[1])
        name, sep, value = rest.partition(":")
        name, n = " ".join(name.split()), count(value.strip())
        if devid is None or not sep or not name or len(name) > 64 or n is None or len(counters) >= 1024:
            continue
        devids.add(devid)
        counters[name] = n
    errors = {k: v for k, v in counters.items() if any(w in k.lower() for w in ERROR_COUNTER_WORDS)}
    return {
        "devid": devids.pop() if len(devids) == 1 else None,
        "counters": counters,
        "error_counters": errors,
    }


def parse_key_values(output: str) -> dict[str, str]:
    """`key=value` lines (version.info, ascend_toolkit_install.info), keys in lower case; the first wins."""
    out: dict[str, str] = {}
    for line in _lines(output):
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if sep and key and len(key) <= 64:
            out.setdefault(key, value.strip())
    return out


def parse_version_file(output: str) -> str | None:
    """The version a driver or firmware version.info (`Version=24.1.rc2`) or a CANN toolkit's
    ascend_toolkit_install.info (`version=8.1.RC1.alpha001`) gives; None if none."""
    values = parse_key_values(output)
    return version(values.get("version")) or version(values.get("package_version"))
