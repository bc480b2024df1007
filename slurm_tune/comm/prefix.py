"""Line prefixes: where NCCL's message starts in a line, and which host the line names.

NCCL prefixes its lines `host:pid:tid [cudaDev] NCCL INFO message`; a WARN line puts its source location
before the level, `host:pid:tid [dev] transport/net_ib.cc:788 NCCL WARN message`. What launched or collected
the output may add its own prefix before that: mpirun's `[0] ` (nccl-nvls-mpiprefix-nccl1453) or
`[1,26]<stdout>:` (nccl-ofi-libfabric-old-awsofi24), srun's ` 0: ` (rccltests-allgather-srunlabel-rccl1490),
a log collector's timestamp (torch-watchdog-timeout-nccl1610), NCCL 2.26's own `[2025-02-18 12:54:00] ` on
WARN lines. An INFO line can even be glued inside a row of nccl-tests' table (ncclperf-interleaved-nccl1453).
So an NCCL line is found by its marker wherever it is, and the host is the `host:pid:tid [dev]` just before.

Lines without NCCL's prefix (a poster stripped it: nccl-ib-sharp-noprefix-nccl1584; the `NCCL version ...`
line, which NCCL prints bare) are read after the launchers' prefixes are stripped (`strip_wrappers`).
"""

from __future__ import annotations

import re

INFO_MARK, WARN_MARK = " NCCL INFO ", " NCCL WARN "
INFO, WARN = "INFO", "WARN"

_HOST = re.compile(
    r"(?:^|[\s\]>:])([A-Za-z0-9][A-Za-z0-9._-]{0,62}):[0-9]{1,10}:[0-9]{1,10} \[[0-9]{1,6}\](?: \S{1,512})?"
)
_WRAPPER = re.compile(
    r"(?:\s*(?:\[[0-9]{1,7}(?:,[0-9]{1,7})*\](?:<std(?:out|err)>:)?|\[rank[0-9]{1,7}\]:"
    r"|[0-9]{1,7}:(?= )|\[?[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]{1,9})?)?\]?))+\s*"
)
_CACHE_MAX = 4096


def split_nccl(line: str) -> tuple[str, str, str] | None:
    """(level, prefix, message) of a line NCCL wrote (INFO or WARN), else None. The prefix is all before
    the marker (launcher prefixes, the host part, a WARN's source location)."""
    i = line.find(INFO_MARK)
    if i >= 0:
        return INFO, line[:i], line[i + 11 :]
    i = line.find(WARN_MARK)
    if i >= 0:
        return WARN, line[:i], line[i + 11 :]
    if line.startswith(("NCCL INFO ", "NCCL WARN ")):
        return line[5:9], "", line[10:]
    return None


class Hosts:
    """host of a prefix, cached: the prefixes repeat (one per process and thread)."""

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def of(self, prefix: str) -> str:
        host = self._cache.get(prefix)
        if host is None:
            # the last match: the host part ends the prefix (launchers' prefixes come before it)
            last = [m.group(1) for m in _HOST.finditer(prefix)]
            host = last[-1] if last else ""
            if len(self._cache) < _CACHE_MAX:
                self._cache[prefix] = host
        return host


def strip_wrappers(line: str) -> str:
    """The line without launchers' prefixes (`[0] `, `[1,26]<stdout>:`, ` 0: `, `[rank1]: `, timestamps)
    and surrounding blanks."""
    m = _WRAPPER.match(line)
    return (line[m.end() :] if m else line).strip()
