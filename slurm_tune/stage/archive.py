"""Extracting an archive into a staging directory (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .tar.zst): GNU tar
on the node reads it once, sequentially, from the shared filesystem. tar drops leading `/` and refuses `..`
members. The extracted tree is made read-only like every published copy (copy.read_only).

The tar process dies with the stager (PR_SET_PDEATHSIG) and runs in its own process group, so killing it takes
its decompressor too. Its own module: only an archive needs subprocess, tempfile and ctypes.
"""
from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import tempfile
import time

from .copy import TICK_S, Guard, Progress, read_only
from .errors import SourceError, TierUnavailable
from .fresh import Source

POLL_S = 0.05  # exit polling where pidfds are missing (Linux < 5.3)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
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


def _spawn(argv: list[str], errlog, stdin) -> subprocess.Popen:
    import ctypes

    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()

    def die_with_parent():
        """PR_SET_PDEATHSIG: a stager killed with -9 must not leave a tar process writing into a directory
        the next stager is about to delete. (libc is loaded before the fork: the hook imports nothing.)"""
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the stager died before prctl took effect
            os._exit(137)

    return subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=errlog, start_new_session=True,
                            close_fds=True, preexec_fn=die_with_parent)


def _exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the worker exited, waiting up to `timeout` s for it (on a pidfd: its exit wakes us at once)."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd_open here: poll
        time.sleep(min(POLL_S, timeout))
        return proc.poll() is not None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    finally:
        os.close(fd)
    return proc.poll() is not None


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
        proc = _spawn(argv, errlog, archive)
        try:
            while not _exited(proc, TICK_S):
                if guard:
                    guard.check()
                if progress:
                    progress.update(os.lseek(fd, 0, os.SEEK_CUR), None)
        except BaseException:
            _kill(proc)
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
