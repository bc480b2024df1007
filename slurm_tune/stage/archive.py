"""Extracting an archive into a staging directory (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .tar.zst): GNU tar
on the node reads it once, sequentially, from the shared filesystem. tar drops leading `/` and refuses `..`
members. The extracted tree is made read-only like every published copy (copy.read_only).

The tar process dies with the stager (PR_SET_PDEATHSIG) and runs in its own process group, so killing it takes
its decompressor too (workers.py).
"""

from __future__ import annotations

import os
import stat
import tempfile

from .copy import read_only
from .errors import SourceError
from .fresh import Source
from .watch import TICK_S, Guard, Progress
from .workers import failure, kill, spawn, wait_any

# First bytes of compressed streams -> tar's option to read them (GNU tar picks the tool itself).
_MAGIC = (
    (b"\x1f\x8b", "--gzip"),
    (b"BZh", "--bzip2"),
    (b"\xfd7zXZ\x00", "--xz"),
    (b"\x28\xb5\x2f\xfd", "--zstd"),
)


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


def extract(
    source: Source, dst: str, *, progress: Progress | None = None, guard: Guard | None = None
) -> None:
    """Extract the archive into the existing directory `dst`. Progress is how far tar has read the archive:
    it reads from a descriptor this process shares with it."""
    try:
        fd = os.open(source.real, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SourceError(f"cannot open {source.path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as archive, tempfile.TemporaryFile() as errlog:
        argv = [
            "tar",
            "-x",
            "-f",
            "-",
            "-C",
            dst,
            "--no-same-owner",
            "--no-same-permissions",
            "--delay-directory-restore",
            "--warning=no-timestamp",
            *_decompress_option(fd),
        ]
        proc = spawn(argv, None, errlog, stdin=archive)
        try:
            while not wait_any([proc], TICK_S):
                if guard:
                    guard.check()
                if progress:
                    progress.update(os.lseek(fd, 0, os.SEEK_CUR), None)
        except BaseException:
            kill([proc])
            raise
        if proc.returncode != 0:
            raise failure(errlog, f"extracting {source.path}")
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
