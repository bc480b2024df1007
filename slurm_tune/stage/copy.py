"""Copying a directory tree or a file into a staging directory, fast.

- A big file (SPLIT bytes or more), alone or in a tree: this process's worker threads copy it in ranges
  into a copy preallocated here (a full disk shows before the first byte moves), each range in a few
  copy_file_range(2) calls of up to CHUNK bytes: the kernel copies, the GIL is released, no Python runs per
  byte. Where copy_file_range cannot (a source on another filesystem: EXDEV on Linux >= 5.19; old kernels:
  ENOSYS; filesystems without it), the copy falls back to sendfile(2), then to pread/pwrite, once for all
  later calls. Its mode (less the write bits) and, for a single file, its times are kept.
- The rest of a tree (small files and symlinks): cut into batches, in walk order, that several
  `cp -R -P --parents` processes copy at once. Per small file, Python threads lost to processes here: they
  share one descriptor table and one GIL, and on a loaded 2-core VM a 20k-file copy took 1.3-1.7x longer
  than the same batches in `cp` processes (docs/stage.md). Symlinks are copied as symlinks (-P); sockets,
  FIFOs and devices are skipped by the walk, and one planted after it is recreated, not read (-R).

A big file's source is opened O_NOFOLLOW|O_NONBLOCK (replaced by a symlink or a FIFO since the walk: refused,
never followed or waited on), its copy created O_EXCL|O_NOFOLLOW, and each range's writer checks that it
reopened the file this copy created. Every copy reports progress and watches the tier's free space and its
byte allowance (watch.py): when either runs out it stops its workers and raises TierUnavailable.

A published copy is read-only (no write bit on any file or directory under data/): a job that writes into
$STUNE_STAGE_X gets EACCES instead of silently changing what every later job reads. The `cp` workers run
with umask 0222 and big files get read_only(mode) when their ranges are in; directories are set at the end.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import deque

from ..safeio import O_DIR, O_FILE, UnsafePathError, create_exclusive, open_file
from .errors import SourceError, TierUnavailable
from .evict import Claim
from .fresh import Plan, Source, Walker
from .watch import TICK_S, Guard, Progress

CHUNK = 256 << 20  # bytes per copy_file_range or sendfile call: the kernel loops inside it
SPLIT = 128 << 20  # a file this big is cut into ranges copied by several workers at once
RW_CHUNK = 1 << 20  # pread/pwrite buffer, the last fallback

CFR, SENDFILE, RW = 0, 1, 2  # how bytes move, best first; a copy only ever moves down
_NO_CFR = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ETXTBSY}
_NO_SENDFILE = {errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_FULL = {errno.ENOSPC, errno.EDQUOT}


def default_jobs() -> int:
    """Copy workers: I/O bound, so more than the cores, within reason. STUNE_STAGE_JOBS overrides."""
    env = os.environ.get("STUNE_STAGE_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return min(int(env), 64)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(4, min(16, 2 * cpus))


def read_only(mode: int) -> int:
    """A published directory's or file's mode: the owner can still read and enter it, nobody can write."""
    return (mode | 0o400) & ~0o222 & 0o7777


def _path(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


class _Copier:
    """Worker threads that take the ranges of big files from one queue. The first error stops them all
    (each finishes its current call and leaves) and is raised by run()."""

    def __init__(self, src: str, dst: str, jobs: int, what: str):
        self.src, self.dst, self.jobs, self.what = src, dst, jobs, what
        self.work: deque = deque()
        self.method = CFR
        self.stopped = False
        self.error: BaseException | None = None
        self.done = [[0, 0] for _ in range(jobs)]  # bytes, files: one row per worker, summed by the stager
        self.finished = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.split: list[tuple[str, int, int]] = []  # big files' copies: path, inode, final mode

    # ---- planning (the stager's thread, before the workers start) ----

    def plan(self, files: list) -> None:
        """Queue the ranges of `files` (relative directory, name, size, mode), biggest file first."""
        for rel, name, size, mode in sorted(files, key=lambda f: -f[2]):
            self.work.extend(self._ranges(rel, name, size, mode))

    def _ranges(self, rel: str, name: str, size: int, mode: int) -> list:
        """Create the copy of a big file, allocate all of it (ENOSPC now, not half way), and cut it into up
        to `jobs` ranges of whole MiBs."""
        dfd = os.open(os.path.join(self.dst, rel), O_DIR)
        try:
            # Writable until its ranges are in (each range's worker opens it again), read-only after run().
            fd = self._dst_call(create_exclusive, _path(rel, name), name, dfd, 0o600)
            try:
                if size:  # fallocate refuses a length of 0 (EINVAL): an empty file is done once made
                    self._dst_call(os.posix_fallocate, _path(rel, name), fd, 0, size)
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        self.split.append((os.path.join(self.dst, rel, name), ino, read_only(mode)))
        if not size:
            return []
        parts = max(1, min(self.jobs, size // (SPLIT // 2)))
        step = (-(-size // parts) + (1 << 20) - 1) >> 20 << 20
        return [(rel, name, ino, off, min(size, off + step)) for off in range(0, size, step)]

    # ---- the workers ----

    def run(self, progress: Progress | None, guard: Guard | None, base: tuple[int, int] = (0, 0)) -> None:
        """Copy the queued ranges; `base`: bytes and files copied before, for the progress lines."""
        threads = [
            threading.Thread(target=self._worker, args=(k,), name=f"stune-copy-{k}", daemon=True)
            for k in range(min(self.jobs, len(self.work)))
        ]
        self.running = len(threads)
        try:
            for thread in threads:
                thread.start()
            while threads and not self.finished.wait(TICK_S):
                if guard:
                    guard.check()
                if progress:
                    progress.update(*self.totals(base))
        finally:
            self.stopped = True  # a no-op when all went well; on an error or a signal: the workers leave
            for thread in threads:
                thread.join()
        if self.error is not None:
            raise self.error
        for path, ino, mode in self.split:
            fd = self._reopen(path, ino, 0)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def totals(self, base: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        return base[0] + sum(row[0] for row in self.done), base[1] + sum(row[1] for row in self.done)

    def _worker(self, k: int) -> None:
        try:
            while not self.stopped:
                try:
                    item = self.work.popleft()
                except IndexError:
                    return
                self._range(k, *item)
        except BaseException as exc:  # handed to the stager's thread, which raises it
            with self.lock:
                self.error = self.error or exc
            self.stopped = True
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    self.finished.set()

    def _range(self, k: int, rel: str, name: str, ino: int, off: int, end: int) -> None:
        path = _path(rel, name)
        sfd = self._src_call(os.open, rel or ".", os.path.join(self.src, rel), O_DIR)
        try:
            src = self._src_call(os.open, path, name, O_FILE, dir_fd=sfd)
        finally:
            os.close(sfd)
        try:
            dst = self._reopen(os.path.join(self.dst, rel, name), ino, os.O_WRONLY)
            try:
                self._bytes(k, src, dst, off, end, path)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        if off == 0:
            self.done[k][1] += 1

    def _bytes(self, k: int, src: int, dst: int, off: int, end: int, path: str) -> None:
        """Copy src's bytes [off, end) to the same offsets of dst (a source cut short since the walk: up to
        its end)."""
        floor, pos, row = CFR, 0, self.done[k]  # pos: dst's file offset, which sendfile writes at
        while not self.stopped:
            count = min(CHUNK, end - off)
            if count <= 0:
                return
            method = max(self.method, floor)
            try:
                if method == CFR:
                    n = os.copy_file_range(src, dst, count, off, off)
                    if not n:  # some filesystems copy nothing (or the source was cut short): read/write
                        floor = RW
                        continue
                elif method == SENDFILE:
                    if pos != off:
                        pos = os.lseek(dst, off, os.SEEK_SET)
                    n = os.sendfile(dst, src, off, count)
                    pos += n
                else:
                    count = min(count, RW_CHUNK)
                    data = os.pread(src, count, off)
                    n, view = len(data), memoryview(data)
                    while view:
                        view = view[os.pwrite(dst, view, off + n - len(view)) :]
            except OSError as exc:
                if exc.errno in _FULL:
                    raise TierUnavailable(
                        "disk-full", f"{self.what}: the cache disk is full ({path}: {exc.strerror})"
                    ) from None
                self._regular(src, path)  # a source replaced by a FIFO or a directory since the walk
                if method == RW or exc.errno not in (_NO_CFR if method == CFR else _NO_SENDFILE):
                    raise self._failure(exc, path) from None
                with self.lock:  # this pair of filesystems cannot: every later file goes the next way
                    self.method = max(self.method, method + 1)
                continue
            if not n:
                return
            off += n
            row[0] += n

    def _reopen(self, path: str, ino: int, flags: int) -> int:
        """The big file _ranges() made, and nothing planted since: a regular file, one link, that inode."""
        try:
            fd = open_file(path, flags=flags)
        except (OSError, UnsafePathError):
            fd = None
        if fd is None or os.fstat(fd).st_ino != ino:
            if fd is not None:
                os.close(fd)
            raise TierUnavailable(
                "copy-failed",
                f"{self.what}: {os.path.basename(path)} was replaced in the "
                "staging directory during the copy",
            )
        return fd

    # ---- errors ----

    def _regular(self, fd: int, path: str) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError(f"{self.what}: {path} is no longer a regular file")

    def _src_call(self, fn, path: str, *args, **kwargs):
        """fn on the source side: a file gone, unreadable, or replaced by a symlink is the source's fault."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SourceError(f"{self.what}: {path} was replaced by a symlink during the copy") from None
            raise SourceError(f"{self.what}: cannot read {path}: {exc.strerror}") from None

    def _dst_call(self, fn, path: str, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            if exc.errno in _FULL:
                raise TierUnavailable(
                    "disk-full", f"{self.what}: the cache disk is full ({path}: {exc.strerror})"
                ) from None
            raise self._failure(exc, path) from None

    def _failure(self, exc: OSError, path: str) -> TierUnavailable:
        return TierUnavailable("copy-failed", f"{self.what} failed: {path}: {exc.strerror}")


def in_ranges(source_kind: str, plan: Plan | None) -> bool:
    """Whether the copy holds a file copied in preallocated ranges (a single file; a tree's files of SPLIT
    bytes or more). Such a file has its full size before its data reaches the disk, so after a crash the
    size-and-type manifest cannot tell it from a good copy: it is trusted in the boot that made it only."""
    if source_kind == "file":
        return True
    return source_kind == "dir" and plan is not None and bool(_big_files(plan.files))


def _big_files(files: list) -> list:
    """The files copy_tree copies in ranges by its threads (the rest go to `cp` in batches)."""
    return [f for f in files if f[2] >= SPLIT]


def copy_tree(
    src: str,
    tree: Plan | Walker,
    dst: str,
    *,
    jobs: int | None = None,
    progress: Progress | None = None,
    guard: Guard | None = None,
    claim: Claim | None = None,
) -> Plan:
    """Copy the tree `src` into the new, empty directory `dst`, and return its walk's Plan. `tree` is the
    Plan of a finished walk, or a Walker whose walk goes on while the copy starts: each directory is made
    here as the walk lists it, and its small files go to `cp` batches (batches.py) as soon as a worker is
    free. With a `claim`, no batch starts before its bytes are claimed (evict.Claim: where they do not fit
    without evicting, the copy waits for the walk's end, then the whole is admitted or refused). The files
    of SPLIT bytes or more are copied last, in ranges by this process's threads."""
    import tempfile  # a tree's copy only, as batches: a single file needs no process (subprocess: ~8 ms)

    from .batches import Batches

    jobs = default_jobs() if jobs is None else jobs
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"copy workers must be >= 1, not {jobs!r}")  # 0 or -1 would spin forever
    if isinstance(tree, Walker):
        walker, steps = tree, tree.steps()
    else:  # one step: the whole walk
        walker, steps = None, iter([([d[0] for d in tree.dirs], tree.files, tree.links)])
    big: list = []
    with tempfile.TemporaryFile() as errlog, Batches(src, dst, jobs, errlog, progress, guard) as batches:
        waiting = claim is not None and walker is None  # a finished walk is admitted whole, below
        for new_dirs, files, links in steps:
            for rel in new_dirs:
                os.mkdir(os.path.join(dst, rel), 0o700)
            big += _big_files(files)
            batches.add([f for f in files if f[2] < SPLIT], links)
            if walker is not None and not waiting and batches.wants_worker() and claim is not None:
                waiting = not claim.grow(walker.alloc)
            batches.pump(start=not waiting)
        plan = tree.plan() if isinstance(tree, Walker) else tree
        if claim is not None:
            claim.settle(plan.alloc)
        if progress:
            progress.sized(plan.bytes, plan.count)
        done = batches.finish()
    copier = _Copier(src, dst, jobs, f"copying {src}")
    umask = os.umask(0)  # the big files are made with exactly read_only(mode)
    try:
        copier.plan(big)
        copier.run(progress, guard, base=done)
    finally:
        os.umask(umask)
    # Directory modes and times last: the workers filled them meanwhile. Read-only, like the files
    # (rmtree_at opens them up again to evict the entry).
    for rel, mode, atime, mtime in reversed(plan.dirs):
        path = os.path.join(dst, rel)
        os.chmod(path, read_only(mode) | 0o500)
        os.utime(path, ns=(atime, mtime))
    if progress:
        progress.done(*copier.totals(done))
    return plan


def copy_file(
    source: Source,
    dst_dir: str,
    *,
    jobs: int | None = None,
    progress: Progress | None = None,
    guard: Guard | None = None,
) -> str:
    """Copy one regular file into the directory `dst_dir`, under its own name, keeping its mode (less the
    write bits) and times. Returns the copy's path."""
    jobs = default_jobs() if jobs is None else jobs
    folder, name = os.path.split(source.real)
    copier = _Copier(folder, dst_dir, jobs, f"copying {source.path}")
    umask = os.umask(0)
    try:
        copier.plan([("", name, source.st.st_size, source.st.st_mode)])
        if guard:  # a big file was allocated in full: past the reserve now, not after the copy
            guard.check()
        copier.run(progress, guard)
    finally:
        os.umask(umask)
    if guard:
        guard.check()
    path = os.path.join(dst_dir, name)
    os.utime(path, ns=(source.st.st_atime_ns, source.st.st_mtime_ns), follow_symlinks=False)
    if progress:
        progress.done(source.st.st_size)
    return path
