"""Node events from Slurm's accounting: when a node went DOWN or was drained, and why. They say which node of
a failed job broke and what broke it, which sacct's job rows cannot.

    SLURM_TIME_FORMAT=%s sacctmgr -n -P show event event=node start=2025-01-01T00:00:00 \
        format=NodeName,TimeStart,TimeEnd,State,Reason

One line per event, `n2|1796237175|1796237175|DOWN|stune: gpu3 Xid 79` (Reason, free text, last; TimeEnd is
`Unknown` while the event lasts). Only DOWN, DRAIN and FAIL events are kept. A reason is read as:
- `health`: stune's own (`stune: ...`, the health checks' drain; `Xid N` in it gives the hardware code) or
  another health checker's (`NHC: ...`);
- `slurm`: Slurm's own (`Not responding`, `Kill task failed`, `Node unexpectedly rebooted`, a prolog or
  epilog error): the node failed, the reason says how it looked to slurmctld;
- `admin`: anything else, an operator's words (`bios update`, `bad PSU`).
A line that cannot be read is skipped and counted, never fatal.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from ..fairshare.sacct_values import epochs

HEALTH, SLURM, ADMIN = "health", "slurm", "admin"
KINDS = (HEALTH, SLURM, ADMIN)
FORMAT = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason")
DOWN_WORDS = frozenset(("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"))
HEALTH_PREFIXES = ("stune: ", "NHC: ", "NHC ")
SLURM_REASONS = (
    "Not responding",
    "Kill task failed",
    "Node unexpectedly rebooted",
    "Prolog error",
    "Epilog error",
    "prolog error",
    "epilog error",
    "batch job complete failure",
    "Low RealMemory",
    "Low TmpDisk",
    "Low socket*core*thread count",
    "Low CPUs",
    "Node silently failed and came back",
    "NO NETWORK ADDRESS FOUND",
    "Node shutdown",
    "Health check failed",
)
REASON_MAX = 200
# An event is evidence about a run that ended in [event - AFTER_S, event + BEFORE_S]: slurmctld kills the
# jobs of a node it sets DOWN in the same second, and the health run drains a node whose GPU crashed a job
# within its interval (HealthCheckInterval, commonly 5 minutes) of the crash.
BEFORE_S = 300
AFTER_S = 900


class Event:
    __slots__ = ("node", "start", "end", "state", "reason", "kind", "xid")

    def __init__(self, node: str, start: int, end: int, state: str, reason: str):
        self.node, self.start, self.end, self.state = node, start, end, state
        self.reason = reason[:REASON_MAX]
        self.kind, self.xid = classify(self.reason)

    @property
    def code(self) -> str:
        """The short code the report shows: `xid79`, or the reason's own words (shortened)."""
        if self.xid is not None:
            return f"xid{self.xid}"
        reason = self.reason.removeprefix("stune: ").strip()
        return reason[:40] or self.kind

    def __repr__(self) -> str:
        return f"Event({self.node!r}, {self.start}, {self.state!r}, {self.reason!r})"


def classify(reason: str) -> tuple[str, int | None]:
    """(kind, Xid code or None) of an event's reason."""
    if reason.startswith(HEALTH_PREFIXES):
        return HEALTH, _xid(reason)
    if reason.startswith(SLURM_REASONS):
        return SLURM, None
    return ADMIN, None


def _xid(reason: str) -> int | None:
    """The code of the first `Xid N` in a reason (`stune: gpu3 Xid 79 (+1 more)` -> 79): a word `Xid`, then
    a number of at most 4 digits (NVIDIA's codes are below 1000)."""
    at = reason.find("Xid ")
    while at >= 0:
        digits = ""
        for ch in reason[at + 4 : at + 9]:
            if not ("0" <= ch <= "9"):
                break
            digits += ch
        if 0 < len(digits) <= 4 and (at == 0 or not reason[at - 1].isalnum()):
            return int(digits)
        at = reason.find("Xid ", at + 1)
    return None


class Events:
    """Node events by node, each node's in time order; `skipped` lines could not be read."""

    def __init__(self, events: Iterable[Event] = (), skipped: int = 0, source: str = "") -> None:
        self.by_node: dict[str, list[Event]] = {}
        for ev in events:
            self.by_node.setdefault(ev.node, []).append(ev)
        self._starts: dict[str, list[int]] = {}
        for node, evs in self.by_node.items():
            evs.sort(key=lambda e: e.start)
            self._starts[node] = [e.start for e in evs]
        self.skipped, self.source = skipped, source

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_node.values())

    def near(self, node: str, end: int) -> list[Event]:
        """The node's events that started within [end - BEFORE_S, end + AFTER_S] of a run's end."""
        starts = self._starts.get(node)
        if not starts:
            return []
        lo = bisect.bisect_left(starts, end - BEFORE_S)
        hi = bisect.bisect_right(starts, end + AFTER_S)
        return self.by_node[node][lo:hi]

    def warnings(self) -> list[str]:
        return (
            [f"{self.skipped} unreadable node event line(s) skipped ({self.source})"] if self.skipped else []
        )


def parse(text: str, source: str = "sacctmgr show event") -> Events:
    """`sacctmgr -n -P show event ... format=NodeName,TimeStart,TimeEnd,State,Reason` into Events."""
    rows, skipped = [], 0
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("|", len(FORMAT) - 1)
        if len(cols) != len(FORMAT) or not cols[0] or cols[0] == "NodeName":
            skipped += cols[0] != "NodeName"  # (a header line, when the dump was made without -n)
            continue
        rows.append(cols)
    if not rows:
        return Events((), skipped, source)
    starts = epochs([r[1] for r in rows])
    ends = epochs([r[2] for r in rows])
    out = []
    for (node, _, _, state, reason), start, end in zip(rows, starts.tolist(), ends.tolist()):
        if start < 0 or end < -1 or len(node) > 256 or "," in node:
            skipped += 1
            continue
        if not DOWN_WORDS & set(state.upper().split("+")):
            continue  # not a node that went out of service
        out.append(Event(node, start, end, state, reason))
    return Events(out, skipped, source)


def read_file(path: str) -> Events:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse(fh.read(1 << 26), path)


def read_live(slurm, start: str, end: str | None = None) -> Events:
    return parse(slurm.node_events_dump(start, end))
