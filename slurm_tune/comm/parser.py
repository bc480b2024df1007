"""parse(data) -> CommLog: one log's bytes, as the epilog read them, to the facts they show.

One pass over the lines. A line NCCL wrote (its ` NCCL INFO ` / ` NCCL WARN ` marker found: prefix.py) goes
to the reader of its message's first four characters (READERS), a WARN to problems.read_warn; any other
line, launcher prefixes stripped, is tried as NCCL's message without its prefix (BARE_STARTS), then as a
benchmark table (tables.read_table), then as PyTorch / HCCL / nccl-tests / traceback / mpirun output
(problems.read_other); what none of them takes is counted as not understood. Whatever the bytes, parse returns a CommLog and never raises: an internal
error gives an empty CommLog whose `error` field names it (verdict: unknown).
"""

from __future__ import annotations

from collections.abc import Callable

from . import channels, netinfo, problems, tables
from .cap import CUT_MARKER, DAMAGED, LINE_MAX, NODE_CAP, capped, split_lines
from .model import CommLog
from .prefix import BARE_MARKS, INFO_MARK, WARN_MARK, Hosts, strip_wrappers
from .state import State

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
        return data.encode("utf-8", "replace")
    return b""


def _parse(data: bytes) -> CommLog:
    size = len(data)
    data, skipped = capped(data, NODE_CAP)
    lines, partial = split_lines(data)
    dirty = b"\x00" in data or not data.isascii()  # else no line can hold NUL or U+FFFD: skip the checks
    st = State()
    hosts = Hosts(st)
    seen = hosts.seen
    readers = READERS
    count = nccl = damaged = cuts = 0
    check = dirty or max(map(len, lines), default=0) > LINE_MAX
    last = ""  # the last prefix looked at: consecutive lines mostly share theirs
    # the hot loop: most lines are NCCL INFO lines of no interest, so they cost a find, a slice, a lookup
    for line in lines:
        if not line:
            continue
        count += 1
        if check and (len(line) > LINE_MAX or DAMAGED[0] in line or DAMAGED[1] in line):
            damaged += 1
            continue
        i = line.find(INFO_MARK)
        if i < 0:
            i = line.find(WARN_MARK)
            if i < 0 and not line.startswith(BARE_MARKS):
                cuts += _other(st, line)
                continue
            nccl += 1
            prefix, msg = (line[:i], line[i + 11 :]) if i >= 0 else ("", line[10:])
            if i > 0 and prefix not in seen:
                hosts.see(prefix)
            if i >= 0 or line.startswith("NCCL WARN "):
                problems.read_warn(st, prefix, msg)
                continue
        else:
            nccl += 1
            if i and (i != len(last) or not line.startswith(last)):
                last = line[:i]
                if last not in seen:
                    hosts.see(last)
            reader = readers.get(line[i + 11 : i + 15])
            if reader is None:
                if "net.cc:" in line:
                    netinfo.read_trace(st, line[i + 11 :])
                continue
            msg = line[i + 11 :]
            if not reader(st, msg) and "net.cc:" in msg:
                netinfo.read_trace(st, msg)
            continue
        reader = readers.get(msg[:4])
        if (reader is None or not reader(st, msg)) and "net.cc:" in msg:
            netinfo.read_trace(st, msg)  # only the plugin loader's traces (net.cc) say anything
    st.lines, st.nccl_lines, st.damaged = count - cuts, nccl, damaged
    return st.freeze(
        partial=partial, cut=cuts > 0 or skipped > 0, bytes_read=size - skipped, bytes_skipped=skipped
    )


def _other(st: State, line: str) -> int:
    """A line that is not NCCL's prefixed output; 1 for the cut marker (not a line of the log), else 0."""
    text = strip_wrappers(line)
    if not text:
        return 0
    if text == CUT_MARKER:
        return 1
    if text.startswith(BARE_STARTS):
        reader = READERS.get(text[:4])
        if reader is not None and reader(st, text):
            st.bare_lines += 1
            return 0
    elif text.startswith(BARE_QUIET):
        st.bare_lines += 1
        return 0
    if not (tables.read_table(st, text) or problems.read_other(st, text)):
        st.not_understood += 1
    return 0
