"""Safe file access for code that runs as root: how stune opens, creates and loads files by the rules of
trust.py (which file may be trusted), raising `UnsafePathError` with the problem it names.

Two situations, two sets of rules:

* Root working INSIDE a directory users can write (the cache tier, the usage spool): never follow a
  symlink (O_NOFOLLOW, descriptor-relative walks), never block on a planted FIFO (O_NONBLOCK), check the
  type, owner and link count of what was opened (fstat after open, not lstat before), create only with
  O_EXCL, and read no more than a bound. Root never writes, truncates or chowns a file it did not just
  create itself.
* Root LOADING configuration or state (the env file, profiles, the profile cache, node state): like sshd's
  StrictModes, the file and every directory above it must be writable by root alone. A path someone else
  could write is refused with one line naming it (`UnsafePathError`). Run as another user, stune loads
  what that user could have written anyway, so the check applies to euid 0 only.

Hot path: see docs/speed.md.
"""

from __future__ import annotations

import os
import stat

from .errors import FileWriteError, StuneError, UnsafePathError  # safeio's callers catch these from here too

# safeio's readers and loaders: the rules' own functions, one home in trust.py; require_trusted is
# re-exported (callers take it, and UnsafePathError, from safeio)
from .trust import O_READ, open_regular, opened_problem, read_bounded
from .trust import require_trusted as require_trusted

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = O_READ
O_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _where(name: str, dir_fd: int | None) -> str:
    if dir_fd is None or os.path.isabs(name):
        return name
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
    except OSError:
        return name


def _check_opened(
    fd: int, name: str, dir_fd: int | None, want: int, owner: int | None, single_link: bool
) -> os.stat_result:
    st = os.fstat(fd)
    problem = opened_problem(st, want, owner, single_link)
    if problem:
        raise UnsafePathError(_where(name, dir_fd), problem)
    return st


def open_file(
    name: str,
    dir_fd: int | None = None,
    *,
    owner: int | None = None,
    single_link: bool = True,
    flags: int = 0,
) -> int:
    """Open a regular file for reading without following a symlink or blocking on a FIFO, then check
    (on the descriptor) that it is a regular file, has one link and, when given, belongs to `owner`.
    OSError for a missing name; UnsafePathError for anything planted."""
    return _open_regular(name, O_FILE | flags, 0, dir_fd, owner, single_link)


def _open_regular(
    name: str, flags: int, mode: int, dir_fd: int | None, owner: int | None, single_link: bool
) -> int:
    """trust.open_regular, a problem (a symbolic link included) raised as UnsafePathError."""
    try:
        fd, st_or_problem = open_regular(name, flags, mode, dir_fd, owner, single_link)
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:  # the last component is a symlink
            raise UnsafePathError(_where(name, dir_fd), "is a symbolic link") from None
        raise
    if fd is None:
        raise UnsafePathError(_where(name, dir_fd), st_or_problem)
    return fd


def open_dir(
    name: str, dir_fd: int | None = None, *, owner: int | None = None, follow_symlinks: bool = False
) -> int:
    """Open a directory without following a symlink at its last component; check its owner when given.
    follow_symlinks=True only for a root an admin configured (a mount point's alias may be a symlink)."""
    try:
        fd = os.open(name, O_DIR & ~os.O_NOFOLLOW if follow_symlinks else O_DIR, dir_fd=dir_fd)
    except OSError as exc:
        import errno

        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise UnsafePathError(
                _where(name, dir_fd), "is not a directory (or is a symbolic link)"
            ) from None
        raise
    try:
        _check_opened(fd, name, dir_fd, stat.S_IFDIR, owner, False)
    except BaseException:
        os.close(fd)
        raise
    return fd


O_APPEND_FILE = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_append(
    name: str,
    dir_fd: int | None = None,
    *,
    create_mode: int | None = 0o644,
    owner: int | None = None,
    single_link: bool = True,
) -> int:
    """A descriptor appending to the regular file `name` (a log, a results file, a job's stderr file):
    never through a symlink, never blocking on a FIFO (one with no reader is ENXIO), never a device or a
    hard link to another file; checked on the descriptor like open_file. Created with `create_mode` when
    missing; `create_mode=None`: it must exist (FileNotFoundError). UnsafePathError for anything planted."""
    flags = O_APPEND_FILE | (os.O_CREAT if create_mode is not None else 0)
    return _open_regular(name, flags, create_mode or 0, dir_fd, owner, single_link)


def create_exclusive(
    name: str, dir_fd: int | None = None, mode: int = 0o600, flags: int = os.O_WRONLY
) -> int:
    """Create a new file that nobody else can have prepared: O_CREAT|O_EXCL|O_NOFOLLOW. FileExistsError
    when the name is taken (by anything, a symlink included)."""
    return os.open(name, O_CREATE | flags, mode, dir_fd=dir_fd)


def write_atomic(
    path: str,
    data: bytes | str,
    *,
    mode: int = 0o644,
    dir_fd: int | None = None,
    sync: bool = False,
    owner: int | None = None,
) -> None:
    """Write `data` to a fresh, exclusively created temporary beside `path` and rename it over `path`:
    readers see the old file or the new one, and a name planted in advance is never written through.
    With `owner` (root writing on a user's behalf), the temporary root just created is handed to that
    uid before the rename: root never chowns a file it did not create itself.
    Any failure (a full disk, a quota) leaves the old file as it was, removes the temporary and raises
    FileWriteError (an OSError too) naming `path`: one line, never a bare "No space left on device"."""
    if isinstance(data, str):
        data = data.encode()
    head, tail = os.path.split(path)
    for _attempt in range(100):
        tmp = os.path.join(head, f".{tail}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = create_exclusive(tmp, dir_fd, mode)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise FileWriteError(_where(path, dir_fd), exc) from None
    else:  # pragma: no cover - 100 collisions of 32 random bits
        raise FileExistsError(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if os.fstat(fd).st_mode & 0o7777 != mode:
                os.fchmod(fd, mode)  # the umask narrowed it
            if owner is not None and owner != os.geteuid():
                os.fchown(fd, owner, -1)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise FileWriteError(_where(path, dir_fd), exc) from None
        raise


def append_whole(fd: int, data: bytes, where: str) -> None:
    """Append `data` (whole records, each ending in a newline) to the O_APPEND file open as `fd`: all of it or
    none of it. Under an flock on the file, so appenders queue (one record never lands inside another, even
    in pieces) and a short write (a full disk) is cut back off: the file ends where it ended before, and
    FileWriteError names `where`. A last line torn by an earlier crash is ended first (when `fd` is also open
    for reading), so ours stays whole."""
    lock_fd(fd)
    size = os.fstat(fd).st_size
    try:
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
    except OSError:  # opened write-only: the tail cannot be looked at
        pass
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]  # a short write on a full disk: the next one says ENOSPC
    except OSError as exc:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise FileWriteError(where, exc) from None


def read_small(
    name: str,
    dir_fd: int | None = None,
    limit: int = 65536,
    *,
    owner: int | None = None,
    single_link: bool = False,
) -> bytes | None:
    """A small regular file's bytes, or None when it is missing, not a regular file (symlink, FIFO,
    directory...), not `owner`'s, linked elsewhere (with single_link) or longer than `limit`: a reader
    that only wants trustworthy small records, and never blocks."""
    try:
        fd = open_file(name, dir_fd, owner=owner, single_link=single_link)
    except (OSError, UnsafePathError):
        return None
    try:
        return read_bounded(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_head_tail(fd: int, head: int, tail: int, join=None) -> bytes:
    """At most head + tail bytes of an opened regular file: all of it when it is no longer, else its first
    `head` bytes and its last `tail`, joined by `join(head, tail)` (default: a newline between; a line may be
    cut at either side). For logs whose beginning and end matter and whose middle may be huge: the cost is
    bounded whatever the file's size."""
    size = os.fstat(fd).st_size
    if size <= head + tail:
        data = read_bounded(fd, head + tail)
        return data if data is not None else os.pread(fd, head + tail, 0)  # grew while read: its start
    first, last = os.pread(fd, head, 0), os.pread(fd, tail, size - tail)
    return join(first, last) if join is not None else first + b"\n" + last


def lstat_at(name: str, dir_fd: int | None = None) -> os.stat_result | None:
    """lstat relative to a directory descriptor; None when the name does not exist."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_or_create(
    name: str, dir_fd: int | None = None, *, owner: int | None = None, mode: int = 0o600
) -> int:
    """A descriptor (read-only) of the regular file `name`, created exclusively when missing. An existing
    file must pass open_file's checks (regular, one link, `owner`'s): a hard link, FIFO or symlink planted
    in its place raises UnsafePathError, and is never opened for writing, truncated or chowned. A file this
    call creates as root on a user's behalf is given to `owner` through the new descriptor."""
    for _attempt in range(100):
        try:
            return open_file(name, dir_fd, owner=owner)
        except FileNotFoundError:
            pass
        try:
            fd = create_exclusive(name, dir_fd, mode, flags=os.O_RDONLY)
        except FileExistsError:  # created (or planted) between the two calls: check what is there
            continue
        try:
            if owner is not None and owner != os.geteuid():
                os.fchown(fd, owner, -1)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise UnsafePathError(_where(name, dir_fd), "keeps appearing and disappearing")  # pragma: no cover


def rmtree_at(name: str, dir_fd: int) -> None:
    """Remove `name` under dir_fd without following symlinks (shutil's descriptor-based walk). Directories
    left read-only (published cache entries) are opened up first, through O_NOFOLLOW descriptors, so the
    removal does not stop half way on EACCES."""
    import shutil

    st = lstat_at(name, dir_fd)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    _open_up_dirs(name, dir_fd)
    shutil.rmtree(name, dir_fd=dir_fd)


def _open_up_dirs(name: str, dir_fd: int) -> None:
    try:
        fd = os.open(name, O_DIR, dir_fd=dir_fd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o700 != 0o700:
            os.chmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
        with os.scandir(fd) as it:
            subdirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for sub in subdirs:
            _open_up_dirs(sub, fd)
    finally:
        os.close(fd)


class LockBusy(StuneError):
    """A lock stune does not wait for is held by another process (a second accountant, sweep, ...)."""

    def __init__(self, path: str, holder: str):
        self.path = str(path)
        super().__init__(f"another {holder} is running (lock {path})")


def lock_fd(fd: int, *, blocking: bool = True) -> bool:
    """flock(LOCK_EX) on an open descriptor: the one place stune takes a lock. False when `blocking` is off
    and another process holds it. Closing the descriptor releases it; so does the holder's death, so a
    killed process never wedges a lock."""
    import fcntl  # hot path: see docs/speed.md

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


class LockFile:
    """`with LockFile(path, holder="sweep of gpu"):` an exclusive flock on a lock file of root's own
    directory (state dir, ledger, sweep store), created 0644 with its directory when missing, never
    through a symlink. `blocking=False` raises LockBusy instead of waiting. `.fd` is the open descriptor
    while held."""

    def __init__(
        self, path: str, *, blocking: bool = True, holder: str = "stune process", dir_mode: int = 0o755
    ):
        self.path, self.blocking, self.holder, self.dir_mode = str(path), blocking, holder, dir_mode
        self.fd = -1

    def __enter__(self) -> LockFile:
        os.makedirs(os.path.dirname(self.path) or ".", mode=self.dir_mode, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            if not lock_fd(fd, blocking=self.blocking):
                raise LockBusy(self.path, self.holder)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
