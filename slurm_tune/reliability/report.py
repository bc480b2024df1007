"""The reliability report's numbers, in the units the field uses (Meta's Llama 3 paper, sec. 3.3.4; Kokolis
et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", HPCA 2025):

- interruptions per 1,000 node-days, by cause (causes.py), per partition and month: runs that ended for that
  cause in the month, over the node-days all runs held in it (a run's node-seconds split over the months it
  spans). The by-cause table over the whole window is the one the Llama 3 paper gives for its 54-day run
  (466 interruptions: 47 planned, 419 unexpected, by component).
- MTTF by job size: a run's size is its node count, in powers of two (1, 2, 3-4, 5-8, ...). MTTF = the hours
  runs of that size ran / their infrastructure failures (hardware, nccl, node_failure: the machine's, not the
  program's), the exponential model's estimate (censored runs count their hours); and the MTTF the
  site's per-node rate projects for that size, 1 / (nodes x failures per node-hour): where the measured one
  falls short of it, larger jobs fail more than their node count explains.
- ETTR, the effective training time ratio: productive node-time over the node-time jobs had (Kokolis et
  al.'s definition: the ratio of productive runtime to available wallclock time). A job's runs (its
  requeues, one job id) are one campaign: available = its runs' node-time plus the node-time it waited
  between a failed run and the next (nodes x the gap); productive = available minus those gaps, minus a
  restart overhead at the start of each later run, minus the work since the last checkpoint at the end of
  each run killed without a chance to checkpoint (LOSES_WORK in causes.py), taken as half the checkpoint
  interval. sacct records neither the checkpoints nor the restart time, so both are settings
  (--checkpoint-interval, default 1 h; --restart-overhead, default 5 min), said with every report.

Everything is node-seconds clipped to the window [since, until]: a run still going counts until `until`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .causes import CATEGORY, CAUSES, INFRA, LOSES_WORK, NONE, UNEXPECTED, Causes
from .history import Runs

DAY = 86400
CODES_KEPT = 12  # codes listed per cause; the rest are summed as "other codes"


@dataclass(frozen=True)
class Settings:
    checkpoint_interval_s: int = 3600
    restart_overhead_s: int = 300


@dataclass
class MonthRow:
    partition: str
    month: str
    node_days: float
    runs: int  # runs that ended in the month
    interruptions: int
    unexpected: int
    per_1000_node_days: float | None
    ettr: float | None
    by_cause: dict[str, int] = field(default_factory=dict)


@dataclass
class SizeRow:
    size: str
    runs: int
    hours: float
    node_days: float
    gpus_median: float | None
    failures: int
    mttf_h: float | None
    projected_mttf_h: float | None
    ettr: float | None


@dataclass
class CauseRow:
    cause: str
    code: str
    category: str
    count: int
    share: float
    per_1000_node_days: float | None


@dataclass
class ReliabilityReport:
    since: int
    until: int
    settings: Settings
    with_events: bool
    events: int
    partitions: list[str]
    months: list[str]
    node_days: float
    runs: int
    interruptions: int
    unexpected: int
    planned: int
    per_1000_node_days: float | None
    mttf_h: float | None  # hours run per infrastructure failure
    mttf_unexpected_h: float | None  # hours run per unexpected interruption (the Llama 3 paper's)
    ettr: float | None
    rows: list[MonthRow] = field(default_factory=list)
    sizes: list[SizeRow] = field(default_factory=list)
    causes: list[CauseRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def months(since: int, until: int) -> list[tuple[str, int, int]]:
    """(YYYY-MM, start, end) of the local-time months [since, until] touches, clipped to it."""
    out: list[tuple[str, int, int]] = []
    t = time.localtime(since)
    year, month = t.tm_year, t.tm_mon
    start = since
    while start < until or not out:
        year2, month2 = (year + 1, 1) if month == 12 else (year, month + 1)
        edge = int(time.mktime((year2, month2, 1, 0, 0, 0, 0, 0, -1)))
        out.append((f"{year:04d}-{month:02d}", start, min(edge, until)))
        year, month, start = year2, month2, edge
        if start >= until:
            break
    return out


def size_bucket(nodes: np.ndarray) -> np.ndarray:
    """0 for 1 node, else ceil(log2(nodes)): 2 -> 1, 3-4 -> 2, 5-8 -> 3, ..."""
    return np.ceil(np.log2(np.maximum(nodes, 1))).astype(np.int64)


def size_label(bucket: int) -> str:
    if bucket <= 1:
        return str(bucket + 1)
    return f"{2 ** (bucket - 1) + 1}-{2**bucket}"


def _overlap(lo: np.ndarray, hi: np.ndarray, a: int, b: int) -> np.ndarray:
    return np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None).astype(np.float64)


class _Time:
    """The node-time of every run, and what ETTR takes off it, as arrays over runs."""

    def __init__(self, runs: Runs, causes: Causes, since: int, until: int, settings: Settings) -> None:
        self.start = runs.start
        self.end = runs.ends(until)
        self.k = runs.nodes.astype(np.float64)
        self.since, self.until = since, until
        elapsed = (self.end - self.start).astype(np.float64)
        codes = _codes(runs.job_id)
        order = np.lexsort((self.start, codes))
        restart = np.zeros(runs.n, dtype=bool)
        prev_end = np.full(runs.n, -1, dtype=np.int64)
        if runs.n > 1:
            same = codes[order][1:] == codes[order][:-1]
            later = order[1:][same]
            restart[later] = True
            prev_end[later] = self.end[order[:-1][same]]
        self.restart_s = np.where(restart, np.minimum(settings.restart_overhead_s, elapsed), 0.0)
        loses = causes.mask(LOSES_WORK) & (runs.end >= 0)
        lost = np.minimum(settings.checkpoint_interval_s / 2, np.maximum(elapsed - self.restart_s, 0))
        self.lost_s = np.where(loses, lost, 0.0)
        self.gap_lo = np.where(restart, np.minimum(prev_end, self.start), self.start)

    def held(self, a: int, b: int) -> np.ndarray:
        """Node-seconds each run held within [a, b] (and the window)."""
        return self.k * _overlap(self.start, self.end, max(a, self.since), min(b, self.until))

    def waited(self, a: int, b: int) -> np.ndarray:
        """Node-seconds each run's campaign waited for it (after the run before failed) within [a, b]."""
        return self.k * _overlap(self.gap_lo, self.start, max(a, self.since), min(b, self.until))

    def wasted(self, a: int, b: int) -> np.ndarray:
        """Node-seconds of each run's restart overhead (at its start) and lost work (at its end) in [a, b]."""
        a, b = max(a, self.since), min(b, self.until)
        at_start = (self.start >= a) & (self.start < b)
        at_end = (self.end >= a) & (self.end < b)
        return self.k * (np.where(at_start, self.restart_s, 0.0) + np.where(at_end, self.lost_s, 0.0))


def _codes(values: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)


def _ettr(held: float, waited: float, wasted: float) -> float | None:
    available = held + waited
    return None if available <= 0 else max(held - wasted, 0.0) / available


def _rate(count: float, node_days: float) -> float | None:
    return None if node_days <= 0 else 1000.0 * count / node_days


def build(
    runs: Runs,
    causes: Causes,
    since: int,
    until: int,
    settings: Settings | None = None,
    events: int = 0,
    partitions: list[str] | None = None,
) -> ReliabilityReport:
    """The report over [since, until], of `partitions` (default: every partition the runs name)."""
    settings = settings or Settings()
    chosen = sorted(set(runs.partitions) if partitions is None else partitions)
    in_scope = np.isin(runs.partition, [i for i, p in enumerate(runs.partitions) if p in chosen])
    t = _Time(runs, causes, since, until, settings)
    ended = in_scope & (runs.end >= since) & (runs.end < until) & (runs.end >= 0)
    interrupted = ended & (causes.cause != NONE)
    report = ReliabilityReport(
        since=since,
        until=until,
        settings=settings,
        with_events=causes.with_events,
        events=events,
        partitions=chosen,
        months=[m for m, _, _ in months(since, until)],
        node_days=0.0,
        runs=int((in_scope & ((t.end > since) & (t.start < until))).sum()),
        interruptions=int(interrupted.sum()),
        unexpected=int((interrupted & causes.mask(UNEXPECTED)).sum()),
        planned=0,
        per_1000_node_days=None,
        mttf_h=None,
        mttf_unexpected_h=None,
        ettr=None,
        warnings=runs.warnings(),
    )
    report.planned = report.interruptions - report.unexpected
    held_all = np.where(in_scope, t.held(since, until), 0.0)
    report.node_days = float(held_all.sum()) / DAY
    report.per_1000_node_days = _rate(report.interruptions, report.node_days)
    infra = ended & causes.mask(INFRA)
    hours = float((np.where(in_scope, t.held(since, until) / np.maximum(t.k, 1), 0.0)).sum()) / 3600
    report.mttf_h = hours / int(infra.sum()) if infra.any() else None
    report.mttf_unexpected_h = hours / report.unexpected if report.unexpected else None
    report.ettr = _ettr(
        report.node_days * DAY,
        float(np.where(in_scope, t.waited(since, until), 0.0).sum()),
        float(np.where(in_scope, t.wasted(since, until), 0.0).sum()),
    )
    _months(report, runs, causes, t, in_scope, interrupted)
    _sizes(report, runs, t, in_scope, infra)
    _causes(report, runs, causes, interrupted)
    report.notes = _notes(report, settings)
    return report


def _months(report, runs: Runs, causes: Causes, t: _Time, in_scope, interrupted) -> None:
    month_of_end = np.full(runs.n, -1, dtype=np.int64)
    spans = months(report.since, report.until)
    for m, (_, a, b) in enumerate(spans):
        month_of_end[(runs.end >= a) & (runs.end < b)] = m
    for p in report.partitions:
        rows = in_scope & (runs.partition == runs.partitions.index(p))
        for m, (label, a, b) in enumerate(spans):
            node_days = float(np.where(rows, t.held(a, b), 0.0).sum()) / DAY
            here = rows & interrupted & (month_of_end == m)
            ended = int((rows & (month_of_end == m)).sum())
            if node_days <= 0 and not ended:
                continue
            counted = np.bincount(causes.cause[here].astype(np.int64), minlength=len(CAUSES))
            by_cause = {c: int(n) for c, n in zip(CAUSES, counted.tolist()) if n}
            unexpected = sum(n for c, n in by_cause.items() if CATEGORY[c] == "unexpected")
            report.rows.append(
                MonthRow(
                    partition=p,
                    month=label,
                    node_days=node_days,
                    runs=ended,
                    interruptions=int(here.sum()),
                    unexpected=unexpected,
                    per_1000_node_days=_rate(int(here.sum()), node_days),
                    ettr=_ettr(
                        node_days * DAY,
                        float(np.where(rows, t.waited(a, b), 0.0).sum()),
                        float(np.where(rows, t.wasted(a, b), 0.0).sum()),
                    ),
                    by_cause=by_cause,
                )
            )


def _sizes(report, runs: Runs, t: _Time, in_scope, infra) -> None:
    held = np.where(in_scope, t.held(report.since, report.until), 0.0)
    waited = np.where(in_scope, t.waited(report.since, report.until), 0.0)
    wasted = np.where(in_scope, t.wasted(report.since, report.until), 0.0)
    hours = held / np.maximum(t.k, 1) / 3600
    buckets = size_bucket(runs.nodes)
    total_failures = int(infra.sum())
    node_hours = float(held.sum()) / 3600
    per_node_hour = total_failures / node_hours if node_hours > 0 else 0.0
    for b in sorted(set(buckets[in_scope & (held > 0)].tolist()) | set(buckets[infra].tolist())):
        rows = in_scope & (buckets == b)
        ran = rows & (held > 0)
        failures = int((rows & infra).sum())
        h = float(hours[rows].sum())
        mean_nodes = float(held[rows].sum() / (3600 * h)) if h > 0 else float(2**b)
        gpus = runs.gpus[ran]
        report.sizes.append(
            SizeRow(
                size=size_label(b),
                runs=int(ran.sum()),
                hours=h,
                node_days=float(held[rows].sum()) / DAY,
                gpus_median=float(np.median(gpus)) if len(gpus) and gpus.any() else None,
                failures=failures,
                mttf_h=h / failures if failures else None,
                projected_mttf_h=1.0 / (mean_nodes * per_node_hour) if per_node_hour > 0 else None,
                ettr=_ettr(float(held[rows].sum()), float(waited[rows].sum()), float(wasted[rows].sum())),
            )
        )


def _code(cause: str, code: str) -> str:
    """The code a cause is grouped by: a hardware code or reason, Slurm's or an operator's reason; NCCL's
    `errors on <nodes>` is one group."""
    if cause == "nccl":
        return "errors on some nodes" if code.startswith("errors on") else code
    return code


def _causes(report, runs: Runs, causes: Causes, interrupted) -> None:
    groups: dict[tuple[str, str], int] = {}
    for i in np.flatnonzero(interrupted).tolist():
        cause = CAUSES[causes.cause[i]]
        key = (cause, _code(cause, causes.code.get(i, "")))
        groups[key] = groups.get(key, 0) + 1
    by_cause: dict[str, list[tuple[str, int]]] = {}
    for (cause, code), n in groups.items():
        by_cause.setdefault(cause, []).append((code, n))
    total = report.interruptions
    for cause in CAUSES:
        codes = sorted(by_cause.get(cause, ()), key=lambda x: (-x[1], x[0]))
        kept, rest = codes[:CODES_KEPT], codes[CODES_KEPT:]
        if rest:
            kept.append(("other codes", sum(n for _, n in rest)))
        for code, n in kept:
            report.causes.append(
                CauseRow(cause, code, CATEGORY[cause], n, n / total, _rate(n, report.node_days))
            )
    report.causes.sort(key=lambda r: (r.category != "unexpected", -r.count, r.cause, r.code))


def _notes(report: ReliabilityReport, settings: Settings) -> list[str]:
    notes = [
        f"ETTR assumes a checkpoint every {settings.checkpoint_interval_s / 3600:g} h (half of it lost per "
        f"kill) and {settings.restart_overhead_s / 60:g} min to restart: sacct records neither "
        "(--checkpoint-interval, --restart-overhead)."
    ]
    if report.with_events:
        notes.append(
            f"causes from sacct, the stored NCCL verdicts and {report.events} node event(s) (sacctmgr show "
            "event): hardware codes are the Xids stune's drains name."
        )
    else:
        notes.append(
            "causes from sacct and the stored NCCL verdicts alone (no node events read): a GPU fault that "
            "crashed a program counts as `user`, and no node failure names its node."
        )
    return notes
