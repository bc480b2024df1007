"""HCCL's rank table (RANK_TABLE_FILE) for a multi-node job on an Ascend partition, and the device map each
node publishes for it (issue 26; docs/accelerators.md, "Communication settings").

HCCL's rank table v1.0 lists every node of the job (`server_id`: its host address) with the NPUs the job uses
there (`device_id`, the on-card RoCE port's `device_ip`) and each one's global `rank_id`, every number as a
string. A node's device IPs are known only on that node (`hccn_tool -i N -ip -g`), and the batch step's
TaskProlog runs on the first node before any other node runs a task, so the map must exist before the job:
the periodic health run (root) publishes its node's map into the shared usage spool (`publish`,
`<spool>/devices/<node>.json`, only when it changed), and every node's TaskProlog builds the same table from
the job's allocation and the published maps (`build`), in the job's directory on that node.

Plain data and small functions: the TaskProlog of an Ascend job imports it (off the other vendors' path).
"""

from __future__ import annotations

import json
import os

from ..safeio import read_small, write_atomic

DEVICES_DIR = "devices"  # below the shared usage spool
MAX_MAP_BYTES = 65536
MAX_DEVICES = 64  # per node: gpu.count's bound
VERSION = "1.0"


def ipv4(text) -> bool:
    """A dotted-quad IPv4 address as hccn_tool prints it (no leading zeros beyond 0 itself, each part 0-255)."""
    if not isinstance(text, str) or not text.isascii() or len(text) > 15:
        return False
    parts = text.split(".")
    return len(parts) == 4 and all(
        p.isdigit() and (p == "0" or not p.startswith("0")) and int(p) <= 255 for p in parts
    )


def device_map(section) -> dict[int, str]:
    """{device id: its port's IPv4 address} from an `accel` section's `ports` (hw/accel.py): the devices whose
    address is known; anything malformed is left out."""
    ports = section.get("ports") if isinstance(section, dict) else None
    out: dict[int, str] = {}
    for key, port in (ports if isinstance(ports, dict) else {}).items():
        address = port.get("ip") if isinstance(port, dict) else None
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 3 and ipv4(address):
            out[int(key)] = str(address)
    return out


def _path(spool: str, node: str) -> str | None:
    if not node or "/" in node or node.startswith(".") or "\0" in node or len(node) > 255:
        return None
    return os.path.join(spool, DEVICES_DIR, f"{node}.json")


def publish(spool: str, node: str, section, host_ip: str | None = None) -> bool:
    """Write this node's device map (`device_map(section)`, and its host address on the socket interface when
    known: the rank table's server_id) for the rank tables of later jobs, atomically, world-readable, only when
    it differs from what is there; False when nothing was written (no address known, or unchanged). Raises
    OSError (FileWriteError) when the spool cannot be written."""
    devices = device_map(section)
    path = _path(spool, node)
    if not devices or path is None:
        return False
    doc: dict[str, object] = {"node": node, "devices": {str(k): v for k, v in sorted(devices.items())}}
    if ipv4(host_ip):
        doc["host_ip"] = host_ip
    text = json.dumps(doc, sort_keys=True)
    if read_small(path, limit=MAX_MAP_BYTES) == text.encode() + b"\n":
        return False
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, text + "\n", mode=0o644)
    return True


class Published:
    """A node's published map: its devices' addresses, and the server_id a rank table gives it."""

    __slots__ = ("devices", "server_id")

    def __init__(self, devices: dict[int, str], server_id: str):
        self.devices, self.server_id = devices, server_id


def read_published(spool: str, node: str, owner: int | None = 0) -> tuple[Published | None, str]:
    """(a node's published map, "") or (None, why): read bounded, a regular file root wrote (`owner`, one link):
    a user cannot plant another node's addresses. The server_id is the node's host address where the node
    published one, else its name."""
    path = _path(spool, node)
    if path is None:
        return None, f"{node!r} is not a node name"
    data = read_small(path, limit=MAX_MAP_BYTES, owner=owner, single_link=True)
    if data is None:
        return None, f"no device map published for {node} ({path}: the periodic health run writes it)"
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, f"{path}: not JSON"
    raw = doc.get("devices") if isinstance(doc, dict) and doc.get("node") == node else None
    if not isinstance(raw, dict) or len(raw) > MAX_DEVICES:
        return None, f"{path}: not {node}'s device map"
    devices = device_map({"ports": {k: {"ip": v} for k, v in raw.items()}})
    if len(devices) != len(raw) or not devices:
        return None, f"{path}: a device or address that is not one"
    host = doc.get("host_ip")
    return Published(devices, host if ipv4(host) else node), ""


def build(servers: list[tuple[str, list[int], dict[int, str]]]) -> dict:
    """The rank table of (server_id, the job's device ids there, the node's {device id: IPv4}) in the job's node
    order: ranks numbered in that order, then by device id. Raises ValueError naming a device without an
    address."""
    server_list = []
    rank = 0
    for server_id, devices, ips in servers:
        entries = []
        for dev in sorted(devices):
            if dev not in ips:
                raise ValueError(f"{server_id}: npu{dev} has no published address")
            entries.append({"device_id": str(dev), "device_ip": ips[dev], "rank_id": str(rank)})
            rank += 1
        server_list.append({"server_id": server_id, "device": entries, "host_nic_ip": "reserve"})
    return {
        "version": VERSION,
        "server_count": str(len(server_list)),
        "server_list": server_list,
        "status": "completed",
    }


def problems(table) -> list[str]:
    """What makes `table` not a valid v1.0 rank table (empty: valid): the keys and string-typed numbers, every
    device_ip an IPv4 address, rank_ids 0..n-1 each once, server_count the servers listed, no server twice."""
    if not isinstance(table, dict):
        return ["not a JSON object"]
    out = []
    if table.get("version") != VERSION or table.get("status") != "completed":
        out.append("version must be '1.0' and status 'completed'")
    servers = table.get("server_list")
    if not isinstance(servers, list) or not servers:
        return [*out, "server_list is missing or empty"]
    if table.get("server_count") != str(len(servers)):
        out.append(f"server_count {table.get('server_count')!r} but {len(servers)} servers")
    ranks: list[int] = []
    ids: set[str] = set()
    for i, server in enumerate(servers):
        sid = server.get("server_id") if isinstance(server, dict) else None
        if not isinstance(sid, str) or not sid or sid in ids:
            out.append(f"server {i}: a server_id of its own is needed")
        ids.add(str(sid))
        devices = server.get("device") if isinstance(server, dict) else None
        if not isinstance(devices, list) or not devices:
            out.append(f"server {sid}: no device")
            continue
        for dev in devices:
            if not isinstance(dev, dict) or not all(
                isinstance(dev.get(k), str) for k in ("device_id", "rank_id")
            ):
                out.append(f"server {sid}: a device without string device_id and rank_id")
                continue
            if not ipv4(dev.get("device_ip")):
                out.append(
                    f"server {sid}: npu{dev['device_id']}: device_ip {dev.get('device_ip')!r} is not IPv4"
                )
            ranks.append(int(dev["rank_id"]) if dev["rank_id"].isdigit() else -1)
    if sorted(ranks) != list(range(len(ranks))):
        out.append(f"rank_ids are not 0..{len(ranks) - 1}, each once")
    return out
