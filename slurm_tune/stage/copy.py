"""Copying a source into a staging directory, fast: the work runs in `cp` and `tar` processes, not in Python.

- A directory tree: one walk (fresh.walk), the directories made here, then the files and symlinks cut into
  chunks that several `cp -P --parents` processes copy at once. A Python copy loop, even threaded, is
  GIL-bound and measured 3x slower than one `cp -r`; separate processes scale with the disks.
  Symlinks are copied as symlinks (`-P`); sockets, FIFOs and devices are skipped.
- An archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .tar.zst): extracted locally by GNU tar, which
  reads it once, sequentially, from the shared filesystem. tar drops leading `/` and refuses `..` members.
- A single file: one `cp`, which uses copy_file_range(2) where it can.

Every copy reports progress (`Progress`) and watches the tier's free space and its byte allowance: when
either runs out it kills its workers and raises TierUnavailable.

A published copy is read-only (no write bit on any file or directory under data/): a job that writes into
$STUNE_STAGE_X gets EACCES instead of silently changing what every later job reads. The `cp` workers run
with umask 0222, so files are made without write bits at no extra cost; directories are set at the end.
"""
from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time

from .errors import SourceError, TierUnavailable
from .fresh import Plan, Source

CHUNK_BYTES = 64 << 20     # a worker's batch: at most this many bytes ...
CHUNK_FILES = 4000         # ... or this many names (~200 KiB of argv: well inside ARG_MAX)
TICK_S = 0.5   # progress and disk-space cadence; a worker's exit wakes the stager at once (pidfd)
POLL_S = 0.05  # exit polling where pidfds are missing (Linux < 5.3)


def default_jobs() -> int:
    """Copy processes: I/O bound, so more than the cores, within reason. STUNE_STAGE_JOBS overrides."""
    env = os.environ.get("STUNE_STAGE_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return min(int(env), 64)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(4, min(16, 2 * cpus))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """Progress lines for a long copy: the first after `delay` seconds, then one every `every` seconds, and
    a last one when done. Short copies print nothing."""

    def __init__(self, stream, label: str, total_bytes: int, total_files: int | None = None,
                 delay: float = 2.0, every: float = 10.0):
        self.stream, self.label = stream, label
        self.total_bytes, self.total_files = total_bytes, total_files
        self.start = time.monotonic()
        self.next = self.start + delay
        self.every = every
        self.printed = False

    def update(self, done_bytes: int, done_files: int | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if self.stream is None or (now < self.next and not force):
            return
        self.next = now + self.every
        elapsed = max(now - self.start, 1e-6)
        rate = done_bytes / elapsed
        parts = [f"{human(done_bytes)}"]
        if self.total_bytes:
            parts[0] += f" / {human(self.total_bytes)} ({100 * done_bytes / self.total_bytes:.0f}%)"
        if self.total_files:
            parts.append(f"{done_files or 0:,} / {self.total_files:,} files")
        parts.append(f"{human(rate)}/s")
        if self.total_bytes and rate > 0 and done_bytes < self.total_bytes:
            parts.append(f"ETA {max(0, (self.total_bytes - done_bytes) / rate):.0f}s")
        self.emit(f"{self.label}: {', '.join(parts)}")
        self.printed = True

    def emit(self, line: str) -> None:
        from ..streams import say

        if self.stream is not None and not say(self.stream, f"stune-stage: {line}"):
            self.stream = None  # a closed job log must not fail the copy

    def done(self, done_bytes: int, done_files: int | None = None) -> None:
        if self.printed:
            self.update(done_bytes, done_files, force=True)


class Guard:
    """Stops a copy before it overfills the tier: the filesystem keeps `reserve` bytes free (the rule in
    tier.reserve_bytes, which admission applies too), and the copy writes at most `allowance` bytes
    (statvfs deltas: cheap, and conservative when others write too)."""

    def __init__(self, path: str, allowance: int | None, reserve: int = 0):
        self.path, self.allowance, self.reserve = path, allowance, reserve
        self.free_at_start = self._free()

    def _free(self) -> int:
        vfs = os.statvfs(self.path)
        return vfs.f_bavail * vfs.f_frsize

    def check(self) -> None:
        free = self._free()
        if free < self.reserve:
            raise TierUnavailable("disk-full", f"the cache disk is full ({human(free)} left, {human(self.reserve)} "
                                               "is kept in reserve)")
        if self.allowance is not None and self.free_at_start - free > self.allowance:
            raise TierUnavailable("over-quota", f"the copy outgrew its quota allowance of {human(self.allowance)}")


def read_only(mode: int) -> int:
    """A published directory's or file's mode: the owner can still read and enter it, nobody can write."""
    return (mode | 0o400) & ~0o222 & 0o7777


def _chunks(plan: Plan, jobs: int) -> list[tuple[list[str], int]]:
    """Cut files and links into batches, in walk order: each batch stays within a few directories, so the
    workers do not all contend for the same directory locks (sorting by size, which scatters every
    directory over every worker, measured 2-3x slower). Files bigger than a batch go first, alone, so the
    longest copies start early; no batch is much bigger than total/jobs, so the last worker is not alone."""
    target = max(1 << 20, min(CHUNK_BYTES, plan.bytes // (jobs * 2) + 1))
    big = [([rel], size) for rel, size in plan.files if size >= target]
    chunks, cur, cur_bytes = [], [], 0
    for rel, size in [f for f in plan.files if f[1] < target] + [(link, 0) for link in plan.links]:
        if cur and (cur_bytes + size > target or len(cur) >= CHUNK_FILES):
            chunks.append((cur, cur_bytes))
            cur, cur_bytes = [], 0
        cur.append(rel)
        cur_bytes += size
    if cur:
        chunks.append((cur, cur_bytes))
    return sorted(big, key=lambda c: -c[1]) + chunks


def _kill(procs) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    for proc in procs:
        proc.wait()


def _failure(errlog, what: str) -> TierUnavailable | SourceError:
    errlog.seek(0)
    text = errlog.read().decode("utf-8", "replace").strip()
    useful = [line for line in text.splitlines()
              if "Exiting with failure status" not in line and "Removing leading" not in line]
    last = useful[-1] if useful else (text.splitlines()[-1] if text else "no message")
    if "No space left" in text or "Disk quota exceeded" in text:
        return TierUnavailable("disk-full", f"{what}: the cache disk is full ({last})")
    if "Permission denied" in text or "No such file" in text:
        return SourceError(f"{what}: {last}")
    return TierUnavailable("copy-failed", f"{what} failed: {last}")


_LIBC = None


def _libc():
    """libc through ctypes, loaded once in the stager: a worker's pre-exec hook must not import anything
    (importing ctypes in each forked child cost ~10 ms per worker, serialised in the stager)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _spawn(argv: list[str], cwd: str | None, errlog, stdin=None, umask: int | None = None) -> subprocess.Popen:
    libc, parent = _libc(), os.getpid()

    def die_with_parent():
        """PR_SET_PDEATHSIG: a stager killed with -9 must not leave `cp` processes writing into a directory
        the next stager is about to delete."""
        if umask is not None:
            os.umask(umask)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the stager died before prctl took effect
            os._exit(137)

    # start_new_session: killing a worker's process group takes its children (tar's decompressor) too.
    return subprocess.Popen(argv, cwd=cwd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=errlog, start_new_session=True, close_fds=True,
                            preexec_fn=die_with_parent)


def _wait_any(procs, timeout: float) -> list:
    """The workers among `procs` that have exited, waiting up to `timeout` s for the first exit. Sleeping a
    fixed tick between polls left every worker slot idle for half a tick on average: with many small
    batches that was a third of a 20k-file copy."""
    done = [p for p in procs if p.poll() is not None]
    if done or not procs:
        return done
    fds: list[int] = []
    try:
        for proc in procs:
            fds.append(os.pidfd_open(proc.pid))
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    except (AttributeError, OSError):  # no pidfd_open here: poll
        time.sleep(min(POLL_S, timeout))
    finally:
        for fd in fds:
            os.close(fd)
    return [p for p in procs if p.poll() is not None]


def copy_tree(src: str, plan: Plan, dst: str, *, jobs: int | None = None, progress: Progress | None = None,
              guard: Guard | None = None) -> None:
    """Copy the walked tree `src` into the new directory `dst` (which must exist, empty)."""
    jobs = default_jobs() if jobs is None else jobs
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"copy processes must be >= 1, not {jobs!r}")  # 0 or -1 would spin forever
    for rel, _mode, _atime, _mtime in plan.dirs:
        os.mkdir(os.path.join(dst, rel), 0o700)
    chunks = _chunks(plan, jobs)
    done_bytes = done_files = 0
    running: dict[subprocess.Popen, tuple[int, int]] = {}
    with tempfile.TemporaryFile() as errlog:
        try:
            while chunks or running:
                while chunks and len(running) < jobs:
                    names, nbytes = chunks.pop(0)
                    # No --preserve=mode: cp then gives each file the source's mode less the umask, and the
                    # umask 0222 makes the copy read-only without a chmod per file.
                    argv = ["cp", "-P", "--parents", "-t", dst, "--", *names]
                    running[_spawn(argv, src, errlog, umask=0o222)] = (nbytes, len(names))
                for proc in _wait_any(list(running), TICK_S):
                    nbytes, nfiles = running.pop(proc)
                    if proc.returncode != 0:
                        raise _failure(errlog, f"copying {src}")
                    done_bytes += nbytes
                    done_files += nfiles
                if guard:
                    guard.check()
                if progress:
                    progress.update(done_bytes, done_files)
        except BaseException:
            _kill(list(running))
            raise
    # Directory modes and times last: cp filled them meanwhile. Read-only, like the files (rmtree_at opens
    # them up again to evict the entry).
    for rel, mode, atime, mtime in reversed(plan.dirs):
        path = os.path.join(dst, rel)
        os.chmod(path, read_only(mode) | 0o500)
        os.utime(path, ns=(atime, mtime))
    if progress:
        progress.done(done_bytes, done_files)


def copy_file(source: Source, dst: str, *, progress: Progress | None = None, guard: Guard | None = None) -> None:
    """Copy one regular file to the path `dst`."""
    with tempfile.TemporaryFile() as errlog:
        proc = _spawn(["cp", "--preserve=mode,timestamps", "--", source.real, dst], None, errlog)
        try:
            while not _wait_any([proc], TICK_S):
                if guard:
                    guard.check()
                if progress:
                    try:
                        progress.update(os.lstat(dst).st_size, None)
                    except FileNotFoundError:
                        pass
        except BaseException:
            _kill([proc])
            raise
        if proc.returncode != 0:
            raise _failure(errlog, f"copying {source.path}")
    if guard:
        guard.check()
    os.chmod(dst, read_only(stat.S_IMODE(os.lstat(dst).st_mode)))
    if progress:
        progress.done(source.st.st_size)


# First bytes of compressed streams -> tar's option to read them (GNU tar picks the tool itself).
_MAGIC = ((b"\x1f\x8b", "--gzip"), (b"BZh", "--bzip2"), (b"\xfd7zXZ\x00", "--xz"), (b"\x28\xb5\x2f\xfd", "--zstd"))


def _decompress_option(fd: int) -> list[str]:
    head = os.pread(fd, 8, 0)
    for magic, option in _MAGIC:
        if head.startswith(magic):
            if option == "--gzip" and _which("pigz"):
                return ["--use-compress-program=pigz"]  # parallel gzip when installed
            return [option]
    return []


def _which(name: str) -> bool:
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "").split(":") if d)


def extract(source: Source, dst: str, *, progress: Progress | None = None, guard: Guard | None = None) -> None:
    """Extract the archive into the existing directory `dst`. Progress is how far tar has read the archive:
    it reads from a descriptor this process shares with it."""
    try:
        fd = os.open(source.real, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"cannot open {source.path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as archive, tempfile.TemporaryFile() as errlog:
        argv = ["tar", "-x", "-f", "-", "-C", dst, "--no-same-owner", "--no-same-permissions",
                "--delay-directory-restore", "--warning=no-timestamp", *_decompress_option(fd)]
        proc = _spawn(argv, None, errlog, stdin=archive)
        try:
            while not _wait_any([proc], TICK_S):
                if guard:
                    guard.check()
                if progress:
                    progress.update(os.lseek(fd, 0, os.SEEK_CUR), None)
        except BaseException:
            _kill([proc])
            raise
        if proc.returncode != 0:
            raise _failure(errlog, f"extracting {source.path}")
    if guard:  # an extraction that finished within one tick was never checked
        guard.check()
    # The extracted tree is made read-only, files first, then directories deepest first.
    dirs = []
    for dirpath, dirnames, files in os.walk(dst):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o222:
                os.chmod(path, read_only(st.st_mode))
        dirs += [os.path.join(dirpath, name) for name in dirnames]
    for path in reversed(dirs):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, read_only(st.st_mode) | 0o500)
    if progress:
        progress.done(source.st.st_size)


if __name__ == "__main__":  # pragma: no cover - manual check: python -m slurm_tune.stage.copy SRC DST
    from .fresh import inspect, walk

    s = inspect(sys.argv[1])
    os.mkdir(sys.argv[2])
    copy_tree(s.real, walk(s.real), sys.argv[2], progress=Progress(sys.stderr, "copy", 0))
