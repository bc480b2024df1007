"""A site's job runs from sacct, for the lemon scoring and the reliability report: one row per run (requeued
runs are rows of their own, so the query has -D), as numpy columns.

The text is `sacct -P` with its header line, the same for a live read and a dump (`--sacct-file`):

    SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert -S 2025-01-01 \
        --format=JobIDRaw,JobID,User,Partition,State,Start,End,ElapsedRaw,NNodes,AllocTRES,NodeList,AdminComment

Columns may come in any order; AdminComment (free text, may hold '|') must be last and is optional. Times are
epoch seconds or sacct's ISO local time. The text is cut into lines and fields by the accountant's block
reader (fairshare/sacct.py) and each column is read by its column readers (fairshare/sacct_values.py), so a
dump reads here exactly as it reads there. A row that cannot be read (a cut line, an unreadable Start, End,
ElapsedRaw or NNodes) is skipped and counted, never fatal; rows that never ran (pending, Start unknown) and
step rows are passed over. (A NodeList that does not name NNodes nodes is left out of the lemon test, and
counted there, lemons.py.) Of AdminComment only the lines that
hold a stored transport verdict (`comm=`, usage/jobfiles.py) are kept.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import StuneError
from ..fairshare import sacct as block_reader
from ..fairshare.sacct_values import BAD_TIME, counts, epochs
from ..hostlist import expand_hostlist
from ..slurm.tres import tres_count

FIELDS = (
    "JobIDRaw",
    "JobID",
    "User",
    "Partition",
    "State",
    "Start",
    "End",
    "ElapsedRaw",
    "NNodes",
    "AllocTRES",
    "NodeList",
    "AdminComment",
)
REQUIRED = ("JobIDRaw", "Partition", "State", "Start", "End", "ElapsedRaw", "NNodes", "NodeList")
MAX_NODES = 100_000  # NNodes above this is no allocation (a forged or damaged row): skipped
SKIP_REASONS_KEPT = 5


class HistoryFormatError(StuneError):
    """A sacct dump that cannot be read at all: names the file and line."""


@dataclass
class Runs:
    """The job runs that ran (Start known). Codes index `partitions` and `states` (a state's first word:
    `CANCELLED by 0` is CANCELLED). end is -1 for a run still going; `comments` holds the AdminComment of the
    rows that have a transport verdict, by row."""

    job_id: list[str]
    partition: np.ndarray
    partitions: list[str]
    state: np.ndarray
    states: list[str]
    start: np.ndarray
    end: np.ndarray
    elapsed: np.ndarray
    nodes: np.ndarray
    gpus: np.ndarray
    nodelist: list[str]
    comments: dict[int, str] = field(default_factory=dict)
    skipped: int = 0
    duplicates: int = 0
    skip_reasons: list[str] = field(default_factory=list)
    _hosts: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return len(self.job_id)

    @property
    def as_of(self) -> int:
        """The latest time the rows show: what "now" is for a dump (a running job runs until then)."""
        if not self.n:
            return 0
        return int(max(self.end.max(), (self.start + self.elapsed).max()))

    def state_name(self, i: int) -> str:
        return self.states[int(self.state[i])]

    def partition_name(self, i: int) -> str:
        return self.partitions[int(self.partition[i])]

    def hosts(self, i: int) -> tuple[str, ...]:
        """The run's node names (its NodeList expanded; cached per distinct list)."""
        text = self.nodelist[i]
        found = self._hosts.get(text)
        if found is None:
            found = self._hosts[text] = tuple(expand_hostlist(text))
        return found

    def ends(self, now: int) -> np.ndarray:
        """End times with a running run's taken as `now` (and never before its start)."""
        end = np.where(self.end < 0, now, self.end)
        return np.maximum(end, self.start)

    def warnings(self) -> list[str]:
        out = []
        if self.skipped:
            shown = "; ".join(self.skip_reasons[:3])
            out.append(f"{self.skipped} unreadable sacct row(s) skipped" + (f": {shown}" if shown else ""))
        if self.duplicates:
            out.append(f"{self.duplicates} duplicate row(s) of the same run dropped (overlapping exports?)")
        return out


def parse(text: str, source: str = "sacct") -> Runs:
    """`sacct -P` output with its header line into Runs."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    block = block_reader.BLOCK
    return _read((text[at : at + block] for at in range(0, len(text), block)), source)


def read_file(path: str) -> Runs:
    """A dump file, as a text-mode read gives it (UTF-8, damaged bytes replaced, universal newlines)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return _read(iter(lambda: fh.read(block_reader.BLOCK), ""), path)
    except OSError as exc:
        raise HistoryFormatError(f"{path}: cannot read: {exc.strerror}") from None


def read_live(slurm, start: int | str, end: int | str | None = None) -> Runs:
    """The runs of the window from the cluster: `sacct -a -X -D -P` (every run of a requeued job)."""
    return parse(slurm.sacct_dump(list(FIELDS), start=start, end=end, duplicates=True), "sacct")


class _Columns:
    """The rows' columns, block by block: strings kept as read, repeated ones as codes."""

    def __init__(self, header: list[str]) -> None:
        self.header = header
        self.codes: dict[str, defaultdict[str, int]] = {
            name: defaultdict(itertools.count().__next__) for name in ("Partition", "State", "AllocTRES")
        }  # a new value: the next code (fairshare/sacct.py's _Codes)
        self.coded: dict[str, list[int]] = {name: [] for name in self.codes}
        self.job_id: list[str] = []
        self.nodelist: list[str] = []
        self.numbers: list[tuple[np.ndarray, ...]] = []
        self.comments: dict[int, str] = {}
        self.bad: list[str] = []  # the first unreadable rows, "job: why"
        self.bad_rows = 0

    def add(self, fields: Sequence[Sequence[str]]) -> None:
        columns = dict(zip(self.header, fields))
        ids = columns["JobIDRaw"]
        if "." in "".join(ids):  # allocations only: step rows are passed over
            ran = [("." not in job) for job in ids]
            columns = {k: list(itertools.compress(v, ran)) for k, v in columns.items()}
            ids = columns["JobIDRaw"]
        start, end = epochs(columns["Start"]), epochs(columns["End"])
        keep = start >= 0  # pending and never-started rows: nothing ran
        bad = (start == BAD_TIME) | (end == BAD_TIME)
        elapsed, nodes = counts(columns["ElapsedRaw"]), counts(columns["NNodes"])
        bad |= keep & ~bad & ((nodes <= 0) | (nodes > MAX_NODES))
        keep &= ~bad
        self._note_bad(ids, columns, bad)
        if not keep.all():
            at = np.flatnonzero(keep).tolist()
            columns = {k: [v[i] for i in at] for k, v in columns.items()}
            ids = columns["JobIDRaw"]
            start, end, elapsed, nodes = start[keep], end[keep], elapsed[keep], nodes[keep]
        n = len(ids)
        if not n:
            return
        offset = len(self.job_id)
        for name, index in self.codes.items():  # (State as printed: its first word is taken per value)
            self.coded[name].extend(map(index.__getitem__, columns.get(name) or ("",) * n))
        self.job_id += ids
        self.nodelist += columns["NodeList"]
        self.numbers.append((start, end, elapsed, nodes))
        comments = columns.get("AdminComment", ())
        if "comm=" in "".join(comments):
            for k, comment in enumerate(comments):
                if "comm=" in comment:
                    self.comments[offset + k] = comment

    def _note_bad(self, ids, columns, bad: np.ndarray) -> None:
        rows = np.flatnonzero(bad).tolist()
        self.bad_rows += len(rows)
        for i in rows[: max(0, SKIP_REASONS_KEPT - len(self.bad))]:
            self.bad.append(
                f"job {ids[i][:40]}: unreadable Start/End/ElapsedRaw/NNodes "
                f"({columns['Start'][i][:30]!r}, {columns['End'][i][:30]!r}, "
                f"{columns['ElapsedRaw'][i][:30]!r}, {columns['NNodes'][i][:30]!r})"
            )


def _read(blocks: Iterable[str], source: str) -> Runs:
    columns = None
    cut: list[str] = []
    number = 1
    for lines in block_reader.block_lines(blocks):
        at = 0
        if columns is None:  # (blank lines before the header are passed over)
            at = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
            if at == len(lines):
                number += len(lines)
                continue
            columns = _Columns(
                block_reader.check_header(
                    lines[at], number + at, source, REQUIRED, FIELDS, HistoryFormatError
                )
            )
            at += 1
        fields = block_reader.block_fields(lines[at:], number + at, len(columns.header), source, cut)
        if fields:
            columns.add(fields)
        number += len(lines)
    if columns is None:
        raise HistoryFormatError(f"{source}: empty (expected `sacct -P` output with its header line)")
    if cut and not columns.job_id and not columns.bad_rows:
        raise HistoryFormatError(cut[0] + (f" (and {len(cut) - 1} more such lines)" if len(cut) > 1 else ""))
    return _runs(columns, cut)


def _runs(columns: _Columns, cut: list[str]) -> Runs:
    empty = np.zeros(0, dtype=np.int64)
    start, end, elapsed, nodes = (
        [np.concatenate(parts) for parts in zip(*columns.numbers)] if columns.numbers else [empty] * 4
    )
    tres = list(columns.codes["AllocTRES"])
    gpus = np.array([tres_count(t, "gres/gpu") for t in tres] or [0.0])[
        np.array(columns.coded["AllocTRES"], dtype=np.intp)
    ]
    words: dict[str, int] = {}  # `CANCELLED by 0` and `CANCELLED by 1001` are one state, CANCELLED
    word_of = np.array(
        [words.setdefault(s.split(" ", 1)[0], len(words)) for s in columns.codes["State"]] or [0]
    )
    runs = Runs(
        job_id=columns.job_id,
        partition=np.array(columns.coded["Partition"], dtype=np.int32),
        partitions=list(columns.codes["Partition"]),
        state=word_of[np.array(columns.coded["State"], dtype=np.intp)].astype(np.int32),
        states=list(words),
        start=start,
        end=end,
        elapsed=elapsed,
        nodes=nodes,
        gpus=gpus if len(gpus) == len(start) else np.zeros(len(start)),
        nodelist=columns.nodelist,
        comments=columns.comments,
    )
    runs.skipped = len(cut) + columns.bad_rows
    runs.skip_reasons = (cut[:SKIP_REASONS_KEPT] + columns.bad)[:SKIP_REASONS_KEPT]
    return _dedup(runs)


def _dedup(runs: Runs) -> Runs:
    """Rows that repeat a run (same JobIDRaw and Start: two overlapping exports concatenated) count once:
    the most finished row is kept (fairshare/sacct.py's rule)."""
    numeric = None
    if runs.n and all(j.isascii() and j.isdigit() and len(j) < 18 for j in runs.job_id):
        numeric = np.array(runs.job_id, dtype=np.int64)
    duplicate = block_reader.duplicate_runs(runs.job_id, runs.start, runs.end, runs.elapsed, numeric)
    if duplicate is None:
        return runs
    keep = np.flatnonzero(~duplicate).tolist()
    out = Runs(
        job_id=[runs.job_id[i] for i in keep],
        partition=runs.partition[keep],
        partitions=runs.partitions,
        state=runs.state[keep],
        states=runs.states,
        start=runs.start[keep],
        end=runs.end[keep],
        elapsed=runs.elapsed[keep],
        nodes=runs.nodes[keep],
        gpus=runs.gpus[keep],
        nodelist=[runs.nodelist[i] for i in keep],
        comments={new: runs.comments[old] for new, old in enumerate(keep) if old in runs.comments},
        skipped=runs.skipped,
        duplicates=int(duplicate.sum()),
        skip_reasons=runs.skip_reasons,
    )
    return out
