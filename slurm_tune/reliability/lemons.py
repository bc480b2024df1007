"""Lemon nodes: a node that makes multi-node jobs fail more often than its share of node-hours, even when every
check passes. Scored per partition from sacct (history.py) and the failures' causes (causes.py).

The data: the partition's multi-node runs in the window, each run's time clipped to it (t_j, on k_j nodes),
and their infrastructure failures (hardware, nccl, node_failure: user failures are the program's own). A
failure whose evidence names nodes (a node event, NCCL errors on some nodes only) is laid on those nodes,
`localized`; any other is laid on every node of the run, `unlocalized`: a NODE_FAIL in a 64-node job says
only that one of the 64 broke.

The model: every node-second of a multi-node run carries the same hazard, except a lemon's, which carries r
times it. Per node n: X_n = sum of k_j t_j over the runs it was in (their node-seconds), H_n = sum of t_j
(its own). With the partition's rates lambda_A = unlocalized failures / node-seconds and lambda_B = localized
attributions / node-seconds, the failures laid on n have mean

    E_n(r) = lambda_A (X_n + (r - 1) H_n) + lambda_B r H_n

(a run containing n fails unlocalized at lambda_A (k_j - 1 + r) t_j; n is named at lambda_B r per second of
its own). E_n(1) is "its share"; `ratio` is the r that makes E_n(r) equal what was seen.

The test: one-sided Poisson, H0 "r <= margin" (health.lemon_margin, 1.5): p_n = P(Poisson(E_n(margin)) >= O_n).
Across the partition's nodes, Holm's step-down at family-wise alpha (health.lemon_alpha, 0.01): the smallest
p-value is held to alpha/N, the next to alpha/(N-1), ... Holm holds under any dependence between the nodes'
counts (nodes share runs), so a partition without a lemon shows one falsely with probability <= alpha per
run of the test. Each step explains the lemon it found away before the next: the runs it was in leave the
data (failures and exposure alike), so the nodes it shared failed runs with are judged on the runs without
it, not blamed for it. A node also needs health.lemon_min_failures (3) failed runs. The rates are estimated
from the data, the lemon's own failures included: that only makes E larger, so the test errs towards
"no lemon". Flagged means: with family-wise confidence 1 - alpha, this node breaks multi-node runs at more
than `margin` times the rate of its peers; `ratio_low` is that exact (Garwood) lower bound on r.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from .causes import CAUSES, INFRA, Causes
from .history import Runs
from .stats import fisher, holm_threshold, poisson_sf

CLOSEST_KEPT = 10  # nodes shown under the line, nearest first
JOBS_KEPT = 8  # failed job ids shown per node


@dataclass(frozen=True)
class Policy:
    window: int = 30 * 86400
    alpha: float = 0.01
    margin: float = 1.5
    min_failures: int = 3
    mark: bool = False

    @classmethod
    def from_health(cls, health) -> Policy:
        """From a profile's `health` section (its lemon_* keys)."""
        return cls(
            window=int(health.lemon_window),
            alpha=float(health.lemon_alpha),
            margin=float(health.lemon_margin),
            min_failures=int(health.lemon_min_failures),
            mark=bool(health.lemon_mark),
        )


@dataclass
class NodeScore:
    node: str
    failures: int  # failed runs laid on this node (O)
    expected: float  # its share: E(1)
    ratio: float | None  # the hazard ratio that explains O best (maximum likelihood)
    ratio_low: float  # the exact one-sided lower bound on r at `threshold`
    p_value: float  # of O under r = margin
    threshold: float  # what Holm held p_value to at its step
    lemon: bool
    node_hours: float  # its own hours in the partition's multi-node runs
    runs: int
    localized: int  # of `failures`, those whose evidence named this node
    caught: int  # of `failures`, those a health check also saw (a health event)
    causes: dict[str, int] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)


@dataclass
class LemonReport:
    partition: str
    since: int
    until: int
    policy: Policy
    runs: int  # multi-node runs in the window
    node_hours: float
    failures: int  # infrastructure failures of those runs
    localized: int
    unlocalized: int
    nodes: int  # nodes tested (N)
    with_events: bool
    lemons: list[NodeScore] = field(default_factory=list)
    closest: list[NodeScore] = field(default_factory=list)
    unusable: int = 0  # runs whose NodeList does not name NNodes nodes: left out

    def to_dict(self) -> dict:
        return asdict(self)


class _Data:
    """The partition's incidence of runs and nodes, with the sums the test needs, and the removal of a
    node's runs (the step that explains a lemon away)."""

    def __init__(self, names: list[str], members: list[np.ndarray], t: np.ndarray, kind: np.ndarray, named):
        self.names = names
        self.members, self.t, self.kind, self.named = members, t, kind, named  # kind: 0, 1 unloc., 2 loc.
        self.k = np.array([len(m) for m in members], dtype=np.float64)
        self.alive = np.ones(len(members), dtype=bool)
        n = len(names)
        self.X, self.H = np.zeros(n), np.zeros(n)
        self.OA, self.OB = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.runs = np.zeros(n, dtype=np.int64)
        self.node_s = self.fa = self.mb = 0.0
        flat = np.concatenate(members) if members else np.zeros(0, dtype=np.intp)
        self.row_of = np.repeat(np.arange(len(members)), self.k.astype(np.intp))
        self.flat = flat
        self._apply(np.ones(len(members), dtype=bool), +1)

    def _apply(self, rows: np.ndarray, sign: int) -> None:
        at = rows[self.row_of]
        nodes, row = self.flat[at], self.row_of[at]
        size = len(self.names)
        kt = self.k * self.t
        self.X += sign * np.bincount(nodes, weights=kt[row], minlength=size)
        self.H += sign * np.bincount(nodes, weights=self.t[row], minlength=size)
        self.runs += sign * np.bincount(nodes, minlength=size)
        unloc = self.kind[row] == 1
        self.OA += sign * np.bincount(nodes[unloc], minlength=size)
        for r in np.flatnonzero(rows & (self.kind == 2)).tolist():
            self.OB[self.named[r]] += sign
            self.mb += sign * len(self.named[r])
        self.node_s += sign * float(kt[rows].sum())
        self.fa += sign * float((rows & (self.kind == 1)).sum())

    def remove_node(self, node: int) -> None:
        rows = np.zeros(len(self.members), dtype=bool)
        rows[self.row_of[self.flat == node]] = True
        rows &= self.alive
        self.alive &= ~rows
        self._apply(rows, -1)

    def rates(self) -> tuple[float, float]:
        if self.node_s <= 0:
            return 0.0, 0.0
        return self.fa / self.node_s, self.mb / self.node_s


def score(
    runs: Runs, causes: Causes, partition: str, since: int, until: int, policy: Policy, now: int | None = None
) -> LemonReport:
    """The lemon test for one partition's multi-node runs in [since, until] (the module's rules)."""
    now = runs.as_of if now is None else now
    end = runs.ends(now)
    codes = [i for i, p in enumerate(runs.partitions) if p == partition]
    scope = np.isin(runs.partition, codes) & (runs.nodes >= 2) & (runs.start < until) & (end > since)
    failed = scope & causes.mask(INFRA) & (runs.end >= since) & (runs.end <= until)
    rows = np.flatnonzero(scope).tolist()
    index: dict[str, int] = {}
    members: list[np.ndarray] = []
    kinds: list[int] = []
    named: dict[int, np.ndarray] = {}
    keep_rows: list[int] = []
    unusable = 0
    for i in rows:
        hosts = runs.hosts(i)
        if len(hosts) != runs.nodes[i] or len(set(hosts)) != len(hosts):
            unusable += 1
            continue
        member = np.array([index.setdefault(h, len(index)) for h in hosts], dtype=np.intp)
        kind = 0
        if failed[i]:
            suspects = causes.suspects.get(i)
            kind = 2 if suspects else 1
            if suspects:
                named[len(members)] = np.array([index[h] for h in suspects if h in index], dtype=np.intp)
        members.append(member)
        kinds.append(kind)
        keep_rows.append(i)
    t = np.clip(np.minimum(end[keep_rows], until) - np.maximum(runs.start[keep_rows], since), 0, None)
    names = list(index)
    data = _Data(names, members, t.astype(np.float64), np.array(kinds, dtype=np.int8), named)
    report = LemonReport(
        partition=partition,
        since=since,
        until=until,
        policy=policy,
        runs=len(keep_rows),
        node_hours=data.node_s / 3600,
        failures=int(sum(1 for k in kinds if k)),
        localized=int(sum(1 for k in kinds if k == 2)),
        unlocalized=int(sum(1 for k in kinds if k == 1)),
        nodes=int((data.H > 0).sum()),
        with_events=causes.with_events,
        unusable=unusable,
    )
    _steps(data, report, policy, runs, causes, keep_rows)
    return report


def _steps(data: _Data, report: LemonReport, policy: Policy, runs: Runs, causes: Causes, rows: list[int]):
    """Holm's step-down, each found lemon explained away before the next step."""
    tested = report.nodes
    out: list[NodeScore] = []
    left = set(np.flatnonzero(data.H > 0).tolist())
    step = 0
    while left:
        threshold = holm_threshold(policy.alpha, tested, step)
        scores = [_node(data, n, policy, threshold) for n in sorted(left)]
        eligible = [s for s in scores if s.failures >= policy.min_failures]
        best = min(eligible, key=lambda s: (s.p_value, -s.failures, s.node), default=None)
        if best is None or best.p_value > threshold:
            closest = sorted(scores, key=lambda s: (s.p_value, -s.failures, s.node))
            report.closest = [s for s in closest if s.failures][:CLOSEST_KEPT]
            break
        best.lemon = True
        _bound(best, data, policy)
        _evidence(best, data, runs, causes, rows)
        out.append(best)
        node = data.names.index(best.node)
        data.remove_node(node)
        left.discard(node)
        step += 1
    report.lemons = out
    for s in report.closest:
        _bound(s, data, policy)
        _evidence(s, data, runs, causes, rows)


def _mean(data: _Data, n: int) -> tuple[float, float]:
    """(base, slope): the node's mean failures are base + slope x r at hazard ratio r."""
    la, lb = data.rates()
    return la * (float(data.X[n]) - float(data.H[n])), (la + lb) * float(data.H[n])


def _p_value(data: _Data, n: int, ratio: float) -> float:
    """The one-sided p-value of the node's failures if its hazard ratio were `ratio`: the unlocalized and the
    localized counts each against their Poisson mean, combined by Fisher's method where both kinds occur in
    the partition (a named failure weighs far more than one laid on all of a run's nodes: pooled, the many
    run-mates' shares would drown it)."""
    la, lb = data.rates()
    x, h = float(data.X[n]), float(data.H[n])
    tests = []
    if la > 0:
        tests.append(poisson_sf(int(data.OA[n]), la * (x + (ratio - 1.0) * h)))
    if lb > 0:
        tests.append(poisson_sf(int(data.OB[n]), lb * ratio * h))
    return tests[0] if len(tests) == 1 else fisher(tests)


def _node(data: _Data, n: int, policy: Policy, threshold: float) -> NodeScore:
    base, slope = _mean(data, n)  # base: what its run-mates' share brings it
    o = int(data.OA[n] + data.OB[n])
    return NodeScore(
        node=data.names[n],
        failures=o,
        expected=base + slope,
        ratio=_ratio(data, n) if slope > 0 else None,
        ratio_low=0.0,
        p_value=_p_value(data, n, policy.margin) if o else 1.0,
        threshold=threshold,
        lemon=False,
        node_hours=float(data.H[n]) / 3600,
        runs=int(data.runs[n]),
        localized=0,
        caught=0,
    )


def _ratio(data: _Data, n: int) -> float:
    """The maximum-likelihood hazard ratio of the two Poisson counts: OA ~ Poisson(a + b r) and OB ~
    Poisson(c r), with a = lambda_A (X - H), b = lambda_A H, c = lambda_B H. The score
    OA b / (a + b r) + OB / r - (b + c) falls with r: bisection for its zero."""
    la, lb = data.rates()
    x, h = float(data.X[n]), float(data.H[n])
    a, b, c = la * (x - h), la * h, lb * h
    oa, ob = int(data.OA[n]), int(data.OB[n])

    def score(r: float) -> float:
        return (oa * b / (a + b * r) if oa else 0.0) + (ob / r if ob else 0.0) - (b + c)

    tiny = 1e-12
    if b + c <= 0 or (not ob and (not oa or a <= 0 or score(0.0) <= 0)):
        return 0.0 if a > 0 or not oa else float(oa) / max(b, tiny)
    low, high = tiny, 1.0
    while score(high) > 0 and high < 1e12:
        low, high = high, high * 2
    for _ in range(100):
        mid = (low + high) / 2
        if score(mid) > 0:
            low = mid
        else:
            high = mid
        if high - low <= 1e-9 * high:
            break
    return (low + high) / 2


def _bound(s: NodeScore, data: _Data, policy: Policy) -> None:
    """The lower confidence bound on the node's ratio at its threshold: the ratio at which its p-value
    reaches the threshold (the p-value grows with the ratio). It is >= margin exactly when the node is
    flagged."""
    n = data.names.index(s.node)
    if not s.failures or _p_value(data, n, 0.0) > s.threshold:
        return
    low, high = 0.0, max(policy.margin, s.ratio or 1.0, 1.0)
    while _p_value(data, n, high) <= s.threshold and high < 1e9:
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        if _p_value(data, n, mid) <= s.threshold:
            low = mid
        else:
            high = mid
        if high - low <= 1e-6 * high:
            break
    s.ratio_low = low


def _evidence(s: NodeScore, data: _Data, runs: Runs, causes: Causes, rows: list[int]) -> None:
    """The failed runs laid on the node, of those still in the data at its step (a lemon's before it is
    explained away; those an earlier lemon explained are not its)."""
    n = data.names.index(s.node)
    counted: Counter = Counter()
    jobs = []
    for r in np.flatnonzero((data.kind > 0) & data.alive).tolist():
        on = n in data.named[r] if data.kind[r] == 2 else n in data.members[r]
        if not on:
            continue
        i = rows[r]
        counted[CAUSES[causes.cause[i]]] += 1
        s.localized += int(data.kind[r] == 2)
        s.caught += int(i in causes.caught)
        jobs.append((int(runs.end[i]), runs.job_id[i]))
    s.causes = dict(sorted(counted.items()))
    s.jobs = [j for _, j in sorted(jobs)[-JOBS_KEPT:]]
