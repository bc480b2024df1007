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

_HOST = re.compile(
    r"(?:^|[\s\]>:])([A-Za-z0-9][A-Za-z0-9._-]{0,62}):[0-9]{1,10}:[0-9]{1,10} \[[0-9]{1,6}\](?: \S{1,512})?"
)
_WRAPPER = re.compile(
    r"(?:\s*(?:\[[0-9]{1,7}(?:,[0-9]{1,7})*\](?:<std(?:out|err)>:)?|\[rank[0-9]{1,7}\]:"
    r"|[0-9]{1,7}:(?= )|\[?[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]{1,9})?)?\]?))+\s*"
)
BARE_MARKS = ("NCCL INFO ", "NCCL WARN ")  # the marker at the very start: a prefix stripped to nothing
_WRAPPER_STARTS = frozenset(" \t[0123456789")
_CACHE_MAX = 4096


class Hosts:
    """Notes the host of each prefix in the State, once per distinct prefix (they repeat: one per process and
    thread). After _CACHE_MAX distinct prefixes, new ones are not looked at: hosts are a bounded list anyway."""

    def __init__(self, st) -> None:
        self.seen: set[str] = set()  # the parser skips these without a call
        self._hosts = st.hosts

    def see(self, prefix: str) -> None:
        if prefix in self.seen or len(self.seen) >= _CACHE_MAX:
            return
        self.seen.add(prefix)
        host = _last_host(prefix)
        if host and host not in self._hosts and len(self._hosts) < 64:
            self._hosts[host] = None


def _last_host(prefix: str) -> str:
    """The last `host:pid:tid [dev]` of the prefix: launchers' prefixes come before it."""
    last = [m.group(1) for m in _HOST.finditer(prefix)]
    return last[-1] if last else ""


def strip_wrappers(line: str) -> str:
    """The line without launchers' prefixes (`[0] `, `[1,26]<stdout>:`, ` 0: `, `[rank1]: `, timestamps)
    and surrounding blanks."""
    if line[:1] not in _WRAPPER_STARTS:
        return line.strip()  # no launcher prefix starts with a letter: skip the regular expression
    m = _WRAPPER.match(line)
    return (line[m.end() :] if m else line).strip()
