"""The tier's file operations relative to a directory descriptor, on top of slurm_tune.safeio's rules.

Root (the epilog, `gc`, `init`) works in the tier only this way: directories opened with O_NOFOLLOW|O_DIRECTORY
relative to their parent's descriptor, files with O_NOFOLLOW|O_NONBLOCK and checked (type, owner, link count)
on the descriptor, new files made with O_EXCL. Root never writes, truncates or chowns a file it did not just
create, and trusts no size a user wrote without checking it on disk (allocated_bytes).
"""

from __future__ import annotations

import errno
import os
import stat

from .. import safeio
from ..safeio import UnsafePathError, lstat_at


def open_dir(
    name: str, dir_fd: int | None = None, owner: int | None = None, *, follow_symlinks: bool = False
) -> int:
    """safeio.open_dir, raising OSError like os.open does (callers here treat a planted symlink or file where
    a directory belongs as "not usable", the same as missing). follow_symlinks: the tier root only."""
    try:
        return safeio.open_dir(name, dir_fd, owner=owner, follow_symlinks=follow_symlinks)
    except UnsafePathError as exc:
        raise NotADirectoryError(errno.ENOTDIR, exc.problem, exc.path) from None


def read_text(name: str, dir_fd: int, limit: int = 65536, owner: int | None = None) -> str | None:
    """safeio.read_small, decoded: None when missing, not a regular file (symlink, FIFO...), not `owner`'s,
    or longer than `limit`."""
    data = safeio.read_small(name, dir_fd, limit, owner=owner)
    return None if data is None else data.decode("utf-8", "replace")


def allocated_bytes(name: str, dir_fd: int) -> int:
    """Bytes a file or tree under dir_fd really takes on disk (st_blocks), walked through descriptors
    without following a symlink: how root checks a size a user's ledger row claims."""
    st = lstat_at(name, dir_fd)
    if st is None:
        return 0
    total = st.st_blocks * 512
    if not stat.S_ISDIR(st.st_mode):
        return total
    for _root, dirs, files, fd in os.fwalk(name, dir_fd=dir_fd, follow_symlinks=False):
        for child in dirs + files:
            cst = lstat_at(child, fd)
            if cst is not None:
                total += cst.st_blocks * 512
    return total


def unsafe_shared_dir(st: os.stat_result) -> str | None:
    """A directory others may write into must be sticky, or they could rename or delete what is not theirs."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, neither root nor this user"
    return None
