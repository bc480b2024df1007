"""Root's trust rule for what it loads (StrictModes): the file and every directory above it are writable by
root (or the loading user) alone. safeio.require_trusted raises on it; this module only judges, imports
nothing from stune and has no `from __future__` import, so the code cache (codecache.py) can judge its own
file before any other stune module is imported (hot path: see docs/speed.md).

Annotations are strings here: the module runs on every supported Python without the future import.
"""
import os
import stat


def untrusted_reason(path: str, *, uid: "int | None" = None) -> "str | None":
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
            return (f"lies in {parent}, which is writable by {_writers(pst.st_mode)} "
                    f"(mode {stat.S_IMODE(pst.st_mode):04o})")
        if parent == "/":
            return None
        parent = os.path.dirname(parent)


def untrusted_stat(st: os.stat_result, uid: int = 0) -> "str | None":
    """Why a file with this stat may not be trusted by `uid` (its owner or its mode), or None. For callers
    that have stat'ed a file already (e.g. each profile, for the cache fingerprint): no second stat."""
    if st.st_uid not in (0, uid):
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"is writable by {_writers(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def nearest_existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists: where a file root is about to create is judged."""
    checked = path
    while not os.path.lexists(checked):
        parent = os.path.dirname(os.path.abspath(checked))
        if parent == checked:
            break
        checked = parent
    return checked


def _writers(mode: int) -> str:
    return " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if mode & bit)
