"""Why each run ended, and which of its nodes a failure is laid on: the one home of the cause rules, read by
the lemon scoring and the reliability report alike.

A run's cause starts from its sacct State, then stronger evidence overrides it:

| State | cause | category |
| --- | --- | --- |
| COMPLETED | none: not an interruption | |
| NODE_FAIL, BOOT_FAIL | node_failure (admin: an operator's DOWN, from the node events) | unexpected |
| FAILED, OUT_OF_MEMORY | user (the program exited non-zero) | unexpected |
| TIMEOUT, DEADLINE | timeout | planned |
| CANCELLED | cancelled | planned |
| PREEMPTED | preempted | planned |
| REQUEUED, REQUEUE_HOLD, REQUEUE_FED, REVOKED, SPECIAL_EXIT | requeued | planned |
| RUNNING, SUSPENDED, ... | none yet: the run has not ended | |
| anything else | other | other |

- The stored transport verdict (AdminComment `comm=`, usage/jobfiles.py): a FAILED or TIMEOUT run whose NCCL
  logged errors on some node is `nccl`; the nodes whose verdict is `errors` are its suspects when they are
  not all of the run's nodes (when every node saw errors, the failure names no node).
- Node events (events.py) on the run's nodes around its end: a health event (stune's drain, with the Xid
  code when its reason names one) makes a node_failure, user, nccl or timeout run `hardware` and names its
  suspects; Slurm's own reason (`Not responding`) keeps a NODE_FAIL a node_failure and names the node; an
  operator's DOWN under a NODE_FAIL run makes it `admin` (unexpected for the job, as the Llama 3 paper counts
  host maintenance; not the machine's failure: neither MTTF nor the lemons count it).
Without events (`--no-events`, or a dump without `--events-file`) the causes are sacct's alone, and a GPU
fault that crashed a program reads as `user`: the report says so.

Lemons are scored on the infrastructure failures (hardware, nccl, node_failure) of multi-node runs; user
failures are the program's own and say nothing about a node.
"""

from __future__ import annotations

import numpy as np

from ..comm import encoding as wire
from ..usage.jobfiles import parse_comm
from ..usage.pipeline import admin_fields
from .events import ADMIN, AFTER_S, BEFORE_S, HEALTH, SLURM, Events
from .history import Runs

HARDWARE, NCCL, NODE_FAILURE, USER = "hardware", "nccl", "node_failure", "user"
ADMIN_CAUSE, TIMEOUT, CANCELLED, PREEMPTED, REQUEUED, OTHER = (
    "admin",
    "timeout",
    "cancelled",
    "preempted",
    "requeued",
    "other",
)
CAUSES = (HARDWARE, NCCL, NODE_FAILURE, USER, ADMIN_CAUSE, TIMEOUT, CANCELLED, PREEMPTED, REQUEUED, OTHER)
INDEX = {c: i for i, c in enumerate(CAUSES)}
NONE = -1  # completed, or not ended
UNEXPECTED = frozenset((HARDWARE, NCCL, NODE_FAILURE, USER, ADMIN_CAUSE))
INFRA = frozenset((HARDWARE, NCCL, NODE_FAILURE))  # the machine's failures: MTTF, lemons
LOSES_WORK = UNEXPECTED | {PREEMPTED}  # killed without a chance to checkpoint (ETTR)
CATEGORY = {c: ("unexpected" if c in UNEXPECTED else "other" if c == OTHER else "planned") for c in CAUSES}

STATE_CAUSE = {
    "NODE_FAIL": NODE_FAILURE,
    "BOOT_FAIL": NODE_FAILURE,
    "FAILED": USER,
    "OUT_OF_MEMORY": USER,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
    "CANCELLED": CANCELLED,
    "PREEMPTED": PREEMPTED,
    "REQUEUED": REQUEUED,
    "REQUEUE_HOLD": REQUEUED,
    "REQUEUE_FED": REQUEUED,
    "REVOKED": REQUEUED,
    "SPECIAL_EXIT": REQUEUED,
}
NOT_ENDED = frozenset(
    (
        "COMPLETED",
        "RUNNING",
        "PENDING",
        "SUSPENDED",
        "RESIZING",
        "CONFIGURING",
        "COMPLETING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    )
)
# which event kinds refine which sacct cause, and into what
_BY_EVENT = {
    NODE_FAILURE: {HEALTH: HARDWARE, SLURM: NODE_FAILURE, ADMIN: ADMIN_CAUSE},
    USER: {HEALTH: HARDWARE},
    NCCL: {HEALTH: HARDWARE},
    TIMEOUT: {HEALTH: HARDWARE},
}
_KIND_RANK = {HEALTH: 0, SLURM: 1, ADMIN: 2}
_ERRORS_WIRE = f"{wire.FORMAT};{wire.escape('errors')};"  # how a node's `errors` verdict starts on the line


class Causes:
    """Per run: `cause` (an index into CAUSES, NONE when the run completed or has not ended), `code` (row ->
    the detail: `xid79`, Slurm's or an operator's reason, `errors on n[3]`), `suspects` (row -> the nodes a
    failure is laid on, only where the evidence names some: else it is laid on all the run's nodes),
    `caught` (rows whose failure a health check also saw: a health event) and whether events were read."""

    def __init__(self, cause: np.ndarray, with_events: bool) -> None:
        self.cause = cause
        self.code: dict[int, str] = {}
        self.suspects: dict[int, tuple[str, ...]] = {}
        self.caught: set[int] = set()
        self.with_events = with_events

    def name(self, i: int) -> str:
        c = int(self.cause[i])
        return "" if c == NONE else CAUSES[c]

    def mask(self, names) -> np.ndarray:
        wanted = np.array([INDEX[c] for c in names], dtype=self.cause.dtype)
        return np.isin(self.cause, wanted)


def _state_cause(state: str) -> int:
    if state in NOT_ENDED:
        return NONE
    return INDEX[STATE_CAUSE.get(state, OTHER)]


def classify(runs: Runs, events: Events | None = None) -> Causes:
    """Every run's cause (the module's rules)."""
    table = np.array([_state_cause(s) for s in runs.states] or [NONE], dtype=np.int8)
    out = Causes(table[runs.state] if runs.n else np.zeros(0, dtype=np.int8), events is not None)
    _from_transport(runs, out)
    if events is not None and len(events):
        _from_events(runs, events, out)
    return out


def _from_transport(runs: Runs, out: Causes) -> None:
    for i, comment in runs.comments.items():
        cause = CAUSES[out.cause[i]] if out.cause[i] != NONE else ""
        if cause not in (USER, TIMEOUT):
            continue  # a NODE_FAIL's NCCL errors are its survivors' (their peer died): no evidence
        if _ERRORS_WIRE not in comment:
            continue  # no node's verdict is `errors` (decoding every verdict of a year costs seconds)
        try:
            verdict, counts = parse_comm(admin_fields(comment))
        except Exception:  # the line is anyone's text: a verdict that cannot be read is no evidence
            continue
        if verdict is None:
            continue
        hosts = runs.hosts(i)
        errors = set(verdict.nodes_with("errors"))
        named = tuple(h for h in hosts if h in errors)
        if not named:
            continue
        out.cause[i] = INDEX[NCCL]
        # The line keeps the worst COMM_NODES_KEPT nodes: it names the nodes with errors only when every
        # node with a finding is in it (commn's judged - ok), and then only when they are not all the nodes.
        findings = sum(
            len(nodes) for status, nodes in verdict.by_status if status not in ("ok", "not_judged")
        )
        complete = counts is not None and findings == counts[0] - counts[1]
        if complete and len(named) < len(hosts):
            out.suspects[i] = named
            out.code[i] = f"errors on {','.join(named[:4])}"
        else:
            out.code[i] = "errors"


def _from_events(runs: Runs, events: Events, out: Causes) -> None:
    """Each event against the runs that ended near it on its node (runs sorted by end: a binary search per
    event, so a year of events costs little)."""
    refinable = out.mask(_BY_EVENT) & (runs.end >= 0)
    rows = np.flatnonzero(refinable)
    if not len(rows):
        return
    order = rows[np.argsort(runs.end[rows], kind="stable")]
    ends = runs.end[order]
    found: dict[int, list] = {}
    for node, evs in events.by_node.items():
        for ev in evs:
            lo = np.searchsorted(ends, ev.start - AFTER_S, "left")
            hi = np.searchsorted(ends, ev.start + BEFORE_S, "right")
            for i in order[lo:hi].tolist():
                if node in runs.hosts(i):
                    found.setdefault(i, []).append(ev)
    for i, evs in found.items():
        refine = _BY_EVENT[CAUSES[out.cause[i]]]
        usable = [e for e in evs if e.kind in refine]
        if not usable:
            continue
        best = min(_KIND_RANK[e.kind] for e in usable)
        chosen = sorted(
            (e for e in usable if _KIND_RANK[e.kind] == best), key=lambda e: (e.xid is None, e.start)
        )
        out.cause[i] = INDEX[refine[chosen[0].kind]]
        out.code[i] = chosen[0].code
        nodes = tuple(dict.fromkeys(e.node for e in chosen))
        out.suspects[i] = nodes
        if best == _KIND_RANK[HEALTH]:
            out.caught.add(i)
