"""sacct rows into the accountant's JobTable: one plain reader for live reads and dumps.

The text is `sacct -P` with a header line (the live read asks for exactly that; a dump for --sacct-file is
the same command's output):

    SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert -S 2024-01-01 \
        --format=JobIDRaw,JobID,User,Account,Partition,QOS,State,Start,End,ElapsedRaw,AllocTRES,AdminComment

Columns may come in any order; AdminComment (free text, may hold '|') must be last. Times may be epoch
seconds (SLURM_TIME_FORMAT=%s) or sacct's ISO local time. Step rows (JobIDRaw with a '.') are used only for
their TRESUsageInAve gres/gpuutil, which Slurm >= 23.02 records when built with NVML.

Every row is checked, and a row that cannot be read is skipped and counted, never fatal (one bad row must
not stop SiteFactor updates for the whole cluster): a line with the wrong number of fields, an unreadable
Start/End. Only a dump with no readable row at all is refused. The text is read in blocks of a few hundred
rows: a block whose lines all have the header's fields is split in one str.split and each column is every
width-th field (else line by line, then transposed), and its columns are read by sacct_values.py; repeated
strings (users, accounts, QOS, AllocTRES) are kept as codes into their distinct values.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import StuneError
from ..slurm.tres import accel_count, tres_count
from . import sacct_values as values
from .sacct_values import BAD_TIME

FIELDS = (
    "JobIDRaw",
    "JobID",
    "User",
    "Account",
    "Partition",
    "QOS",
    "State",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "AdminComment",
)
STEP_FIELDS = ("NTasks", "TRESUsageInAve")
REQUIRED = ("JobIDRaw", "User", "Account", "State", "Start", "End", "ElapsedRaw", "AllocTRES")
# Characters read and split at a time: a few hundred rows, whose strings stay in the CPU's cache from the
# split to the column readers (4 MB blocks were 15-20 % slower on 1M rows, a whole dump's far more).
BLOCK = 1 << 16


class SacctFormatError(StuneError):
    """A sacct dump that cannot be read: names the file and line."""


@dataclass
class JobTable:
    """Allocation rows, one per job run (requeued runs are separate rows). Arrays have one entry per row."""

    job_id_raw: list[str]
    job_id: list[str]  # as users know it (array jobs: 123_4)
    assoc: np.ndarray  # int32 code into assoc_keys
    assoc_keys: list[tuple[str, str]]  # (account, user)
    partition: list[str]  # kept as read: only reports look at it, for a few rows
    qos: np.ndarray  # int32 code into qos_names
    qos_names: list[str]
    state_raw: list[str]  # as sacct prints it ("CANCELLED by 0")
    start: np.ndarray  # int64 epoch, -1 unknown
    end: np.ndarray  # int64 epoch, -1 unknown (running)
    elapsed: np.ndarray  # int64 seconds
    billing: np.ndarray  # float64, Slurm's billable TRES
    gpus: np.ndarray  # float64, gres/gpu allocated
    has_summary: np.ndarray  # bool
    held_s: np.ndarray  # float64 GPU-seconds per the summary (NaN without one)
    used_s: np.ndarray
    covered_s: np.ndarray
    busy_s: np.ndarray
    busy_w: np.ndarray
    admin_comment: list[str]  # raw, for the report's per-GPU details
    gpuutil: np.ndarray  # float64 percent from Slurm's gres/gpuutil (NaN when not recorded)
    gpuutil_cover: np.ndarray  # float64 0..1: step time with a gpuutil reading over the job's time
    bad_summary: np.ndarray  # bool: a stune summary that is damaged or out of range (unmeasured)
    skipped: int = 0  # rows dropped: unreadable (cut lines, unreadable Start/End)
    duplicates: int = 0  # rows dropped: the same job run twice in the dump (overlapping exports)
    skip_reasons: list[str] = field(default_factory=list)  # the first few skipped rows, "file:line: why"

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
    def state(self) -> list[str]:
        codes, names = _factorize(self.state_raw)
        words = [name.split(" ", 1)[0] for name in names]
        return [words[c] for c in codes.tolist()]

    def subset(self, keep: np.ndarray) -> JobTable:
        """The rows where `keep` is True (association and QOS codes keep their tables)."""
        at = np.flatnonzero(keep).tolist()
        out = {}
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                out[name] = value[keep]
            elif name in ("job_id_raw", "job_id", "partition", "state_raw", "admin_comment"):
                out[name] = [value[i] for i in at]
            else:
                out[name] = value
        return JobTable(**out)

    def warnings(self) -> list[str]:
        """The rows that were skipped or not trusted, said once per run, never fatal."""
        out = []
        if self.skipped:
            shown = "; ".join(self.skip_reasons[:3])
            out.append(f"{self.skipped} unreadable sacct row(s) skipped" + (f": {shown}" if shown else ""))
        if self.duplicates:
            out.append(
                f"{self.duplicates} duplicate row(s) of the same job run dropped "
                "(overlapping exports?); each run is counted once"
            )
        bad = int(self.bad_summary.sum())
        if bad:
            out.append(
                f"{bad} damaged or out-of-range usage summary(ies) not trusted: charged as Slurm "
                "charges (eta = 1)"
            )
        return out

    def keys(self) -> list[str]:
        """A run's identity: job id and start time (a requeued job runs again under the same id)."""
        return [f"{j}@{s}" for j, s in zip(self.job_id_raw, self.start.tolist())]


def _factorize(column: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(codes, distinct values in first-seen order)."""
    codes = _Codes()
    codes.add(column)
    return codes.array(), codes.names


class _Codes:
    """A column of repeated strings (users, accounts, QOS, AllocTRES) as codes into its distinct values, in
    first-seen order, added block by block."""

    def __init__(self) -> None:
        self.index: defaultdict[str, int] = defaultdict(
            itertools.count().__next__
        )  # a new value: the next code
        self.codes: list[int] = []

    def add(self, column: Sequence[str]) -> None:
        self.codes.extend(map(self.index.__getitem__, column))

    @property
    def names(self) -> list[str]:
        return list(self.index)

    def array(self) -> np.ndarray:
        return np.array(self.codes, dtype=np.int32)


class _Columns:
    """The allocation rows' columns, read block by block; step rows are kept aside for their gpuutil."""

    CODED = ("User", "Account", "QOS", "AllocTRES")
    KEPT = ("JobIDRaw", "JobID", "Partition", "State", "AdminComment")

    def __init__(self, header: list[str]) -> None:
        self.header = header
        self.coded = {name: _Codes() for name in self.CODED}
        self.kept: dict[str, list[str]] = {name: [] for name in self.KEPT}
        self.numbers: list[tuple[np.ndarray, ...]] = []  # per block: (Start, End, ElapsedRaw)
        self.summaries = values.Summaries()
        self.numeric_ids: list[np.ndarray] | None = []  # JobIDRaw as numbers (None: some id is not one)
        self.steps: dict[str, list[str]] = {name: [] for name in header}
        self.bad_times: list[tuple[str, str, str]] = []  # (JobIDRaw, Start, End) of the first unreadable

    def add(self, fields: Sequence[Sequence[str]]) -> None:
        """A block's rows, as its columns (in the header's order)."""
        columns = dict(zip(self.header, fields))
        ids: Sequence[str] = columns["JobIDRaw"]
        numeric = values.plain_column(ids)
        if numeric is None and "." in "".join(ids):  # step rows: only a dump without -X has them
            step = ["." in job for job in ids]
            for name, column in columns.items():
                self.steps[name] += itertools.compress(column, step)
            job = [not s for s in step]
            columns = {name: list(itertools.compress(column, job)) for name, column in columns.items()}
            ids = columns["JobIDRaw"]
            if not ids:
                return
            numeric = values.plain_column(ids)
        n = len(ids)
        for name, codes in self.coded.items():
            codes.add(columns.get(name) or ("",) * n)
        self.kept["JobIDRaw"].extend(ids)
        self.kept["JobID"].extend(columns.get("JobID", ids))
        for name in ("Partition", "State", "AdminComment"):
            self.kept[name].extend(columns.get(name, ("",) * n))
        start, end = values.epochs(columns["Start"]), values.epochs(columns["End"])
        if len(self.bad_times) < 5:
            self.bad_times += [
                (ids[i], columns["Start"][i], columns["End"][i])
                for i in np.flatnonzero((start == BAD_TIME) | (end == BAD_TIME))[:5].tolist()
            ]
        self.numbers.append((start, end, values.counts(columns["ElapsedRaw"])))
        self.summaries.add(columns.get("AdminComment", ()), n)
        if numeric is None:
            self.numeric_ids = None
        elif self.numeric_ids is not None:
            self.numeric_ids.append(numeric)


def parse(text: str, source: str = "sacct") -> JobTable:
    """Parse `sacct -P` output with its header line into a JobTable."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    with _gc_paused():
        return _parse((text[at : at + BLOCK] for at in range(0, len(text), BLOCK)), source)


def read_file(path: str) -> JobTable:
    """A dump file, read as a text-mode read gives it: UTF-8 (damaged bytes replaced) and universal newlines,
    a block at a time."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh, _gc_paused():
            return _parse(iter(lambda: fh.read(BLOCK), ""), path)
    except OSError as exc:
        raise SacctFormatError(f"{path}: cannot read: {exc.strerror}") from None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # A million rows are a few million new objects: the cyclic GC would rescan them over and over
    # (3-4x the parse time). Nothing here makes cycles, so it is paused while parsing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def block_lines(blocks: Iterable[str]) -> Iterator[list[str]]:
    """The lines of the text the blocks make up, a block's worth at a time. Only '\n' ends a line
    (str.splitlines would also split at \x1c-\x1e, \x85, \u2028 inside a field)."""
    rest = ""
    for block in blocks:
        lines = (rest + block).split("\n")
        rest = lines.pop()
        yield lines
    yield [rest]


def check_header(
    line: str,
    number: int,
    source: str,
    required: Sequence[str] = REQUIRED,
    fields: Sequence[str] = FIELDS,
    error: type[StuneError] = SacctFormatError,
) -> list[str]:
    """The header line's fields, checked: every `required` column there, AdminComment (free text) last, no
    column twice. The run history's reader (reliability/history.py) checks its own columns with it."""
    if not line.strip():
        raise error(f"{source}: empty (expected `sacct -P` output with its header line)")
    header = line.rstrip("\r").split("|")
    missing = [f for f in required if f not in header]
    if missing:
        raise error(
            f"{source}:{number}: header lacks {', '.join(missing)} (got {'|'.join(header)[:200]}); "
            f"export with --format={','.join(fields)}"
        )
    if "AdminComment" in header and header[-1] != "AdminComment":
        raise error(f"{source}:{number}: AdminComment must be the last column (it is free text)")
    if len(set(header)) != len(header):
        raise error(f"{source}:{number}: a column is named twice in the header")
    return header


def block_fields(
    lines: list[str], number: int, width: int, source: str, cut: list[str]
) -> list[Sequence[str]]:
    """The lines' (the first is line `number`) `width` fields, as columns (the last keeps any further '|'); a
    blank line is passed over, and a cut or mangled line (fewer fields) is skipped and described in `cut`."""
    if lines and list(map(str.count, lines, itertools.repeat("|"))).count(width - 1) == len(lines):
        # Every line has exactly the header's fields (the common case): the block splits in one go, and
        # each column is every width-th field (no list per row, no transposing).
        fields = "|".join(lines).split("|")
        return [fields[k::width] for k in range(width)]
    rows = list(map(str.split, lines, itertools.repeat("|"), itertools.repeat(width - 1)))
    if rows and min(map(len, rows)) < width:  # (a blank line too: one field)
        cut += [
            f"{source}:{number + k}: {line.count('|') + 1} fields, the header has {width}"
            for k, line in enumerate(lines)
            if line and line.count("|") < width - 1
        ]
        rows = [row for row in rows if len(row) == width]
    return list(zip(*rows))


def _parse(blocks: Iterable[str], source: str) -> JobTable:
    columns = None
    cut: list[str] = []
    number = 1  # of the first line of each block's lines
    for lines in block_lines(blocks):
        at = 0
        if columns is None:  # (blank lines before the header are passed over)
            at = next((i for i, line in enumerate(lines) if line), len(lines))
            if at == len(lines):
                number += len(lines)
                continue
            columns = _Columns(check_header(lines[at], number + at, source))
            at += 1
        fields = block_fields(lines[at:], number + at, len(columns.header), source, cut)
        if fields:
            columns.add(fields)
        number += len(lines)
    if columns is None:
        raise SacctFormatError(f"{source}: empty (expected `sacct -P` output with its header line)")
    header = columns.header
    ids = columns.kept["JobIDRaw"]
    if cut and not ids and not columns.steps["JobIDRaw"]:
        raise SacctFormatError(cut[0] + (f" (and {len(cut) - 1} more such lines)" if len(cut) > 1 else ""))
    n = len(ids)
    assoc, assoc_keys = _factorize_pairs(columns.coded["Account"], columns.coded["User"])
    tres = columns.coded["AllocTRES"]
    tres_codes = tres.array()
    billing = np.array([tres_count(t, "billing") for t in tres.names] or [0.0])[tres_codes]
    gpus = np.array([accel_count(t) for t in tres.names] or [0.0])[tres_codes]  # GPUs or NPUs
    comments = columns.kept["AdminComment"]
    start, end, elapsed = (
        [np.concatenate(parts) for parts in zip(*columns.numbers)]
        if columns.numbers
        else [np.zeros(0, dtype=np.int64)] * 3
    )
    has_summary, bad_summary, held, used, covered, busy, busy_w = columns.summaries.arrays()
    gpuutil = np.full(n, np.nan)
    gpuutil_cover = np.zeros(n)
    if columns.steps["JobIDRaw"] and "TRESUsageInAve" in header:
        values.join_gpuutil(ids, elapsed, columns.steps, gpuutil, gpuutil_cover)
    qos = columns.coded["QOS"]
    table = JobTable(
        job_id_raw=ids,
        job_id=columns.kept["JobID"],
        assoc=assoc,
        assoc_keys=assoc_keys,
        partition=columns.kept["Partition"],
        qos=qos.array(),
        qos_names=qos.names,
        state_raw=columns.kept["State"],
        start=start,
        end=end,
        elapsed=elapsed,
        billing=billing,
        gpus=gpus,
        has_summary=has_summary,
        held_s=held,
        used_s=used,
        covered_s=covered,
        busy_s=busy,
        busy_w=busy_w,
        admin_comment=comments,
        gpuutil=gpuutil,
        gpuutil_cover=gpuutil_cover,
        bad_summary=bad_summary,
    )
    readable = (start != BAD_TIME) & (end != BAD_TIME)
    table.skipped = len(cut) + n - int(readable.sum())
    table.skip_reasons = cut[:5] + [
        f"{source}: job {job}: unreadable Start/End ({s!r}, {e!r})" for job, s, e in columns.bad_times[:5]
    ]
    numeric_ids = None if columns.numeric_ids is None else np.concatenate(columns.numeric_ids or [start[:0]])
    duplicate = duplicate_runs(ids, start, end, elapsed, numeric_ids)
    keep = readable if duplicate is None else readable & ~duplicate
    if keep.all():
        return table
    out = table.subset(keep)
    out.duplicates = 0 if duplicate is None else int((duplicate & readable).sum())
    return out


def _factorize_pairs(first: _Codes, second: _Codes) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Codes of (first, second) pairs (account, user), from the two columns' codes."""
    a, b = first.array(), second.array()
    a_names, b_names = first.names, second.names
    if not len(a):
        return a, []
    distinct, codes = np.unique(a.astype(np.int64) * len(b_names) + b, return_inverse=True)
    keys = [(a_names[c // len(b_names)], b_names[c % len(b_names)]) for c in distinct.tolist()]
    return codes.astype(np.int32).ravel(), keys


def duplicate_runs(
    ids: list[str], start: np.ndarray, end: np.ndarray, elapsed: np.ndarray, numeric: np.ndarray | None
) -> np.ndarray | None:
    """Rows that repeat an earlier row's job run (same JobIDRaw and Start), as two overlapping sacct exports
    concatenated give: of each run the most finished row is kept (ended, then longest). None when every run
    appears once; sacct prints jobs in id order, so the common case is one O(n) check. `numeric`: the ids as
    numbers, None when some id is not one."""
    if len(ids) < 2:
        return None
    if numeric is not None and (np.diff(numeric) > 0).all():
        return None
    if numeric is None:
        numeric = _factorize(ids)[0].astype(np.int64)
    # sort so that within one (id, start) the row to keep comes last
    order = np.lexsort((elapsed, end >= 0, end, start, numeric))
    same_as_next = (numeric[order][:-1] == numeric[order][1:]) & (start[order][:-1] == start[order][1:])
    if not same_as_next.any():
        return None
    duplicate = np.zeros(len(ids), dtype=bool)
    duplicate[order[:-1][same_as_next]] = True
    return duplicate
