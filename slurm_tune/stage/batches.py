"""The small files of a tree copy, in batches that several `cp -R -P --parents` processes copy at once, started
while the walk that finds them is still going (copy.copy_tree feeds them in, directory by directory).

- **While the walk goes on**, a batch starts as soon as a worker is free and the walk has found enough files
  for one: the first batch FIRST_BATCH files, each later one up to twice the one before (at most BATCH_FILES
  names or BATCH_BYTES), so the workers start within milliseconds and later batches cost few starts.
- **At the walk's end** the files not yet given out are cut into batches of about total / (2 x workers)
  bytes (_chunks), so the last worker is not left alone with a big one.
- Batches follow the walk's order, so each stays within a few directories: the workers do not all contend
  for the same directory locks (sorting by size, which scatters every directory over every worker,
  measured 2-3x slower).

Per small file, `cp` processes beat Python threads here: the threads share one descriptor table and one
GIL, and on a loaded 2-core VM a 20k-file copy took 1.3-1.7x longer (docs/stage.md). `-P` copies a symlink
as a symlink; `-R` recreates a FIFO planted after the walk instead of waiting on it for a writer. The
workers run with umask 0222, so the copies are read-only without a chmod per file.
"""

from __future__ import annotations

import os
import time

from .watch import TICK_S, Guard, Progress
from .workers import failure, kill, spawn, wait_any

FIRST_BATCH = 256  # names in the first batch started while the walk goes on; each later one may double
BATCH_BYTES = 64 << 20  # a batch holds at most this many bytes ...
BATCH_FILES = 4000  # ... or names (~200 KiB of argv: well inside ARG_MAX)


def _path(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class Batches:
    """The `cp` workers of one tree copy. add() gives them the files of a directory the walk has listed,
    pump() reaps the workers that are done and (with `start`) starts batches in the free slots, finish()
    gives out the rest once the walk is done and waits for all. A worker that fails raises its error
    (TierUnavailable or SourceError) from pump() or finish(); leaving the `with` block on an error kills
    the workers still running."""

    def __init__(
        self,
        src: str,
        dst: str,
        jobs: int,
        errlog,
        progress: Progress | None = None,
        guard: Guard | None = None,
    ):
        # The workers run in src: a relative dst (a tier given as `--path cache`) must not be taken from there.
        self.src, self.dst, self.jobs = src, os.path.abspath(dst), jobs
        self.errlog = errlog  # a temporary file: the workers' stderr, for the error of one that fails
        self.progress, self.guard = progress, guard
        self.backlog: list[tuple[str, int]] = []  # (relative path, bytes) walked, not given out yet
        self.backlog_bytes = 0
        self.running: dict = {}  # worker -> (bytes, names) of its batch
        self.limit = FIRST_BATCH
        self.done_bytes = self.done_files = 0
        self.next_tick = time.monotonic() + TICK_S

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            kill(list(self.running))

    def add(self, files: list, links: list) -> None:
        """Queue small files (relative directory, name, size, mode) and symlinks (relative directory, name)."""
        for rel, name, size, _mode in files:
            self.backlog.append((_path(rel, name), size))
            self.backlog_bytes += size
        self.backlog += [(_path(rel, name), 0) for rel, name in links]

    def wants_worker(self) -> bool:
        """A slot is free and the walk has found enough for the next batch."""
        return len(self.running) < self.jobs and (
            len(self.backlog) >= self.limit or self.backlog_bytes >= BATCH_BYTES
        )

    def pump(self, start: bool = True) -> None:
        """Reap finished workers (without waiting) and, with `start`, fill the free slots from the backlog."""
        for proc in [p for p in self.running if p.poll() is not None]:
            self._reaped(proc)
        while start and self.wants_worker():
            take, nbytes = 0, 0
            for _, size in self.backlog[: self.limit]:
                if take and nbytes + size > BATCH_BYTES:
                    break
                take += 1
                nbytes += size
            names = [path for path, _size in self.backlog[:take]]
            del self.backlog[:take]
            self.backlog_bytes -= nbytes
            self._start(names, nbytes)
            self.limit = min(BATCH_FILES, 2 * self.limit)
        self._tick()

    def finish(self) -> tuple[int, int]:
        """The walk is done: cut the backlog into even batches, run them, wait for every worker. Returns the
        bytes and names copied."""
        chunks = _chunks(self.backlog, self.backlog_bytes, self.jobs)
        self.backlog, self.backlog_bytes = [], 0
        while chunks or self.running:
            while chunks and len(self.running) < self.jobs:
                self._start(*chunks.pop(0))
            for proc in wait_any(list(self.running), TICK_S):
                self._reaped(proc)
            self._tick(force=True)
        return self.done_bytes, self.done_files

    def _start(self, names: list[str], nbytes: int) -> None:
        # No --preserve=mode: cp then gives each file the source's mode less the umask, and the umask 0222
        # makes the copy read-only without a chmod per file.
        argv = ["cp", "-R", "-P", "--parents", "-t", self.dst, "--", *names]
        self.running[spawn(argv, self.src, self.errlog, umask=0o222)] = (nbytes, len(names))

    def _reaped(self, proc) -> None:
        nbytes, nfiles = self.running.pop(proc)
        if proc.returncode != 0:
            raise failure(self.errlog, f"copying {self.src}")
        self.done_bytes += nbytes
        self.done_files += nfiles

    def _tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self.next_tick:
            return
        self.next_tick = now + TICK_S
        if self.guard:
            self.guard.check()
        if self.progress:
            self.progress.update(self.done_bytes, self.done_files)


def _chunks(items: list[tuple[str, int]], total: int, jobs: int) -> list[tuple[list[str], int]]:
    """Cut (path, bytes) items, in walk order, into batches of about total / (2 x jobs) bytes, so no batch is
    much bigger than its share and the last worker is not alone. Items bigger than a batch go first, alone,
    so the longest copies start early."""
    target = max(1 << 20, min(BATCH_BYTES, total // (jobs * 2) + 1))
    big = [([path], size) for path, size in items if size >= target]
    chunks: list[tuple[list[str], int]] = []
    cur: list[str] = []
    cur_bytes = 0
    for path, size in items:
        if size >= target:
            continue
        if cur and (cur_bytes + size > target or len(cur) >= BATCH_FILES):
            chunks.append((cur, cur_bytes))
            cur, cur_bytes = [], 0
        cur.append(path)
        cur_bytes += size
    if cur:
        chunks.append((cur, cur_bytes))
    return sorted(big, key=lambda c: -c[1]) + chunks
