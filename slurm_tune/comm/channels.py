"""Channel lines: which transport each connection NCCL set up went through, and for NET ones, with GDR or not.

The forms, as NCCL versions print them (the capture that shows each):
- `Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA` (peers as rank[busId]; nccl707)
- `Channel 03/0 : 4[4] -> 11[3] [receive] via NET/IB/3/GDRDMA` (rank[nvmlDev], channel/connIndex; tpgds)
- `Ring 00 : 1[18100000] -> 0[435e00000] [send] via NET/IB/0` (old Ring form; ncclTests36)
- `Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0` (bare ranks, a plugin's name; awsofi24)
- `Channel 00/0 : 2[0] -> 0[0] [send] via NET/IBext_v8/1` (the plugin's name in the path; ncclTests373)
- `via P2P/IPC`, `via P2P/IPC/read` (nccl834), `via P2P/CUMEM/read`, `via P2P/direct pointer`, `via SHM/direct/direct`
- newer NCCL adds `(proxyRank)` after the device (`NET/IB/0(8)/GDRDMA`), `(PCI)` after GDRDMA and `/Shared`.
Only `/GDRDMA` on a NET line proves GPUDirect RDMA, per direction: ncclTests36 receives with it and sends
without. `Channel 00/16 :    0   7   6 ...` and `Ring 00 : 0 1 2 3` list a ring's order: understood, no transport.

A line counts only when it matches one of these forms whole: a cut or corrupted line (`.../GDRD`, a flag
NCCL never prints) is not a channel, so it cannot pass for a channel without GDR.
"""

from __future__ import annotations

import re

from .state import INTERNAL_NETS, State, bump

_PEER = r"[0-9]{1,9}(?:\[[0-9a-fA-F]{1,16}\])?"
_CHANNEL = re.compile(
    rf"(?:Channel|Ring) [0-9]{{1,4}}(?:/[0-9]{{1,4}})? : {_PEER} -> {_PEER}(?: \[(send|receive)\])? via (.{{1,96}})"
)
_ORDER = re.compile(r"(?:Channel|Ring) [0-9]{1,4}(?:/[0-9]{1,4})? :(?: +-?[0-9]{1,9})+ *")
_NET = re.compile(
    r"NET/([A-Za-z][A-Za-z0-9_. -]{0,40}?)/[0-9]{1,4}(?:\([0-9]{1,9}\))?(/GDRDMA(?:\(PCI\))?)?(?:/Shared)?"
)
_P2P = re.compile(r"P2P/([A-Za-z][A-Za-z ]{0,30}?)(?:/[A-Za-z]{1,16})?")
_SHM = re.compile(r"SHM(?:/[A-Za-z]{1,16}){0,3}")

_paths: dict[str, tuple[str, bool] | None] = {}
_PATHS_MAX = 1024


def transport_of(path: str) -> tuple[str, bool] | None:
    """`NET/IB/5/GDRDMA` -> ('NET/IB', True); `P2P/IPC/read` -> ('P2P/IPC', False); `SHM/direct/direct`
    -> ('SHM', False); anything else -> None. Cached: a log has a handful of distinct paths."""
    if path in _paths:
        return _paths[path]
    found: tuple[str, bool] | None = None
    m = _NET.fullmatch(path)
    if m:
        found = ("NET/" + m.group(1), m.group(2) is not None)
    elif (m := _P2P.fullmatch(path)) is not None:
        found = ("P2P/" + m.group(1), False)
    elif _SHM.fullmatch(path):
        found = ("SHM", False)
    if len(_paths) < _PATHS_MAX:
        _paths[path] = found
    return found


def read_channel(st: State, msg: str) -> bool:
    """A `Channel ...` / `Ring ...` message: a connection (counted) or a ring order (understood)."""
    m = _CHANNEL.fullmatch(msg)
    if m is None:
        return _ORDER.fullmatch(msg) is not None
    path = m.group(2)
    found = _paths[path] if path in _paths else transport_of(path)
    if found is None:
        return False
    transport, gdr = found
    direction = m.group(1) or ""
    if (transport[:4] == "NET/") != bool(direction):
        return False  # NCCL names the direction of NET lines, and only of those
    key = (transport, direction, gdr)
    if key in st.channels:
        st.channels[key] += 1
    else:
        bump(st.channels, key, limit=64)
    if direction and (st.plugins_failed or st.pending_plugin):
        net = transport[4:]
        if net in INTERNAL_NETS:
            st.internal_used(net, "channels")
        elif st.pending_plugin:
            st.pending_plugin = ""  # the plugin carries channels: it works
    return True
