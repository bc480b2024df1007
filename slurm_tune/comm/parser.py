"""parse(data) -> CommLog: one log's bytes, as the epilog read them, to the facts they show.

One pass over the lines. A line NCCL wrote (prefix.split_nccl) goes to the reader of its message's first
four characters (READERS), a WARN to problems.read_warn; any other line, launcher prefixes stripped, is
tried as NCCL's message without its prefix (BARE_STARTS), then as PyTorch / HCCL / nccl-tests / traceback /
mpirun output (problems.read_other), then as a benchmark table (tables.read_table); what none of them takes
is counted as not understood. Whatever the bytes, parse returns a CommLog and never raises: an internal
error gives an empty CommLog whose `error` field names it (verdict: unknown).
"""

from __future__ import annotations

from collections.abc import Callable

from . import channels, netinfo, problems, tables
from .cap import CUT_MARKER, DAMAGED, LINE_MAX, NODE_CAP, capped, split_lines
from .model import CommLog
from .prefix import WARN, Hosts, split_nccl, strip_wrappers
from .state import State, note

Reader = Callable[[State, str], bool]

READERS: dict[str, Reader] = {
    "Chan": channels.read_channel,
    "Ring": channels.read_channel,
    "Usin": netinfo.read_using,
    "NET/": netinfo.read_net,
    "NCCL": netinfo.read_nccl,
    "RCCL": netinfo.read_rccl_banner,
    "ROCr": netinfo.read_rccl_banner,
    "HIP ": netinfo.read_rccl_banner,
    "ROCm": netinfo.read_rccl_banner,
    "Libr": netinfo.read_rccl_banner,
    "Succ": netinfo.read_plugin_lines,
    "Init": netinfo.read_plugin_lines,
    "P2P ": netinfo.read_plugin_lines,
    "Plug": netinfo.read_plugin_lines,
    "TUNE": netinfo.read_plugin_lines,
    "PROF": netinfo.read_plugin_lines,
    "Boot": netinfo.read_bootstrap,
    "Fail": netinfo.read_failed,
}

# NCCL's messages that are read when a line has no NCCL prefix: specific starts only, so that other
# programs' lines are not taken for NCCL's. The second group is understood and has nothing to keep.
BARE_STARTS = (
    "NCCL version ",
    "RCCL version",
    "Using network ",
    "NET/IB ",
    "NET/IB:",
    "NET/Socket ",
    "NET/Plugin",
    "NET/OFI ",
    "NCCL_",
    "Bootstrap",
    "P2P plugin ",
    "Channel ",
    "Ring ",
    "Plugin Path ",
    "Successfully loaded external plugin ",
    "Initialized NET plugin ",
    "Failed to open libibverbs",
    "HIP version",
    "ROCm version",
    "Librccl path",
)
BARE_QUIET = (
    "cudaDriverVersion ",
    "Comm config ",
    "PROFILER/Plugin",
    "TUNER/Plugin",
    "ncclCommInit",
    "RAS client ",
    "MNNVL busId",
    "Setting affinity for GPU",
    "NVLS multicast support",
    "Connected all",
)


def parse(data: bytes) -> CommLog:
    """The facts of one log. Never raises (see the module's docstring)."""
    try:
        return _parse(_as_bytes(data))
    except Exception as exc:  # a parser bug must not cost the epilog: the log is then unknown
        return CommLog(error=f"{type(exc).__name__}: {exc}"[:160])


def _as_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape")
    return b""


def _parse(data: bytes) -> CommLog:
    size = len(data)
    data, skipped = capped(data, NODE_CAP)
    lines, partial = split_lines(data)
    dirty = b"\x00" in data or not data.isascii()  # else no line can hold NUL or U+FFFD: skip the checks
    st = State()
    hosts = Hosts()
    cut = skipped > 0
    readers = READERS
    for line in lines:
        if not line:
            continue
        st.lines += 1
        if len(line) > LINE_MAX or (dirty and any(bad in line for bad in DAMAGED)):
            st.damaged += 1
            continue
        found = split_nccl(line)
        if found is not None:
            level, prefix, msg = found
            st.nccl_lines += 1
            host = hosts.of(prefix) if prefix else ""
            if host:
                note(st.hosts, host, limit=64)
            if level == WARN:
                problems.read_warn(st, prefix, msg)
                continue
            reader = readers.get(msg[:4])
            if (reader is None or not reader(st, msg)) and " -> " in msg:
                netinfo.read_trace(st, msg)
            continue
        text = strip_wrappers(line)
        if not text:
            continue
        if text == CUT_MARKER:
            cut = True
            st.lines -= 1
            continue
        if text.startswith(BARE_STARTS):
            reader = readers.get(text[:4])
            if reader is not None and reader(st, text):
                st.bare_lines += 1
                continue
        elif text.startswith(BARE_QUIET):
            st.bare_lines += 1
            continue
        if problems.read_other(st, text) or tables.read_table(st, text):
            continue
        st.not_understood += 1
    return st.freeze(partial=partial, cut=cut, bytes_read=size - skipped, bytes_skipped=skipped)
