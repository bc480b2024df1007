"""sacct rows as numpy columns, fast enough for a million rows.

The text is `sacct -P` with a header line (the live read asks for exactly that; a dump for --sacct-file is
the same command's output):

    SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert -S 2024-01-01 \
        --format=JobIDRaw,JobID,User,Account,Partition,QOS,State,Start,End,ElapsedRaw,AllocTRES,AdminComment

Columns may come in any order; AdminComment (free text, may hold '|') must be last. Times may be epoch
seconds (SLURM_TIME_FORMAT=%s) or sacct's ISO local time. Step rows (JobIDRaw with a '.') are used only for
their TRESUsageInAve gres/gpuutil, which Slurm >= 23.02 records when built with NVML.

Cost is kept linear and mostly in C: one split per line, a transpose, dictionary factorizing for repeated
strings (users, accounts, AllocTRES), and per-row Python only for the stune summaries themselves.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import StuneError
from ..usage.summary import PREFIX as SUMMARY_PREFIX
from ..usage.summary import parse_head

FIELDS = ("JobIDRaw", "JobID", "User", "Account", "Partition", "QOS", "State", "Start", "End", "ElapsedRaw",
          "AllocTRES", "AdminComment")
STEP_FIELDS = ("TRESUsageInAve",)
REQUIRED = ("JobIDRaw", "User", "Account", "State", "Start", "End", "ElapsedRaw", "AllocTRES")
UNKNOWN_TIMES = frozenset(("", "Unknown", "None", "N/A"))


class SacctFormatError(StuneError):
    """A sacct dump that cannot be read: names the file and line."""


@dataclass
class JobTable:
    """Allocation rows, one per job run (requeued runs are separate rows). Arrays have one entry per row."""

    job_id_raw: list          # str
    job_id: list              # str, as users know it (array jobs: 123_4)
    assoc: np.ndarray         # int32 code into assoc_keys
    assoc_keys: list          # (account, user)
    partition: np.ndarray     # int32 code into partitions
    partitions: list
    qos: np.ndarray           # int32 code into qos_names
    qos_names: list
    state: list               # str, first word (CANCELLED by 0 -> CANCELLED)
    start: np.ndarray         # int64 epoch, -1 unknown
    end: np.ndarray           # int64 epoch, -1 unknown (running)
    elapsed: np.ndarray       # int64 seconds
    billing: np.ndarray       # float64, Slurm's billable TRES
    gpus: np.ndarray          # float64, gres/gpu allocated
    has_summary: np.ndarray   # bool
    held_s: np.ndarray        # float64 GPU-seconds per the summary (NaN without one)
    used_s: np.ndarray
    covered_s: np.ndarray
    busy_s: np.ndarray
    busy_w: np.ndarray
    admin_comment: list       # str (raw, for the report's per-GPU details)
    gpuutil: np.ndarray       # float64 percent from Slurm's gres/gpuutil (NaN when not recorded)
    gpuutil_cover: np.ndarray  # float64 0..1: step time with a gpuutil reading over the job's time

    @property
    def n(self) -> int:
        return len(self.job_id_raw)

    def keys(self) -> list[str]:
        """A run's identity: job id and start time (a requeued job runs again under the same id)."""
        return [f"{j}@{s}" for j, s in zip(self.job_id_raw, self.start.tolist())]


def _factorize(values) -> tuple[np.ndarray, list]:
    table: dict = {}
    codes = [table.setdefault(v, len(table)) for v in values]
    return np.fromiter(codes, dtype=np.int32, count=len(codes)), list(table)


def _times(column, source: str) -> np.ndarray:
    out = np.empty(len(column), dtype=np.int64)
    iso: list[int] = []
    for i, value in enumerate(column):
        if value.isdigit():
            out[i] = int(value)
        elif value in UNKNOWN_TIMES:
            out[i] = -1
        else:
            out[i] = -2
            iso.append(i)
    if iso:
        texts = np.array([column[i] for i in iso])
        try:
            stamps = texts.astype("datetime64[s]").astype(np.int64)
        except ValueError as exc:
            raise SacctFormatError(f"{source}: unreadable time: {exc}") from None
        # sacct prints local time; numpy read it as UTC. Correct by the local offset at each instant.
        offsets = np.fromiter((time.localtime(int(t)).tm_gmtoff for t in stamps[::max(1, len(stamps) // 64)]),
                              dtype=np.int64)
        if offsets.min() == offsets.max():
            stamps = stamps - offsets[0]
        else:
            cache: dict = {}
            stamps = np.fromiter((t - cache.setdefault(t // 3600, time.localtime(int(t)).tm_gmtoff)
                                  for t in stamps.tolist()), dtype=np.int64, count=len(stamps))
        out[np.array(iso)] = stamps
    return out


def _ints(column) -> np.ndarray:
    return np.fromiter((int(v) if v.isdigit() else 0 for v in column), dtype=np.int64, count=len(column))


def _tres_value(tres: str, key: str) -> float:
    """A count from a TRES string: 'billing=2,cpu=2,gres/gpu=4,node=2' -> 4.0 for 'gres/gpu'. Typed entries
    (gres/gpu:a100=4) are the same GPUs counted again, so only the untyped key counts."""
    for item in tres.split(","):
        name, sep, value = item.partition("=")
        if sep and name == key:
            try:
                return float(value.rstrip("KMGTP") or 0)
            except ValueError:
                return 0.0
    return 0.0


def _gpuutil(tres_usage: str) -> float:
    for item in tres_usage.split(","):
        name, sep, value = item.partition("=")
        if sep and name == "gres/gpuutil":
            try:
                return float(value)
            except ValueError:
                return float("nan")
    return float("nan")


def parse(text: str, source: str = "sacct") -> JobTable:
    """Parse `sacct -P` output with its header line into a JobTable."""
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        raise SacctFormatError(f"{source}: empty (expected `sacct -P` output with its header line)")
    header = lines[0].split("|")
    missing = [f for f in REQUIRED if f not in header]
    if missing:
        raise SacctFormatError(f"{source}:1: header lacks {', '.join(missing)} (got {'|'.join(header)}); "
                               f"export with --format={','.join(FIELDS)}")
    if "AdminComment" in header and header[-1] != "AdminComment":
        raise SacctFormatError(f"{source}:1: AdminComment must be the last column (it is free text)")
    width = len(header)
    rows = [line.split("|", width - 1) for line in lines[1:] if line]
    for lineno, row in enumerate(rows, start=2):
        if len(row) != width:
            raise SacctFormatError(f"{source}:{lineno}: {len(row)} fields, the header has {width}")
    columns = dict(zip(header, zip(*rows))) if rows else {name: () for name in header}
    n = len(rows)
    empty = ("",) * n
    raw_ids = columns["JobIDRaw"]
    is_step = np.fromiter(("." in j for j in raw_ids), dtype=bool, count=n)
    alloc = np.flatnonzero(~is_step)
    step = np.flatnonzero(is_step)

    def pick(name, idx=alloc):
        col = columns.get(name, empty)
        return [col[i] for i in idx.tolist()] if len(idx) != n else list(col)

    ids = pick("JobIDRaw")
    users, accounts = pick("User"), pick("Account")
    assoc, assoc_keys = _factorize(zip(accounts, users))
    partition, partitions = _factorize(pick("Partition"))
    qos, qos_names = _factorize(pick("QOS"))
    tres_codes, tres_strings = _factorize(pick("AllocTRES"))
    billing = np.array([_tres_value(t, "billing") for t in tres_strings] or [0.0])[tres_codes]
    gpus = np.array([_tres_value(t, "gres/gpu") for t in tres_strings] or [0.0])[tres_codes]
    comments = pick("AdminComment")
    held, used, covered, busy, busy_w = (np.full(len(ids), np.nan) for _ in range(5))
    has_summary = np.zeros(len(ids), dtype=bool)
    for i, comment in enumerate(comments):
        if comment[:7] == SUMMARY_PREFIX:
            head = parse_head(comment)
            if head is not None:
                held[i], used[i], covered[i], busy[i] = head[:4]
                busy_w[i] = np.nan if head[4] is None else head[4]
                has_summary[i] = True
    start, end = _times(pick("Start"), source), _times(pick("End"), source)
    elapsed = _ints(pick("ElapsedRaw"))
    gpuutil = np.full(len(ids), np.nan)
    gpuutil_cover = np.zeros(len(ids))
    if len(step) and "TRESUsageInAve" in columns:
        _join_gpuutil(ids, elapsed, [raw_ids[i] for i in step.tolist()],
                      _ints([columns["ElapsedRaw"][i] for i in step.tolist()]),
                      [columns["TRESUsageInAve"][i] for i in step.tolist()], gpuutil, gpuutil_cover)
    return JobTable(
        job_id_raw=ids, job_id=pick("JobID") if "JobID" in columns else list(ids), assoc=assoc,
        assoc_keys=assoc_keys, partition=partition, partitions=partitions, qos=qos, qos_names=qos_names,
        state=[s.split(" ", 1)[0] for s in pick("State")], start=start, end=end, elapsed=elapsed,
        billing=billing, gpus=gpus, has_summary=has_summary, held_s=held, used_s=used, covered_s=covered,
        busy_s=busy, busy_w=busy_w, admin_comment=comments, gpuutil=gpuutil, gpuutil_cover=gpuutil_cover)


def _join_gpuutil(job_ids, job_elapsed, step_ids, step_elapsed, step_usage, out_util, out_cover) -> None:
    """Per job: the step-time-weighted mean of Slurm's gres/gpuutil, and the share of the job's time it
    covers. (The batch and extern steps count like any other step.)"""
    where = {j: i for i, j in enumerate(job_ids)}
    weight = np.zeros(len(job_ids))
    total = np.zeros(len(job_ids))
    for sid, secs, usage in zip(step_ids, step_elapsed.tolist(), step_usage):
        i = where.get(sid.split(".", 1)[0])
        if i is None or secs <= 0:
            continue
        util = _gpuutil(usage)
        if util != util:
            continue
        weight[i] += secs
        total[i] += util * secs
    ok = weight > 0
    out_util[ok] = total[ok] / weight[ok]
    span = np.maximum(job_elapsed.astype(np.float64), 1.0)
    out_cover[ok] = np.minimum(weight[ok] / span[ok], 1.0)


def read_file(path: str) -> JobTable:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise SacctFormatError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(text, source=path)
