"""`ibnetdiscover` output -> Slurm topology.conf (topology/tree).

ibnetdiscover prints one block per device: a `Switch N "S-<guid>" # "<description>" ...` or
`Ca N "H-<guid>" # "<description>"` header, then one line per connected port:
`[1]	"H-<guid>"[1](<portguid>) 		# "node01 HCA-1" lid 5 4xHDR`. Links are read from both ends.

- A host's name is the first word of its HCA's description (`node01 mlx5_0` -> node01); descriptions the
  driver leaves at its default (`MT4123 ConnectX6 Mellanox Technologies`) name no host and are skipped.
- A leaf switch is one with hosts on it; each level above lists the switches below it that it links to.
- Rail-optimised nodes have one HCA per rail, on different leaves. Slurm's tree wants each node on one leaf,
  so a node goes under the leaf of its first HCA in name order (HCA-1, mlx5_0: rail 0), or of the HCA
  `--hca NAME` names; `--all-rails` lists it under every leaf instead. The output says which nodes hang off
  several leaves.
- A switch's name comes from its description (`MF0;leaf01:MQM8700/U1` -> leaf01), else its GUID.
- `ibnetdiscover -g` group headers (`Non-Chassis Nodes`, `Chassis 3 (guid 0x...)`) and `[ext N]` port
  numbers are read through. ibnetdiscover's own warnings on stderr, when a saved dump caught them
  (`ibwarn: [pid] ...`, `src/query_smp.c:199; umad (...) bad status 110`, `ibnetdiscover: iberror: ...`),
  are skipped and counted: they mean part of the fabric may be missing from the dump.
- `--node-name-map FILE` (ibnetdiscover's and opensm's format: `<guid> "<name>"` per line, `#` comments)
  names HCAs and switches by GUID, for fabrics whose HCAs keep the driver's default description.
"""

from __future__ import annotations

import re
from collections import namedtuple

from ..errors import ConfigError
from ..hostlist import compress_hostlist

_HEADER = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR]-[0-9a-fA-F]+)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s+"([SHR]-[0-9a-fA-F]+)"\[(\d+)\]'
    r"(?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$"
)
_KEYS = ("vendid=", "devid=", "sysimgguid=", "switchguid=", "caguid=", "routerguid=")
_QUOTED = re.compile(r'"([^"]*)"')
_GROUP = re.compile(r"^(Non-Chassis Nodes|Chassis \d+(\s+\(.*\))?)$")
_WARNING = re.compile(r"^(ib(warn|panic|debug|info|error)\b|\S*\.c:\d+;|\S+: iberror:)")
_MAP_LINE = re.compile(r'^(0x[0-9a-fA-F]+|[0-9a-fA-F]+)\s+"([^"]*)"')


class Device(namedtuple("Device", "id kind description")):
    """kind: switch, ca or router; id: `S-<guid>` / `H-<guid>` / `R-<guid>`."""

    __slots__ = ()


class Fabric(namedtuple("Fabric", "devices links warnings", defaults=(0,))):
    """devices by id; links: a set of frozenset({id_a, id_b}); warnings: ibnetdiscover warning lines skipped."""

    __slots__ = ()


def parse_ibnetdiscover(text: str, source: str = "<stdin>", names: dict[int, str] | None = None) -> Fabric:
    """`names`: node GUID -> name (a node name map); a mapped name replaces the device's description."""
    devices: dict[str, Device] = {}
    links: set[frozenset] = set()
    current: str | None = None
    warnings = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith(_KEYS) or _GROUP.match(line):
            continue
        if _WARNING.match(line):
            warnings += 1
            continue
        header = _HEADER.match(line)
        if header:
            kind = {"Switch": "switch", "Ca": "ca", "Rt": "router"}[header.group(1)]
            current = header.group(3)
            devices[current] = Device(current, kind, header.group(4) or "")
            continue
        port = _PORT.match(line)
        if port is None:
            raise ConfigError(source, lineno, "", f"not ibnetdiscover output: {line[:60]!r}")
        if current is None:
            raise ConfigError(source, lineno, "", "a port line before any Switch or Ca header")
        remote = port.group(3)
        links.add(frozenset((current, remote)))
        if remote not in devices:  # seen only from this end so far: keep its description if printed
            comment = port.group(6) or ""
            quoted = _QUOTED.search(comment)
            kind = {"S": "switch", "H": "ca", "R": "router"}[remote[0]]
            devices[remote] = Device(remote, kind, quoted.group(1) if quoted else "")
    if not any(d.kind == "switch" for d in devices.values()):
        extra = f" ({warnings} ibnetdiscover warning line(s): did the discovery fail?)" if warnings else ""
        raise ConfigError(source, None, "", f"no switch found: is this ibnetdiscover output?{extra}")
    if names:
        for dev_id, dev in list(devices.items()):
            name = names.get(int(dev_id[2:], 16))
            if name is not None:
                devices[dev_id] = dev._replace(description=name)
    return Fabric(devices, links, warnings)


def parse_node_name_map(text: str, source: str) -> dict[int, str]:
    """ibnetdiscover's --node-name-map format: `<guid> "<name>"` per line; `#` starts a comment."""
    names = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _MAP_LINE.match(line)
        if m is None:
            raise ConfigError(source, lineno, "", f'expected <guid> "<name>", got {line[:60]!r}')
        names[int(m.group(1), 16)] = m.group(2)
    return names


def empty_reason(fabric: Fabric, *, matched: bool, hca: str | None) -> str:
    """Why no node was placed on any switch, in words an admin can act on."""
    cas = [d for d in fabric.devices.values() if d.kind == "ca"]
    unnamed = [d for d in cas if host_name(d.description) is None]
    if cas and len(unnamed) == len(cas):
        example = unnamed[0].description or "(empty)"
        return (
            f"no node found on any switch: all {len(cas)} HCA(s) keep a description that names no host "
            f"(e.g. {example!r}, the driver's default). Set each node's description (rdma-core's rdma-ndd "
            "does, or `echo $(hostname -s) mlx5_0 > /sys/class/infiniband/mlx5_0/node_desc`) and rerun "
            "ibnetdiscover, or pass --node-name-map FILE (GUID -> host name)"
        )
    if not cas:
        return "no node found on any switch: the dump lists no HCA at all"
    if not matched:
        return "no node found on any switch: no host name matches --match"
    if hca:
        return f"no node found on any switch: no HCA is described as {hca!r} (--hca)"
    return "no node found on any switch"


def host_name(description: str) -> str | None:
    if not description or "Mellanox Technologies" in description:
        return None
    word = description.split()[0] if description.split() else ""
    return word if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", word) else None


def switch_name(device: Device) -> str:
    desc = device.description.strip()
    if ";" in desc:
        desc = desc.split(";", 1)[1].split(":", 1)[0]
    elif " " in desc or not desc:
        desc = ""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", desc)
    return name or "ibsw_" + device.id[2:].lower().lstrip("0")


def _natural(text: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


class Topology(namedtuple("Topology", "leaves parents multi_leaf notes warnings", defaults=(0,))):
    """leaves: switch name -> node names; parents: [(switch name, child switch names)] from the level above
    the leaves up; multi_leaf: node -> the leaves its HCAs reach (when more than one); notes: lines for the output
    (HCAs that name no host, a virtual root)."""

    __slots__ = ()


def build_topology(fabric: Fabric, *, keep=None, hca: str | None = None, all_rails: bool = False) -> Topology:
    """`keep(name)` filters node names; `hca` picks the rail by the HCA's description word (e.g. mlx5_0)."""
    devices = fabric.devices
    neighbours: dict[str, set[str]] = {}
    for link in fabric.links:
        ends = tuple(link)
        if len(ends) != 2:
            continue
        a, b = ends
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    names: dict[str, str] = {}
    taken: set[str] = set()
    for dev in sorted((d for d in devices.values() if d.kind == "switch"), key=lambda d: d.id):
        name = switch_name(dev)
        if name in taken:
            name = f"{name}_{dev.id[-4:].lower()}"
        names[dev.id] = name
        taken.add(name)
    notes: list[str] = []
    # host -> [(hca description, leaf switch id)]
    rails: dict[str, list[tuple[str, str]]] = {}
    for dev in devices.values():
        if dev.kind != "ca":
            continue
        host = host_name(dev.description)
        if host is None:
            notes.append(f"skipped {dev.id}: its description {dev.description!r} names no host")
            continue
        if keep is not None and not keep(host):
            continue
        for other in sorted(neighbours.get(dev.id, ())):
            if devices.get(other) is not None and devices[other].kind == "switch":
                rails.setdefault(host, []).append((dev.description, other))
    leaves: dict[str, set[str]] = {}
    multi_leaf: dict[str, list[str]] = {}
    for host, entries in rails.items():
        entries.sort(key=lambda e: _natural(e[0]))
        reached = sorted({names[s] for _, s in entries}, key=_natural)
        if len(reached) > 1:
            multi_leaf[host] = reached
        if all_rails:
            chosen = [s for _, s in entries]
        else:
            picked = [e for e in entries if hca and hca in e[0].split()[1:]] if hca else entries
            if not picked:
                notes.append(f"skipped {host}: no HCA described as {hca!r}")
                continue
            chosen = [picked[0][1]]
        for switch in chosen:
            leaves.setdefault(switch, set()).add(host)
    height = _heights(devices, neighbours)
    parents: list[tuple[str, list[str]]] = []
    level = set(leaves)
    while level:
        above: dict[str, set[str]] = {}
        for switch in level:
            for other in neighbours.get(switch, ()):
                if (
                    devices.get(other) is not None
                    and devices[other].kind == "switch"
                    and height.get(other) == height[switch] + 1
                ):
                    above.setdefault(other, set()).add(switch)
        for switch, children in sorted(above.items(), key=lambda kv: _natural(names[kv[0]])):
            parents.append((names[switch], sorted((names[c] for c in children), key=_natural)))
        level = set(above)
    root = _virtual_root(leaves, parents, names)
    if root:
        parents.append(root)
        notes.append(
            f"{root[0]} is a virtual root: no switch links all leaves, and Slurm lets no job span "
            "switches without a common parent"
        )
    return Topology(
        {names[s]: sorted(h, key=_natural) for s, h in leaves.items()},
        parents,
        multi_leaf,
        notes,
        fabric.warnings,
    )


def _virtual_root(leaves, parents, names) -> tuple[str, list[str]] | None:
    """Leaves cabled to each other with no switch above all of them (small fabrics) would split the tree:
    Slurm lets no job span them. A virtual root over the top switches keeps the fabric one tree."""
    below: dict[str, set[str]] = {names[s]: {names[s]} for s in leaves}
    for switch, children in parents:
        below[switch] = set().union(*(below.get(c, set()) for c in children))
    child_names = {c for _, children in parents for c in children}
    tops = sorted((s for s in below if s not in child_names), key=_natural)
    everything = {names[s] for s in leaves}
    if len(tops) < 2 or any(below[t] >= everything for t in tops):
        return None
    name = "fabric"
    while name in below:
        name += "_root"
    return name, tops


def _heights(devices, neighbours) -> dict[str, int]:
    """Each switch's distance in hops from the nearest host HCA (a leaf is 1): the tree's levels, so a
    storage leaf next to the spines is not taken for a switch above them."""
    height: dict[str, int] = {}
    frontier = [d for d in devices if devices[d].kind == "ca"]
    distance = 0
    seen = set(frontier)
    while frontier:
        distance += 1
        nxt = []
        for dev in frontier:
            for other in neighbours.get(dev, ()):
                if other in seen or devices.get(other) is None or devices[other].kind != "switch":
                    continue
                seen.add(other)
                height[other] = distance
                nxt.append(other)
        frontier = nxt
    return height


def render(topology: Topology, source: str) -> str:
    nodes = sorted({h for hs in topology.leaves.values() for h in hs}, key=_natural)
    lines = [
        f"# topology.conf for topology/tree, written by `stune-admin topology` from {source}",
        f"# {len(topology.leaves)} leaf switch(es), {len(topology.parents)} switch(es) above them, "
        f"{len(nodes)} node(s)",
    ]
    lines.extend(
        f"# {host} reaches leaves {','.join(leaves)}"
        for host, leaves in sorted(topology.multi_leaf.items(), key=lambda kv: _natural(kv[0]))
    )
    lines.extend(f"# {note}" for note in topology.notes)
    if topology.warnings:
        lines.append(
            f"# skipped {topology.warnings} ibnetdiscover warning line(s): parts of the fabric may be "
            "missing; rerun ibnetdiscover"
        )
    lines.extend(
        f"SwitchName={switch} Nodes={compress_hostlist(topology.leaves[switch])}"
        for switch in sorted(topology.leaves, key=_natural)
    )
    lines.extend(
        f"SwitchName={switch} Switches={compress_hostlist(children)}" for switch, children in topology.parents
    )
    return "\n".join(lines) + "\n"
