"""Which files stune may trust: the one home of the owner, mode and link rules that safeio enforces.

* A file opened inside a directory others can write (the cache tier, a spool) is judged on its descriptor:
  its type, link count and owner (`opened_problem`).
* What root loads (the env file, profiles, the profile cache, node state) must be writable by
  root alone, with every directory above it, like sshd's StrictModes (`untrusted_reason`, `load_problem`).

Each function returns the problem as a phrase, or None; safeio turns a problem into `UnsafePathError`.
Opening a file to read it by these rules lives here too (`open_regular`, `read_bounded`): a hot path (the
profile cache's hit, sbatch's option table) reads a cache without importing the rest of safeio.
"""

import os
import stat

S_IFREG, S_IFDIR = stat.S_IFREG, stat.S_IFDIR
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO never hangs us
ROOT_REFUSES = "root does not load it (fix the owner/mode)"


def open_regular(name: str, flags: int = O_READ, mode: int = 0, dir_fd=None, owner=None, single_link=True):
    """os.open with `flags` (which hold O_NOFOLLOW and O_NONBLOCK), judged on the descriptor, then made
    blocking: (fd, its stat), or (None, the problem) for what must not be used: not a regular file, a linked
    file, another owner. OSError for a missing name, ELOOP for a symbolic link, and any other failure."""
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        problem = opened_problem(st, S_IFREG, owner, single_link)
        if problem:
            os.close(fd)
            return None, problem
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(fd: int, limit: int):
    """At most `limit` bytes from fd; None when the file holds more (a size nobody should be trusted for)."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        data = os.read(fd, min(65536, limit + 1 - total))
        if not data:
            return b"".join(chunks)
        chunks.append(data)
        total += len(data)
    return None


def opened_problem(st: os.stat_result, want: int, owner=None, single_link: bool = True):
    """What is wrong with an opened file (its fstat) that should be of type `want` (S_IFREG or S_IFDIR),
    have one link (regular files, when `single_link`) and belong to `owner` (when given), or None."""
    if stat.S_IFMT(st.st_mode) != want:
        return "not a directory" if want == S_IFDIR else "not a regular file"
    if single_link and want == S_IFREG and st.st_nlink != 1:
        return f"has {st.st_nlink} hard links; refusing a linked file"
    if owner is not None and st.st_uid != owner:
        return f"owned by uid {st.st_uid}, expected uid {owner}"
    return None


def untrusted_stat(st: os.stat_result, uid: int = 0):
    """Why a file with this stat may not be trusted by `uid` (its owner or its mode), or None. For callers
    that have stat'ed a file already (e.g. each profile, for the cache fingerprint): no second stat."""
    if st.st_uid not in (0, uid):
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"is writable by {_writers(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def untrusted_reason(path: str, *, uid=None):
    """Why `path` (file or directory) may not be trusted by `uid` (default: this process's euid), or None.

    Trusted: the path itself and every directory above it (symlinks resolved) is owned by root or `uid`
    and is not writable by group or others. A world-writable directory with the sticky bit (/tmp) is
    allowed as an ancestor, since nobody else can rename or remove what root keeps inside it."""
    uid = os.geteuid() if uid is None else uid
    owners = {0, uid}
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        return f"cannot be checked: {exc.strerror}"
    problem = untrusted_stat(st, uid)
    if problem:
        return problem
    parent = os.path.dirname(real)
    while True:
        try:
            pst = os.stat(parent)
        except OSError as exc:
            return f"cannot be checked: {parent}: {exc.strerror}"
        if pst.st_uid not in owners:
            return f"lies in {parent}, owned by uid {pst.st_uid}, not root"
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return (
                f"lies in {parent}, which is writable by {_writers(pst.st_mode)} "
                f"(mode {stat.S_IMODE(pst.st_mode):04o})"
            )
        if parent == "/":
            return None
        parent = os.path.dirname(parent)


def load_problem(path: str, *, missing_ok: bool = False):
    """(where, problem) when root may not load `path` because someone other than root could have written it,
    else None; None for every other user (they load only what they could write themselves). `missing_ok`:
    a path that does not exist yet is judged by its nearest existing ancestor, where root would create it."""
    if os.geteuid() != 0:
        return None
    checked = path
    if missing_ok:
        while not os.path.lexists(checked):
            parent = os.path.dirname(os.path.abspath(checked))
            if parent == checked:
                break
            checked = parent
    problem = untrusted_reason(checked, uid=0)
    if not problem:
        return None
    where = path if checked == path else f"{path}: its parent {checked}"
    return where, f"{problem}; {ROOT_REFUSES}"


def stat_load_problem(path: str, st: os.stat_result):
    """load_problem for one file already stat'ed, its directory judged separately: (path, problem) when
    root may not load it, else None (and None for every other user)."""
    if os.geteuid() != 0:
        return None
    problem = untrusted_stat(st, 0)
    return (path, f"{problem}; {ROOT_REFUSES}") if problem else None


def require_trusted(path: str, *, missing_ok: bool = False) -> None:
    """Refuse (UnsafePathError) to let root load `path` when someone other than root could have written
    it (load_problem). A no-op for other users: they can only load what they could write themselves."""
    refused = load_problem(path, missing_ok=missing_ok)
    if refused:
        _refuse(refused)


def trusted_stat_or_raise(path: str, st: os.stat_result) -> None:
    """require_trusted for one file already stat'ed, its directory checked separately (root only)."""
    refused = stat_load_problem(path, st)
    if refused:
        _refuse(refused)


def _refuse(refused: tuple):
    from .errors import UnsafePathError

    raise UnsafePathError(*refused)


def _writers(mode: int) -> str:
    return " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if mode & bit)
