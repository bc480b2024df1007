"""NIC, network, plugin, version and environment lines: what NCCL found and chose.

The forms (the capture that shows each):
- `Using network IB|IBext|IBext_v8|Socket|AWS Libfabric` (nccl988, nccl1584, ncclTests179); NCCL 2.4 printed
  none: there `NET/IB : No device found.` with `NET/Socket : Using ...` and no plugin means Socket (nccl226).
- `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB/SHARP [RO]; OOB eth0:10.0.1.2<0>` (nccl988, nccl1584) and the
  merged-port form `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={...}` (ncclTests373).
- `NET/Socket : Using [0]ens3:172.31.10.182<0>` (nccl226, nccl1053); `Bootstrap : Using eth0:10.0.1.2<0>`.
- `NET/IB : GPU Direct RDMA Enabled for GPU 435e00000 / HCA 0 (distance 1 < 2), read 0` (ncclTests36),
  `... Disabled for ...` with the reason (`distance 4 > 2`, `no module`); hints only, channels prove GDR.
- plugins: `NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)`, `Loaded collnet plugin SHARP (v8)`
  (nccl1584), `Successfully loaded external plugin libnccl-net.so`, `Initialized NET plugin AWS Libfabric`
  (tpgds), `P2P plugin IBext` (nccl988); none installed: `NET/Plugin : No plugin found (libnccl-net.so).`
  (nccl226), `Plugin load returned 2 : ...`, `Using internal network plugin.` (rcclTests163). `Failed to find
  ncclNetPlugin_v9 symbol.` is NCCL probing a plugin's versions, not a failure.
- a loaded plugin that fails: the plugin loader's call trace `plugin/net.cc:118 -> 2` after it (tpgds:
  aws-ofi-nccl loaded, initialised, then `NET/OFI Invalid type of PCI bus` and the trace; NCCL then reads
  NCCL_IB_* and connects through its own NET/IB).
- versions: `NCCL version 2.4.7+cuda9.2` (bare, nccl226), prefixed (`... NCCL INFO NCCL version 2.27.5+...`),
  garbage builds `+cudaCUDA_MAJOR.CUDA_MINOR` (nccl562), RCCL's banner `RCCL version : 2.21.5-HEAD:9a0e6a1`.
- `NCCL_IB_DISABLE set by environment to 1.`, `NCCL_IB_HCA set to mlx5_0,...` (nccl1053, tpgds).
"""

from __future__ import annotations

import re

from .model import EXAMPLE_MAX, Nic
from .state import INTERNAL_NETS, State, name, note

_NIC = re.compile(
    r"\[([0-9]{1,3})\] ?([A-Za-z0-9_.-]{1,64}):([0-9]{1,3})/(IB/SHARP|RoCE/SHARP|IB|RoCE)(?=[\s,}\[]|$)"
)
_GROUP = re.compile(r"\[([0-9]{1,3})\]=\{([^{}]{0,4000})\}")
_SOCKET_IF = re.compile(r"\[[0-9]{1,3}\]([^\s:\[\]<>]{1,64}):")
_IFACE = re.compile(r"([^\s:\[\]<>]{1,64}):")
_GDR = re.compile(
    r"GPU Direct RDMA (Enabled|Disabled) for (?:GPU [0-9a-fA-Fx]{1,20} / )?HCA \S{1,64}"
    r"(?: \('?([^()]{1,40}?)'?\))?(?:, read ([01])(?![0-9]))?\.?"
)
_VERSION = re.compile(
    r"(?:NCCL|RCCL) version\s?:?\s?([0-9]{1,4}(?:\.[0-9]{1,6}){1,3})(?![0-9])(?:[+-](\S{1,64}))?.{0,200}"
)
_ENV = re.compile(r"((?:NCCL|RCCL)_[A-Z0-9_]{1,48}) set (?:by environment )?to (\S{0,128}?)\.?")
_TRACE = re.compile(r"(\S{1,256}):([0-9]{1,6}) -> ([0-9]{1,4})(?: \[[A-Za-z ]{1,32}\])?")
_LOADER = ("net.cc", "plugin/net.cc", "src/net.cc", "src/plugin/net.cc")


def read_using(st: State, msg: str) -> bool:
    if msg.startswith("Using network "):
        net = msg[14:].strip()
        if not net or len(net) > 64 or not net.replace("_", "").replace(" ", "").isalnum():
            return False
        note(st.networks, net)
        if net in INTERNAL_NETS:
            st.internal_used(net, "network")
        elif st.pending_plugin:
            st.pending_plugin = ""  # the plugin's network is the one in use
        return True
    return msg.startswith("Using ")  # `Using non-device net plugin version 0` and the like


def read_net(st: State, msg: str) -> bool:
    """`NET/IB ...`, `NET/Socket ...`, `NET/Plugin ...`, `NET/OFI ...` messages."""
    kind = msg[4:7]
    if kind == "Plu":
        if msg.startswith("NET/Plugin"):
            return _read_plugin(st, msg.split(":", 1)[1].strip() if ":" in msg else "")
        return True
    if kind == "OFI":
        if msg.startswith("NET/OFI Selected Provider is "):
            note(st.ofi_providers, name(msg[29:].split(" ", 1)[0]))
        return True
    if msg.startswith(("NET/IB : Using ", "NET/IB: Using ")):
        return _read_nics(st, msg[msg.index("Using ") + 6 :])
    if msg.startswith(("NET/IB : No device found", "NET/IB: No device found")):
        st.ib_no_device = True
        return True
    if "GPU Direct RDMA" in msg:
        return _read_gdr(st, msg)
    if msg.startswith(("NET/Socket : Using ", "NET/Socket: Using ")):
        for m in _SOCKET_IF.finditer(msg):
            note(st.socket_ifs, m.group(1))
        return True
    return True  # other NET/ lines (qpn, Dev, OFI details): NCCL's, nothing to keep


def _read_nics(st: State, rest: str) -> bool:
    if rest in st.nic_lines:  # every rank prints its node's list: read each list once
        if st.nic_lines[rest]:
            st.internal_used("IB", "network")
        return st.nic_lines[rest]
    seen = _nics(st, rest)
    if len(st.nic_lines) < 64:
        st.nic_lines[rest] = seen
    return seen


def _nics(st: State, rest: str) -> bool:
    listed, _, oob = rest.partition("; OOB ")
    seen = False
    for group in _GROUP.finditer(listed):
        for m in _NIC.finditer(group.group(2)):
            note(st.nics, Nic(name(m.group(2)), int(m.group(3)), m.group(4), int(group.group(1))))
            seen = True
    if not seen:
        for m in _NIC.finditer(listed):
            note(st.nics, Nic(name(m.group(2)), int(m.group(3)), m.group(4)))
            seen = True
    if oob and (iface := _IFACE.match(oob.strip())) is not None:
        note(st.bootstrap_ifs, iface.group(1))
    if seen:
        st.internal_used("IB", "network")
    return seen


def _read_gdr(st: State, msg: str) -> bool:
    m = _GDR.search(msg)
    if m is None:
        return False
    if not msg.startswith("NET/IB"):
        return True  # `NET/Socket : GPU Direct RDMA Disabled for HCA 0 'lo'`: sockets never have GDR
    if m.group(1) == "Enabled":
        st.gdr_enabled += 1
        if m.group(3) == "0":
            st.gdr_read_off = True
    else:
        st.gdr_disabled += 1
        if m.group(2) and not st.gdr_distance:
            st.gdr_distance = m.group(2).strip()[:40]
    return True


def _read_plugin(st: State, what: str) -> bool:
    if what.startswith("Loaded net plugin "):
        st.plugin_loaded(_plugin_name(what[18:]))
    elif what.startswith("Loaded collnet plugin "):
        note(st.collnet_plugins, name(_plugin_name(what[22:])))
    elif what.startswith(("No plugin found", "Plugin load returned", "Using internal network plugin")):
        st.no_plugin = True
    if "librccl" in what:
        st.rccl = True
    return True


def _plugin_name(text: str) -> str:
    """`NCCL RDMA Plugin v8 (v8)` -> `NCCL RDMA Plugin v8`; `AWS Libfabric (v6)` -> `AWS Libfabric`."""
    text = text.strip().rstrip(".")
    if text.endswith(")") and " (" in text:
        text = text[: text.rindex(" (")]
    return text


def read_nccl(st: State, msg: str) -> bool:
    """`NCCL version ...`, `NCCL_X set by environment to Y.`, `NCCL_IB_HCA set to ...`."""
    if msg.startswith(("NCCL version", "RCCL version")):
        return read_version(st, msg)
    m = _ENV.fullmatch(msg)
    if m is None:
        return msg.startswith("NCCL")
    var, value = m.group(1), m.group(2)
    if var not in st.env and len(st.env) < 32:
        st.env[var] = value[:64]
    if var.startswith("NCCL_IB_") and var != "NCCL_IB_DISABLE":
        st.internal_used("IB", "init")  # NCCL's own IB transport reads these as it starts
    return True


def read_version(st: State, msg: str) -> bool:
    m = _VERSION.fullmatch(msg)
    if m is None:
        return False
    if msg.startswith("RCCL"):
        st.rccl = True
    if not st.version:
        st.version = m.group(1)
        st.build = (m.group(2) or "")[:64]
    return True


def read_rccl_banner(st: State, msg: str) -> bool:
    """RCCL's banner and ROCm lines (`RCCL version : ...`, `HIP version  : ...`, `ROCm version : ...`,
    `Librccl path : ...`, `ROCr version 1.14`)."""
    if msg.startswith("RCCL version"):
        return read_version(st, msg)
    st.rccl = True
    return True


def read_plugin_lines(st: State, msg: str) -> bool:
    """`Successfully loaded external plugin X`, `Initialized NET plugin X`, `P2P plugin IBext`, `Plugin
    Path : ...`, the tuner's and profiler's plugin lines."""
    if msg.startswith("Successfully loaded external plugin "):
        if not st.pending_plugin:
            st.plugin_loaded(msg[36:].strip())
    elif msg.startswith("Initialized NET plugin "):
        plugin = name(msg[23:].strip())
        if plugin in INTERNAL_NETS:
            st.internal_used(plugin, "network")
        else:
            library = st.pending_plugin
            if library.endswith(".so") and library != plugin:
                st.net_plugins.pop(library, None)  # `Successfully loaded X.so`: now the plugin's own name
            st.plugin_loaded(plugin)
    elif msg.startswith("P2P plugin "):
        # the SHARP plugin says this once it serves point-to-point: it works (older ones print no `Loaded`)
        if not st.net_plugins:
            st.plugin_loaded(msg[11:].strip())
        st.pending_plugin = ""
    if "librccl" in msg:
        st.rccl = True
    return True


def read_bootstrap(st: State, msg: str) -> bool:
    rest = msg.split("Using", 1)[1].strip() if "Using" in msg else ""
    m = _SOCKET_IF.match(rest) or _IFACE.match(rest)
    if m is not None:
        note(st.bootstrap_ifs, m.group(1))
    return True


def read_failed(st: State, msg: str) -> bool:
    if msg.startswith("Failed to open libibverbs"):
        st.ibverbs_missing = True
    return True


def read_trace(st: State, msg: str) -> bool:
    """A call-trace line `file.cc:NNN -> code`; the plugin loader's (net.cc) after a plugin loaded is its
    failure."""
    m = _TRACE.fullmatch(msg)
    if m is None:
        return False
    path = m.group(1)
    if m.group(3) != "0" and (path in _LOADER or path.endswith("/plugin/net.cc")):
        st.plugin_failed(msg[:EXAMPLE_MAX])
    return True
