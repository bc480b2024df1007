"""sacct rows as numpy columns, fast enough for a million rows.

The text is `sacct -P` with a header line (the live read asks for exactly that; a dump for --sacct-file is
the same command's output):

    SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert -S 2024-01-01 \
        --format=JobIDRaw,JobID,User,Account,Partition,QOS,State,Start,End,ElapsedRaw,AllocTRES,AdminComment

Columns may come in any order; AdminComment (free text, may hold '|') must be last. Times may be epoch
seconds (SLURM_TIME_FORMAT=%s) or sacct's ISO local time. Step rows (JobIDRaw with a '.') are used only for
their TRESUsageInAve gres/gpuutil, which Slurm >= 23.02 records when built with NVML.

Two paths, one result. A plain ASCII dump (what sacct prints for real clusters) is read at the byte level by
sacct_fast.py: numpy over whole columns, no Python object per row. Everything else (encoding damage, CR line
ends, cut lines, step rows, summaries or times in unusual forms) goes through the general parser below, which
is also the reference the fast path is tested against (tests/test_fairshare_sacct.py). The general parser is
linear and mostly in C too: one split per line, a transpose, dictionary factorizing for repeated strings
(users, accounts, AllocTRES), and per-row Python only for the stune summaries themselves.
"""
from __future__ import annotations

import contextlib
import gc
import os
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import StuneError
from ..slurm.tres import tres_count, tres_value
from .columns import Coded, Texts
from ..usage.summary import PREFIX as SUMMARY_PREFIX
from ..usage.summary import parse_head

FIELDS = ("JobIDRaw", "JobID", "User", "Account", "Partition", "QOS", "State", "Start", "End", "ElapsedRaw",
          "AllocTRES", "AdminComment")
STEP_FIELDS = ("NTasks", "TRESUsageInAve")
REQUIRED = ("JobIDRaw", "User", "Account", "State", "Start", "End", "ElapsedRaw", "AllocTRES")
UNKNOWN_TIMES = frozenset(("", "Unknown", "None", "N/A"))
UNKNOWN_WORDS = ("Unknown", "None", "N/A")


class SacctFormatError(StuneError):
    """A sacct dump that cannot be read: names the file and line."""


@dataclass
class JobTable:
    """Allocation rows, one per job run (requeued runs are separate rows). Arrays have one entry per row."""

    job_id_raw: list          # str
    job_id: list              # str, as users know it (array jobs: 123_4)
    assoc: np.ndarray         # int32 code into assoc_keys
    assoc_keys: list          # (account, user)
    partition: list           # str (kept as read: only reports look at it, for a few rows)
    qos: np.ndarray           # int32 code into qos_names
    qos_names: list
    state_raw: list           # str as sacct prints it ("CANCELLED by 0")
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
    bad_summary: np.ndarray = None  # bool: a stune summary that is damaged or out of range (unmeasured)
    skipped: int = 0          # rows dropped: unreadable Start/End
    duplicates: int = 0       # rows dropped: the same job run twice in the dump (overlapping exports)
    skip_reasons: list = None  # the first few skipped rows, "file:line: why"

    @property
    def n(self) -> int:
        return len(self.job_id_raw)

    @property
    def ran(self) -> np.ndarray:
        """Rows that started and ran for some time: the runs that are charged and reported."""
        return (self.start >= 0) & (self.elapsed > 0)

    def state_of(self, i: int) -> str:
        """The state's first word: CANCELLED by 0 -> CANCELLED."""
        return self.state_raw[i].split(" ", 1)[0]

    @property
    def state(self) -> list:
        return _first_words(self.state_raw)

    def subset(self, keep: np.ndarray) -> "JobTable":
        """The rows where `keep` is True (association and QOS codes keep their tables)."""
        at = np.flatnonzero(keep).tolist()
        out = {}
        for name, value in self.__dict__.items():
            if isinstance(value, np.ndarray):
                out[name] = value[keep]
            elif isinstance(value, (Texts, Coded)):
                out[name] = value.take(keep)
            elif isinstance(value, list) and len(value) == self.n and name not in ("assoc_keys", "qos_names", "skip_reasons"):
                out[name] = [value[i] for i in at]
            else:
                out[name] = value
        return JobTable(**out)

    def keys(self) -> list[str]:
        """A run's identity: job id and start time (a requeued job runs again under the same id)."""
        return [f"{j}@{s}" for j, s in zip(self.job_id_raw, self.start.tolist())]


def _factorize(values) -> tuple[np.ndarray, list]:
    """(codes, distinct values in first-seen order), with the per-row work in C (dict.fromkeys, map)."""
    if isinstance(values, Coded):
        return values.factorize()
    values = values if isinstance(values, list) else list(values)
    uniques = list(dict.fromkeys(values))
    table = {v: i for i, v in enumerate(uniques)}
    return np.fromiter(map(table.__getitem__, values), dtype=np.int32, count=len(values)), uniques


def _factorize_pairs(first: list, second: list) -> tuple[np.ndarray, list]:
    """_factorize over (first, second) pairs without building a tuple per row."""
    a, a_names = _factorize(first)
    b, b_names = _factorize(second)
    if not len(a):
        return a, []
    combined = a.astype(np.int64) * len(b_names) + b
    distinct, codes = np.unique(combined, return_inverse=True)
    keys = [(a_names[c // len(b_names)], b_names[c % len(b_names)]) for c in distinct.tolist()]
    return codes.astype(np.int32), keys


_UNKNOWN_SENTINEL = 9223372036854775806


def _fast_ints(column, unknown: bool = False):
    """All of `column` as int64 in one C call, or None when some value is not a plain number (ISO times,
    empty fields): the caller then takes the per-row path. With `unknown`, sacct's Unknown/None read as -1."""
    joined = " ".join(column)
    if unknown:
        for word in UNKNOWN_WORDS:
            joined = joined.replace(word, str(_UNKNOWN_SENTINEL))
    if "-" in joined or ":" in joined:
        return None
    out = _numbers(joined, np.int64)
    if out is None or out.size != len(column):
        return None
    if unknown:
        out[out == _UNKNOWN_SENTINEL] = -1
    return out


def _numbers(joined: str, dtype=np.float64):
    """Space-separated numbers in one C call; None when the text does not read to its end (numpy 2.x raises
    there, older releases warn and stop short: both mean "take the per-row path")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return np.fromstring(joined, dtype=dtype, sep=" ")
        except (ValueError, OverflowError):
            return None


BAD_TIME = -3  # an unreadable Start/End: the row is skipped (and counted)
_MAX_EPOCH = 1 << 40


def _iso_stamp(text: str) -> int:
    try:
        stamp = int(np.datetime64(text, "s").astype(np.int64))
    except (ValueError, OverflowError, TypeError):
        return BAD_TIME
    return stamp if 0 <= stamp < _MAX_EPOCH else BAD_TIME


def _times(column, source: str) -> np.ndarray:
    """Epoch seconds (-1 unknown, BAD_TIME unreadable) from sacct's %s or ISO local time."""
    fast = _fast_ints(column, unknown=True)
    if fast is not None and ((fast >= -1) & (fast < _MAX_EPOCH)).all():
        return fast
    out = np.fromiter((_epoch(v) if v.isdigit() else (-1 if v in UNKNOWN_TIMES else -2) for v in column),
                      dtype=np.int64, count=len(column))
    iso = np.flatnonzero(out == -2)
    if len(iso):
        texts = [column[i] for i in iso.tolist()]
        try:
            stamps = np.array(texts).astype("datetime64[s]").astype(np.int64)
            if ((stamps < 0) | (stamps >= _MAX_EPOCH)).any():
                raise ValueError("out of range")
        except (ValueError, OverflowError):  # some are not times at all: read one by one
            stamps = np.fromiter(map(_iso_stamp, texts), dtype=np.int64, count=len(texts))
        good = stamps != BAD_TIME
        out[iso[~good]] = BAD_TIME
        iso, stamps = iso[good], stamps[good]
        if not len(iso):
            return out
        # sacct prints local time; numpy read it as UTC. Correct by the local offset at each instant.
        offsets = np.fromiter((time.localtime(int(t)).tm_gmtoff for t in stamps[::max(1, len(stamps) // 64)]),
                              dtype=np.int64)
        if offsets.min() == offsets.max():
            stamps = stamps - offsets[0]
        else:
            cache: dict = {}
            stamps = np.fromiter((t - cache.setdefault(t // 3600, time.localtime(int(t)).tm_gmtoff)
                                  for t in stamps.tolist()), dtype=np.int64, count=len(stamps))
        out[iso] = stamps
    return out


def _plain_int(text: str, bad: int) -> int:
    """A non-negative ASCII integer below 2**40, else `bad` (unicode digits, 5000-digit numbers...)."""
    if text.isascii() and text.isdigit() and len(text) <= 13:
        value = int(text)
        return value if value < _MAX_EPOCH else bad
    return bad


def _epoch(text: str) -> int:
    return _plain_int(text, BAD_TIME)


def _ints(column) -> np.ndarray:
    fast = _fast_ints(column)
    if fast is not None and (fast < _MAX_EPOCH).all():
        return fast
    return np.fromiter((_plain_int(v, 0) for v in column), dtype=np.int64, count=len(column))


SUMMARY_SLACK = 1.001  # rounding in encode() (one decimal) may put used a hair above cov


def _summary_heads(comments: list, n: int):
    """(has_summary, bad_summary, held, used, covered, busy, busy_w) arrays. The heads of all summaries are
    joined into one string of numbers and read by numpy in one C call; if any summary is not in encode()'s
    order (or is damaged), every summary goes through the per-row parser instead.

    A summary that cannot be read, or whose numbers are not finite or out of range (negative, used above
    covered, busy above covered), is not trusted: has_summary is False (eta = 1, as Slurm charges) and
    bad_summary is True so the report can count it."""
    held, used, covered, busy, busy_w = (np.full(n, np.nan) for _ in range(5))
    has = np.zeros(n, dtype=bool)
    bad = np.zeros(n, dtype=bool)
    idx = [i for i, c in enumerate(comments) if c[:7] == SUMMARY_PREFIX]
    if not idx:
        return has, bad, held, used, covered, busy, busy_w
    numbers = None
    if all(comments[i][7:12] == "held=" for i in idx):
        joined = " ".join([comments[i][12:comments[i].find(" gpus=")] for i in idx])
        for key, value in (("used=", ""), ("cov=", ""), ("busy_w=-", "nan"), ("busy_w=", ""), ("busy=", "")):
            joined = joined.replace(key, value)
        numbers = _numbers(joined)
        numbers = numbers.reshape(-1, 5) if numbers is not None and numbers.size == 5 * len(idx) else None
    at = np.array(idx)
    if numbers is not None:
        held[at], used[at], covered[at], busy[at], busy_w[at] = numbers.T
        has[at] = True
    else:
        for i in idx:  # slow path
            head = parse_head(comments[i])
            if head is not None:
                held[i], used[i], covered[i], busy[i] = head[:4]
                busy_w[i] = np.nan if head[4] is None else head[4]
                has[i] = True
            else:
                bad[i] = True
    return distrust_insane(has, bad, held, used, covered, busy, busy_w)


def distrust_insane(has, bad, held, used, covered, busy, busy_w):
    """Summaries whose numbers are not finite or out of range become unmeasured (has False, bad True)."""
    with np.errstate(invalid="ignore", over="ignore"):
        sane = np.isfinite(held) & np.isfinite(used) & np.isfinite(covered) & np.isfinite(busy) \
            & (held >= 0) & (used >= 0) & (covered >= 0) & (busy >= 0) \
            & (used <= covered * SUMMARY_SLACK + 0.1) & (busy <= covered * SUMMARY_SLACK + 0.1) \
            & ~(busy_w < 0) & ~np.isinf(busy_w)
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


def parse(text: str, source: str = "sacct") -> JobTable:
    """Parse `sacct -P` output with its header line into a JobTable."""
    with _gc_paused():
        table = None
        if text.isascii() and "\r" not in text:
            data = text.encode("ascii")
            buf = _fast.padded(len(data), data)
            del data
            table = _fast.parse_bytes(buf, len(buf) - _fast.PAD, source)
        return table if table is not None else _parse(text, source)


def _parse_text(text: str, source: str = "sacct") -> JobTable:
    """The general parser over text (any encoding damage, CR line ends, ragged lines, step rows): the
    reference the fast path must agree with."""
    with _gc_paused():
        return _parse(text, source)


@contextlib.contextmanager
def _gc_paused():
    # A million rows are a few million new objects: the cyclic GC would rescan them over and over
    # (3-4x the parse time). Nothing here makes cycles, so it is paused while parsing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _columns(text: str, source: str) -> tuple[list, dict, int, list]:
    """(header, {name: column}, rows, [what was wrong with each skipped line]). Fast path: when no field holds a '|' or a blank line interrupts,
    the whole body is split at once and columns are strided slices (no per-row list objects)."""
    text = text.lstrip("\n")
    head_end = text.find("\n")
    header_line = text if head_end < 0 else text[:head_end]
    if not header_line.strip():
        raise SacctFormatError(f"{source}: empty (expected `sacct -P` output with its header line)")
    header = header_line.rstrip("\r").split("|")
    missing = [f for f in REQUIRED if f not in header]
    if missing:
        raise SacctFormatError(f"{source}:1: header lacks {', '.join(missing)} (got {'|'.join(header)}); "
                               f"export with --format={','.join(FIELDS)}")
    if "AdminComment" in header and header[-1] != "AdminComment":
        raise SacctFormatError(f"{source}:1: AdminComment must be the last column (it is free text)")
    width = len(header)
    if head_end < 0 or not text[head_end + 1:head_end + 2]:
        return header, {name: [] for name in header}, 0, []
    # Fast path: split the whole text once (header included), no per-line copies or counts. A '|' inside
    # a free-text field, a blank line or CRLF breaks the stride; the alignment checks send those to the
    # per-line path, which names the bad line.
    if "\r" not in header_line:
        flat = text.replace("\n", "|").split("|")
        if text.endswith("\n"):  # the '|' the last newline became; without it, a last empty field is real
            flat.pop()
        if len(flat) % width == 0 and flat[:width] == header:
            columns = {name: flat[width + i::width] for i, name in enumerate(header)}
            ids = "\n".join(columns["JobIDRaw"])
            if all(map(str.isdigit, columns["ElapsedRaw"])) and all(map(str.__len__, columns["JobIDRaw"])) \
                    and " " not in ids and "=" not in ids:
                return header, columns, len(flat) // width - 1, []
        del flat
    body = text[head_end + 1:]
    # only "\n" ends a line (str.splitlines would also split at \x1c-\x1e, \x85, \u2028 inside a field)
    rows = [line.split("|", width - 1) for line in body.replace("\r\n", "\n").split("\n") if line]
    ragged: list[str] = []
    if rows and (min(map(len, rows)) != width or max(map(len, rows)) != width):
        # a cut or mangled line is skipped (and counted), never fatal: one bad row must not stop SiteFactor
        # updates for the whole cluster. Only a dump with no readable row at all is refused.
        ragged = [f"{source}:{lineno}: {len(row)} fields, the header has {width}"
                  for lineno, row in enumerate(rows, start=2) if len(row) != width]
        rows = [row for row in rows if len(row) == width]
        if not rows:
            raise SacctFormatError(ragged[0] + (f" (and {len(ragged) - 1} more such lines)" if len(ragged) > 1
                                                else ""))
    if not rows:
        return header, {name: [] for name in header}, 0, ragged
    return header, dict(zip(header, map(list, zip(*rows)))), len(rows), ragged


def _parse(text: str, source: str) -> JobTable:
    header, columns, n, ragged = _columns(text, source)
    empty = ("",) * n
    raw_ids = columns["JobIDRaw"]
    if n and "." in "".join(raw_ids):  # step rows: only a dump without -X has them
        is_step = np.fromiter(("." in j for j in raw_ids), dtype=bool, count=n)
    else:
        is_step = np.zeros(n, dtype=bool)
    alloc = np.flatnonzero(~is_step)
    step = np.flatnonzero(is_step)

    def pick(name, idx=alloc):
        col = columns.get(name, empty)
        return [col[i] for i in idx.tolist()] if len(idx) != n else (col if isinstance(col, list) else list(col))

    ids = pick("JobIDRaw")
    users, accounts = pick("User"), pick("Account")
    assoc, assoc_keys = _factorize_pairs(accounts, users)
    qos, qos_names = _factorize(pick("QOS"))
    tres_codes, tres_strings = _factorize(pick("AllocTRES"))
    billing = np.array([tres_count(t, "billing") for t in tres_strings] or [0.0])[tres_codes]
    gpus = np.array([tres_count(t, "gres/gpu") for t in tres_strings] or [0.0])[tres_codes]
    comments = pick("AdminComment")
    has_summary, bad_summary, held, used, covered, busy, busy_w = _summary_heads(comments, len(ids))
    start, end = _times(pick("Start"), source), _times(pick("End"), source)
    elapsed = _ints(pick("ElapsedRaw"))
    gpuutil = np.full(len(ids), np.nan)
    gpuutil_cover = np.zeros(len(ids))
    if len(step) and "TRESUsageInAve" in columns:
        at = step.tolist()
        ntasks = [columns["NTasks"][i] for i in at] if "NTasks" in columns else None
        _join_gpuutil(ids, elapsed, [raw_ids[i] for i in at], _ints([columns["ElapsedRaw"][i] for i in at]),
                      [columns["TRESUsageInAve"][i] for i in at], gpuutil, gpuutil_cover,
                      [columns["AllocTRES"][i] for i in at], ntasks)
    table = JobTable(
        job_id_raw=ids, job_id=pick("JobID") if "JobID" in columns else list(ids), assoc=assoc,
        assoc_keys=assoc_keys, partition=pick("Partition"), qos=qos, qos_names=qos_names,
        state_raw=pick("State"), start=start, end=end, elapsed=elapsed,
        billing=billing, gpus=gpus, has_summary=has_summary, held_s=held, used_s=used, covered_s=covered,
        busy_s=busy, busy_w=busy_w, admin_comment=comments, gpuutil=gpuutil, gpuutil_cover=gpuutil_cover,
        bad_summary=bad_summary)
    keep = (start != BAD_TIME) & (end != BAD_TIME)
    table.skip_reasons = ragged + [f"{source}: job {ids[i]}: unreadable Start/End "
                                   f"({pick('Start')[i]!r}, {pick('End')[i]!r})"
                                   for i in np.flatnonzero(~keep)[:5].tolist()]
    return _without_unusable_rows(table, keep, len(ragged) + table.n - int(keep.sum()), ids, start, end, elapsed)


def _without_unusable_rows(table, keep, skipped: int, ids, start, end, elapsed, numeric=None):
    """The table without the rows `keep` leaves out (unreadable times) and without repeated runs; both parsers
    end here, so the two count skips and duplicates alike."""
    table.skipped = skipped
    duplicate = _duplicate_runs(ids, start, end, elapsed, numeric=numeric)
    if duplicate is not None:
        keep &= ~duplicate
    if keep.all():
        return table
    out = table.subset(keep)
    out.skipped, out.skip_reasons = skipped, table.skip_reasons
    out.duplicates = 0 if duplicate is None else int((duplicate & (start != BAD_TIME) & (end != BAD_TIME)).sum())
    return out


def _duplicate_runs(ids, start: np.ndarray, end: np.ndarray, elapsed: np.ndarray, numeric=None):
    """Rows that repeat an earlier row's job run (same JobIDRaw and Start), as two overlapping sacct exports
    concatenated give: of each run the most finished row is kept (ended, then longest). None when every run
    appears once; sacct prints jobs in id order, so the common case is one O(n) check in C."""
    n = len(ids)
    if n < 2:
        return None
    if numeric is None:  # (the fast path passes the ids it has read already)
        numeric = _fast_ints(ids)
    if numeric is not None and (np.diff(numeric) > 0).all():
        return None
    if numeric is None:
        numeric = _factorize(ids)[0].astype(np.int64)
    # sort so that within one (id, start) the row to keep comes last
    order = np.lexsort((elapsed, end >= 0, end, start, numeric))
    same_as_next = (numeric[order][:-1] == numeric[order][1:]) & (start[order][:-1] == start[order][1:])
    if not same_as_next.any():
        return None
    duplicate = np.zeros(n, dtype=bool)
    duplicate[order[:-1][same_as_next]] = True
    return duplicate


def _first_words(column) -> list:
    """'CANCELLED by 0' -> 'CANCELLED', splitting each distinct state once."""
    codes, names = _factorize(column)
    words = [name.split(" ", 1)[0] for name in names]
    return [words[c] for c in codes.tolist()]


def _join_gpuutil(job_ids, job_elapsed, step_ids, step_elapsed, step_usage, out_util, out_cover,
                  step_tres=None, step_ntasks=None) -> None:
    """Per job: the step-time-weighted mean of Slurm's gres/gpuutil per GPU, and the share of the job's time
    it covers. (The batch and extern steps count like any other step.)

    Slurm's gpu/nvml plugin reads each task's (pid's) SM utilization over every GPU it uses and adds them up,
    and TRESUsageInAve is the mean over the step's tasks: one task driving 4 GPUs at 90 % reads 360. The mean
    per GPU is therefore Ave x NTasks / the step's GPUs. Where NTasks or the step's gres/gpu is not in the
    dump, the value is taken as a per-GPU percentage (one task per GPU, the usual launch), and anything that
    does not fit 0..100 per GPU is not trusted."""
    where = {j: i for i, j in enumerate(job_ids)}
    weight = np.zeros(len(job_ids))
    total = np.zeros(len(job_ids))
    for k, (sid, secs, usage) in enumerate(zip(step_ids, step_elapsed.tolist(), step_usage)):
        i = where.get(sid.split(".", 1)[0])
        if i is None or secs <= 0:
            continue
        util = _gpuutil(usage)
        if util != util or util < 0:
            continue
        gpus = tres_count(step_tres[k], "gres/gpu") if step_tres is not None else 0.0
        tasks = _plain_int(step_ntasks[k], 0) if step_ntasks is not None else 0
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


def read_file(path: str) -> JobTable:
    """A dump file: read as bytes into a padded buffer (no copy) for the fast path; anything it declines
    (non-ASCII, CR line ends, ragged lines...) is decoded as UTF-8 with replacement and universal newlines,
    as a text-mode read gives, and takes the general path."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            buf = _fast.padded(size + 1)
            view = memoryview(buf)
            got = 0
            while got < size + 1:
                chunk = fh.readinto(view[got:size + 1])
                if not chunk:
                    break
                got += chunk
            view.release()
            if got > size:  # a pipe, or a file that grew: read the rest too
                rest = buf[:got].tobytes() + fh.read()
                got = len(rest)
                buf = _fast.padded(got, rest)
                del rest
            else:
                buf[got:] = 0
    except OSError as exc:
        raise SacctFormatError(f"{path}: cannot read: {exc.strerror}") from None
    with _gc_paused():
        table = _fast.parse_bytes(buf, got, path)
        if table is not None:
            return table
        text = buf[:got].tobytes().decode("utf-8", errors="replace")
        del buf
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return _parse(text, path)


from . import sacct_fast as _fast  # noqa: E402  (it builds on the helpers above)
