"""The values of one sacct column, checked: the readers sacct.py applies to each column of a dump.

Each reader takes the column's texts and returns one value per row; a value it cannot read becomes the
column's "unknown" (a bad Start/End is BAD_TIME, and the row is then skipped and counted by sacct.py), never
an exception. Each has one quick check over the whole column (every value a plain number, say) and reads
row by row only when that fails.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from datetime import datetime
from operator import methodcaller

import numpy as np

from ..slurm.tres import tres_count, tres_value
from ..usage.summary import PREFIX as SUMMARY_PREFIX
from ..usage.summary import parse_head

UNKNOWN_TIMES = frozenset(("", "Unknown", "None", "N/A"))
BAD_TIME = -3  # an unreadable Start/End: the row is skipped (and counted)
MAX_EPOCH = 1 << 40  # a plain number: ASCII digits, below this
SUMMARY_SLACK = 1.001  # rounding in encode() (one decimal) may put used a hair above cov


_UNKNOWN_MARK = str(MAX_EPOCH)  # (a plain number, out of range: read as -1 after the column's conversion)
_MARKED = dict.fromkeys(UNKNOWN_TIMES, _UNKNOWN_MARK)


def plain_column(column: Sequence[str], limit: int = MAX_EPOCH) -> np.ndarray | None:
    """The column as int64 when every value is a plain number (ASCII digits, below `limit`), else None:
    one check and one conversion for the whole column (the common case), rows one by one only when it fails."""
    joined = "".join(column)
    if not (
        joined.isascii() and joined.isdigit()
    ):  # (int() would also read signs, spaces, '_', other digits)
        return None
    try:
        out = np.array(column, dtype=np.int64)  # (each value as int() reads it)
    except (ValueError, OverflowError):  # (an empty value; more than 4300 digits; beyond int64)
        return None
    return out if not len(out) or out.max() < limit else None


def _plain_int(text: str, bad: int) -> int:
    """A plain number (ASCII digits, below MAX_EPOCH), else `bad` (unicode digits, signs, 5000-digit numbers)."""
    if text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 13:
        value = int(text)
        return value if value < MAX_EPOCH else bad
    return bad


def counts(column: Sequence[str]) -> np.ndarray:
    """ElapsedRaw, NTasks: plain non-negative integers; anything else reads as 0."""
    out = plain_column(column)
    return out if out is not None else np.array([_plain_int(v, 0) for v in column], dtype=np.int64)


def epochs(column: Sequence[str]) -> np.ndarray:
    """Start/End: epoch seconds (SLURM_TIME_FORMAT=%s) or sacct's ISO local time; -1 for sacct's unknown words
    (a running job's End), BAD_TIME for anything else."""
    out = plain_column(column)
    if out is not None:
        return out
    out = plain_column(
        list(map(_MARKED.get, column, column)), MAX_EPOCH + 1
    )  # (each unknown word as the mark)
    if out is not None:
        for i in np.flatnonzero(out == MAX_EPOCH).tolist():  # (the mark, or the number itself: out of range)
            out[i] = -1 if column[i] in UNKNOWN_TIMES else BAD_TIME
        return out
    return np.array(
        [_plain_int(v, BAD_TIME) if v.isdigit() else _other_time(v) for v in column], dtype=np.int64
    )


def _other_time(text: str) -> int:
    if text in UNKNOWN_TIMES:
        return -1
    if not text.isascii() or "T" not in text:
        return BAD_TIME
    try:  # sacct prints local wall-clock time; a naive datetime's timestamp() reads it as local time
        stamp = datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return BAD_TIME
    return int(stamp) if 0 <= stamp < MAX_EPOCH else BAD_TIME


# The five numbers of a head as usage/summary.encode() writes them; any other head is read by parse_head.
_HEAD = re.compile(r"stune1 held=([^ ]*) used=([^ ]*) cov=([^ ]*) busy=([^ ]*) busy_w=([^ ]*)")


_IS_SUMMARY = methodcaller("startswith", SUMMARY_PREFIX)
_GROUPS = methodcaller("groups")


class Summaries:
    """(has_summary, bad_summary, held, used, covered, busy, busy_w) from the rows' AdminComments, added block
    by block (while the block's strings are in cache) and made arrays once: each head's numbers as
    usage/summary.parse_head (the format's reader) reads them. A summary that cannot be read, or whose
    numbers are not finite or out of range (negative, used or busy above covered), is not trusted:
    has_summary False (eta = 1, as Slurm charges) and bad_summary True, so the report can count it."""

    def __init__(self) -> None:
        self.n = 0  # rows added
        self.rows: list[int] = []  # the rows whose AdminComment is a summary
        self.heads: list[tuple[np.ndarray, np.ndarray]] = []  # per block: their _heads

    def add(self, comments: Sequence[str], n: int) -> None:
        """The next n rows' AdminComments (none: no column)."""
        marked = list(map(_IS_SUMMARY, comments))
        if any(marked):
            self.rows += itertools.compress(itertools.count(self.n), marked)
            self.heads.append(_heads(list(itertools.compress(comments, marked))))
        self.n += n

    def arrays(self) -> tuple[np.ndarray, ...]:
        numbers = np.full((5, self.n), np.nan)  # (a row per number: each a contiguous array)
        has = np.zeros(self.n, dtype=bool)
        bad = np.zeros(self.n, dtype=bool)
        if self.rows:
            heads, read = (np.concatenate(parts) for parts in zip(*self.heads))
            rows = np.array(self.rows, dtype=np.intp)
            numbers[:, rows[read]] = heads[read].T
            has[rows[read]] = True
            bad[rows[~read]] = True
        held, used, covered, busy, busy_w = numbers
        return distrust_insane(has, bad, held, used, covered, busy, busy_w)


_NO_BUSY_W = {"-": "nan"}  # (parse_head's None; NaN in the arrays)


def _heads(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(numbers, read): parse_head of each text, as a row of 5 floats (NaN: busy_w '-', or nothing read) and
    whether it read a head. The heads in encode()'s form are matched by one pattern and their numbers
    converted by one numpy call (which reads each as float() does); when some text does not match, or a
    number is not one float() reads, each text goes through parse_head."""
    matches = list(map(_HEAD.match, texts))
    if None not in matches:
        numbers = list(itertools.chain.from_iterable(map(_GROUPS, matches)))
        busy_w = numbers[4::5]
        numbers[4::5] = map(_NO_BUSY_W.get, busy_w, busy_w)
        try:
            return np.array(numbers, dtype=np.float64).reshape(-1, 5), np.ones(len(texts), dtype=bool)
        except ValueError:
            pass
    heads = list(map(parse_head, texts))
    read = np.array([head is not None for head in heads], dtype=bool)
    out = np.full((len(texts), 5), np.nan)
    if read.any():
        out[read] = [head for head in heads if head is not None]  # (busy_w None: NaN)
    return out, read


def distrust_insane(has, bad, held, used, covered, busy, busy_w) -> tuple[np.ndarray, ...]:
    """Summaries whose numbers are not finite or out of range become unmeasured (has False, bad True)."""
    with np.errstate(invalid="ignore", over="ignore"):
        sane = (
            np.isfinite(held)
            & np.isfinite(used)
            & np.isfinite(covered)
            & np.isfinite(busy)
            & (held >= 0)
            & (used >= 0)
            & (covered >= 0)
            & (busy >= 0)
            & (used <= covered * SUMMARY_SLACK + 0.1)
            & (busy <= covered * SUMMARY_SLACK + 0.1)
            & ~(busy_w < 0)
            & ~np.isinf(busy_w)
        )
    insane = has & ~sane
    if insane.any():
        bad |= insane
        has &= ~insane
        for column in (held, used, covered, busy, busy_w):
            column[insane] = np.nan
    return has, bad, held, used, covered, busy, busy_w


def _gpuutil(tres_usage: str) -> float:
    value = tres_value(tres_usage, "gres/gpuutil")
    try:
        return float("nan") if value is None else float(value)
    except ValueError:
        return float("nan")


def join_gpuutil(
    job_ids: list[str],
    job_elapsed: np.ndarray,
    steps: dict[str, list[str]],
    out_util: np.ndarray,
    out_cover: np.ndarray,
) -> None:
    """Per job: the step-time-weighted mean of Slurm's gres/gpuutil per GPU, and the share of the job's time
    it covers, from the step rows' columns (`steps`: JobIDRaw, ElapsedRaw, TRESUsageInAve, AllocTRES and,
    when the dump has it, NTasks). The batch and extern steps count like any other step.

    Slurm's gpu/nvml plugin reads each task's (pid's) SM utilization over every GPU it uses and adds them up,
    and TRESUsageInAve is the mean over the step's tasks: one task driving 4 GPUs at 90 % reads 360. The mean
    per GPU is therefore Ave x NTasks / the step's GPUs. Where NTasks or the step's gres/gpu is not in the
    dump, the value is taken as a per-GPU percentage (one task per GPU, the usual launch), and anything that
    does not fit 0..100 per GPU is not trusted."""
    where = {j: i for i, j in enumerate(job_ids)}
    weight = np.zeros(len(job_ids))
    total = np.zeros(len(job_ids))
    ntasks = steps.get("NTasks")
    for k, (sid, secs, usage) in enumerate(
        zip(steps["JobIDRaw"], counts(steps["ElapsedRaw"]).tolist(), steps["TRESUsageInAve"])
    ):
        i = where.get(sid.split(".", 1)[0])
        if i is None or secs <= 0:
            continue
        util = _gpuutil(usage)
        if math.isnan(util) or util < 0:
            continue
        gpus = tres_count(steps["AllocTRES"][k], "gres/gpu")
        tasks = _plain_int(ntasks[k], 0) if ntasks is not None else 0
        if gpus > 0 and tasks > 0:
            util = util * tasks / gpus
        if not util <= 100.0 * SUMMARY_SLACK:
            continue
        weight[i] += secs
        total[i] += min(util, 100.0) * secs
    ok = weight > 0
    out_util[ok] = total[ok] / weight[ok]
    span = np.maximum(job_elapsed.astype(np.float64), 1.0)
    out_cover[ok] = np.minimum(weight[ok] / span[ok], 1.0)
