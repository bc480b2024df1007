"""One node's cache tier: layout, per-user namespaces, locks, holds, the usage ledger and eviction.

Layout under the tier root (see docs/stage.md):

    ROOT/                     root-owned, mode 1777 (sticky, like /tmp): `stune-stage init` makes it
    ROOT/.ledger/             root-owned, 1777: one file per entry, "<uid>.<entry>", owned by the entry's
                              user; content "<bytes> ready|pending"; its mtime is the entry's last use
    ROOT/<user>/              the user's namespace, mode 0700, owned by the user
        entries/<key>.<gen>/  a published entry: `stamp` (what was copied, and from which source state) and
                              `data/` (the copy); <key> identifies the source path, <gen> the copy
        tmp/                  copies in progress and entries being deleted (same filesystem: rename)
        locks/<key>           flock(2) files, one per source; the kernel drops a dead stager's lock
        holds/<jobid>/<entry> a running job uses <entry>: never evicted while the file exists

Nothing here follows a symlink found inside the tier: directories are opened with O_NOFOLLOW|O_DIRECTORY
relative to their parent's descriptor, files with O_NOFOLLOW, and every name is checked with lstat. Root
(the epilog, `gc`) only ever works through such descriptors, so a user who plants a symlink in their
namespace cannot make root touch anything outside it.

This module is on the TaskProlog and epilog paths: it imports only os, stat, fcntl and pwd up front.
"""
from __future__ import annotations

import fcntl
import os
import stat
from collections import namedtuple

from ..thisnode import expand_node, uses_node
from .errors import TierUnavailable

LEDGER = ".ledger"
ENTRIES, TMP, LOCKS, HOLDS = "entries", "tmp", "locks", "holds"
STAMP, DATA = "stamp", "data"
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO never hangs us
NS_SUBDIRS = (ENTRIES, TMP, LOCKS, HOLDS)
_HEX = frozenset("0123456789abcdef")


class TierConfig(namedtuple("TierConfig", "root quota high low freshness")):
    """A partition's cache tier on this node. `root` has `%n` expanded; `quota` None means the size of
    the filesystem holding the tier."""

    __slots__ = ()

    @classmethod
    def from_profile(cls, profile, node: str | None) -> "TierConfig":
        cache = profile.cache
        if not cache.path:
            raise TierUnavailable("missing", f"partition {profile.name!r} has no cache tier (cache.path is empty)")
        return cls(root=expand_path(cache.path, node), quota=cache.quota, high=cache.high_watermark,
                   low=cache.low_watermark, freshness=cache.freshness)


def expand_path(path: str, node: str | None) -> str:
    """`%n` is the node name (one profile serves every node of a one-machine test cluster); `%%` is `%`."""
    if uses_node(path) and not node:
        raise TierUnavailable("missing", f"cache.path {path!r} uses %n but the node name is unknown "
                                         "(SLURMD_NODENAME is not set; pass --node)")
    return os.path.normpath(expand_node(path, node or ""))


Entry = namedtuple("Entry", "name key gen")
LedgerRow = namedtuple("LedgerRow", "uid entry bytes state last_use")


def parse_entry_name(name: str) -> Entry | None:
    key, dot, gen = name.partition(".")
    if not dot or len(key) != 32 or not set(key) <= _HEX or not gen or not set(gen) <= _HEX:
        return None
    return Entry(name, key, gen)


def generation(entry: Entry) -> tuple[int, str]:
    """Sort key of an entry's generation: gens are time_ns in hex (new_gen), so a longer one is newer."""
    return len(entry.gen), entry.gen


def source_key(source: str) -> str:
    """32 hex digits naming a source path within a namespace (blake2b: builtin, cheap to import)."""
    try:
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover - CPython always has it
        from hashlib import blake2b
    return blake2b(source.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def check_job_id(job_id: str) -> str:
    """Job ids name directories under holds/: digits only (SLURM_JOB_ID is the array task's own id)."""
    if not isinstance(job_id, str) or not job_id.isdigit() or not job_id.isascii():
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def new_gen() -> str:
    import time

    return f"{time.time_ns():x}"


# ---- descriptor-relative helpers -------------------------------------------------------------------------

def open_dir(name: str, dir_fd: int | None = None) -> int:
    """Open a directory without following a symlink at its last component."""
    return os.open(name, O_DIR, dir_fd=dir_fd)


def lstat_at(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_small(name: str, dir_fd: int, limit: int = 65536) -> str | None:
    """A small regular file's text, or None when it is missing or not a regular file (symlink, FIFO...)."""
    try:
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def write_atomic(name: str, text: str, dir_fd: int, mode: int = 0o600, sync: bool = False) -> None:
    """Write a file next to `name` and rename it into place: readers never see half a file."""
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_stamp(entry_fd: int, stamp: dict[str, str]) -> None:
    """An entry's stamp as key=value lines (Namespace.read_stamp reads it back), flushed to disk."""
    write_atomic(STAMP, "".join(f"{k}={v}\n" for k, v in stamp.items()), entry_fd, mode=0o600, sync=True)


def rmtree_at(name: str, dir_fd: int) -> None:
    """Remove `name` under dir_fd without following symlinks (shutil's descriptor-based walk). Directories a
    copy left read-only are opened up first, so removal does not stop half way on EACCES."""
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
    """chmod u+rwx every directory under name (via O_NOFOLLOW descriptors), so rmtree can empty them."""
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


# ---- the tier ---------------------------------------------------------------------------------------------

class Tier:
    """The tier root on this node. Opening it checks that it exists and is safe to share."""

    def __init__(self, config: TierConfig):
        self.config = config
        self.root = config.root
        self._fd: int | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = self._open_root()
        return self._fd

    def _open_root(self) -> int:
        # The root itself is the admin's configured path, so a symlink there (a mount point's alias) is fine.
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise TierUnavailable("missing", f"cache tier {self.root} does not exist (is the local disk "
                                             "mounted? `stune-stage init` creates it)") from None
        except NotADirectoryError:
            raise TierUnavailable("missing", f"cache tier {self.root} is not a directory") from None
        except PermissionError:
            raise TierUnavailable("unsafe", f"cache tier {self.root} is not readable") from None
        st = os.fstat(fd)
        problem = unsafe_shared_dir(st)
        if problem:
            os.close(fd)
            raise TierUnavailable("unsafe", f"cache tier {self.root} {problem}")
        return fd

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.fd)

    def quota(self) -> int:
        """Bytes the tier may use: the profile's quota, or else the size of its filesystem."""
        if self.config.quota is not None:
            return int(self.config.quota)
        vfs = self.statvfs()
        return vfs.f_blocks * vfs.f_frsize

    def free_bytes(self) -> int:
        vfs = self.statvfs()
        return vfs.f_bavail * vfs.f_frsize

    # ---- ledger ------------------------------------------------------------------------------------------
    def ledger_fd(self) -> int:
        try:
            fd = open_dir(LEDGER, self.fd)
        except FileNotFoundError:
            raise TierUnavailable("missing", f"cache tier {self.root} is not initialised "
                                             "(run `stune-stage init` as root)") from None
        except OSError as exc:
            raise TierUnavailable("unsafe", f"{self.root}/{LEDGER}: {exc.strerror}") from None
        problem = unsafe_shared_dir(os.fstat(fd))
        if problem:
            os.close(fd)
            raise TierUnavailable("unsafe", f"{self.root}/{LEDGER} {problem}")
        return fd

    def ledger(self) -> list[LedgerRow]:
        """Every entry's size and last use, all users. A row whose file is not owned by the uid in its name
        is a forgery and ignored."""
        fd = self.ledger_fd()
        rows = []
        try:
            with os.scandir(fd) as it:
                names = [(e.name, e.stat(follow_symlinks=False)) for e in it if not e.name.startswith(".")]
            for name, st in names:
                uid, dot, entry = name.partition(".")
                if not dot or not uid.isdigit() or int(uid) != st.st_uid or not stat.S_ISREG(st.st_mode) \
                        or parse_entry_name(entry) is None:
                    continue
                text = read_small(name, fd, 256) or ""
                fields = text.split()
                if not fields or not fields[0].isdigit():
                    continue
                rows.append(LedgerRow(int(uid), entry, int(fields[0]), fields[1] if len(fields) > 1 else "ready",
                                      st.st_mtime))
        finally:
            os.close(fd)
        return rows

    def usage(self) -> int:
        return sum(r.bytes for r in self.ledger())

    def ledger_write(self, uid: int, entry: str, nbytes: int, state: str) -> None:
        """A row belongs to the entry's user: root writing one on a user's behalf (gc) hands it over, or
        ledger() would ignore it as a forgery."""
        fd = self.ledger_fd()
        try:
            name = f"{uid}.{entry}"
            write_atomic(name, f"{nbytes} {state}\n", fd, mode=0o644)
            if os.geteuid() == 0 and uid != 0:
                os.chown(name, uid, -1, dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)

    def ledger_touch(self, uid: int, entry: str) -> None:
        """Mark an entry used now (its LRU time)."""
        fd = self.ledger_fd()
        try:
            os.utime(f"{uid}.{entry}", dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def ledger_remove(self, uid: int, entry: str) -> None:
        try:
            fd = self.ledger_fd()
        except TierUnavailable:
            return
        try:
            os.unlink(f"{uid}.{entry}", dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    # ---- namespaces --------------------------------------------------------------------------------------
    def namespace(self, uid: int | None = None, user: str | None = None, create: bool = True) -> "Namespace":
        """The namespace of `uid` (default: this process's user). Created 0700 when missing (by its own user,
        or by root on the user's behalf). Refused when it is not a directory owned by uid with mode 0700."""
        import pwd

        uid = os.getuid() if uid is None else int(uid)
        if user is None:
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                raise TierUnavailable("unsafe", f"uid {uid} has no user name") from None
        if not user or user.startswith(".") or "/" in user:
            raise TierUnavailable("unsafe", f"user name {user!r} cannot name a namespace")
        try:
            fd = open_dir(user, self.fd)
        except FileNotFoundError:
            if not create:
                raise TierUnavailable("missing", f"{self.root}/{user} does not exist") from None
            try:
                os.mkdir(user, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise TierUnavailable("unsafe", f"cannot create namespace {self.root}/{user}: {exc.strerror} "
                                                "(the tier root should be mode 1777: `stune-stage init`)") from None
            fd = open_dir(user, self.fd)
            if os.geteuid() == 0 and uid != 0:
                os.chown(fd, uid, -1)
        except OSError as exc:  # a symlink planted where the namespace should be, or someone else's dir
            st = lstat_at(user, self.fd)
            what = "a symlink" if st is not None and stat.S_ISLNK(st.st_mode) else \
                f"owned by uid {st.st_uid}" if st is not None else exc.strerror
            raise TierUnavailable("unsafe", f"namespace {self.root}/{user} must be a directory owned by {user} "
                                            f"with mode 0700; it is {what}") from None
        st = os.fstat(fd)
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
            os.close(fd)
            raise TierUnavailable("unsafe", f"namespace {self.root}/{user} must be owned by {user} with mode "
                                            f"0700 (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
        return Namespace(self, user, uid, fd)

    def namespaces(self) -> list["Namespace"]:
        """Every user's namespace (for root: gc, ls, status). Anything unsafe is skipped."""
        import pwd

        out = []
        with os.scandir(self.fd) as it:
            names = [e.name for e in it if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
        for name in sorted(names):
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                continue
            try:
                out.append(self.namespace(uid, name, create=False))
            except (TierUnavailable, OSError):
                continue
        return out


def unsafe_shared_dir(st: os.stat_result) -> str | None:
    """A directory others may write into must be sticky, or they could rename or delete what is not theirs."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"is writable by others without the sticky bit (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, neither root nor this user"
    return None


class Namespace:
    """One user's corner of the tier, reached through a directory descriptor."""

    def __init__(self, tier: Tier, user: str, uid: int, fd: int):
        self.tier, self.user, self.uid, self.fd = tier, user, uid, fd
        self.path = os.path.join(tier.root, user)
        self._sub: dict[str, int] = {}

    def __repr__(self):
        return f"Namespace({self.path!r})"

    def close(self) -> None:
        for fd in self._sub.values():
            os.close(fd)
        self._sub.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def sub(self, name: str) -> int:
        """Descriptor of entries/, tmp/, locks/ or holds/, created 0700 when missing."""
        fd = self._sub.get(name)
        if fd is None:
            try:
                try:
                    fd = open_dir(name, self.fd)
                except FileNotFoundError:
                    try:
                        os.mkdir(name, 0o700, dir_fd=self.fd)
                    except FileExistsError:
                        pass
                    fd = open_dir(name, self.fd)
                    if os.geteuid() == 0 and self.uid != 0:
                        os.chown(fd, self.uid, -1)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise TierUnavailable("unsafe", f"{self.path}/{name} is not a directory (a symlink?): "
                                                f"{exc.strerror}") from None
            self._sub[name] = fd
        return fd

    def sub_path(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # ---- entries -----------------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Published entries (real directories only; a symlink or file in entries/ is ignored)."""
        out = []
        with os.scandir(self.sub(ENTRIES)) as it:
            for e in it:
                parsed = parse_entry_name(e.name)
                if parsed and e.is_dir(follow_symlinks=False):
                    out.append(parsed)
        return out

    def current(self, key: str) -> Entry | None:
        """The newest published entry of a source key."""
        mine = [e for e in self.entries() if e.key == key]
        return max(mine, key=generation) if mine else None

    def read_stamp(self, entry: str) -> dict[str, str] | None:
        """The entry's stamp (key=value lines), or None when the entry is not a sound published entry."""
        try:
            efd = open_dir(entry, self.sub(ENTRIES))
        except OSError:
            return None
        try:
            text = read_small(STAMP, efd)
            data = lstat_at(DATA, efd)
        finally:
            os.close(efd)
        if text is None or data is None or not stat.S_ISDIR(data.st_mode):
            return None
        out = {}
        for line in text.splitlines():
            k, sep, v = line.partition("=")
            if sep:
                out[k] = v
        return out if out.get("complete") == "1" else None

    def entry_path(self, entry: str, export: str = DATA) -> str:
        return self.sub_path(ENTRIES, entry, export)

    def remove_entry(self, entry: str) -> bool:
        """Move an entry out of entries/ (atomic: it stops being visible at once), then delete it."""
        doomed = f"{entry}.evicted.{os.getpid()}"
        try:
            os.rename(entry, doomed, src_dir_fd=self.sub(ENTRIES), dst_dir_fd=self.sub(TMP))
        except FileNotFoundError:
            return False
        rmtree_at(doomed, self.sub(TMP))
        return True

    # ---- locks -------------------------------------------------------------------------------------------
    def lock(self, key: str, blocking: bool = True) -> int | None:
        """flock the source key; returns the descriptor (close it to unlock), or None if busy and not
        blocking. The kernel releases the lock when its holder dies, so a killed stager never wedges it."""
        locks = self.sub(LOCKS)
        while True:
            fd = os.open(key, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=locks)
            try:
                if os.geteuid() == 0 and self.uid != 0 and os.fstat(fd).st_uid != self.uid:
                    os.fchown(fd, self.uid, -1)
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            # gc may have unlinked the file while we waited on it: then lock the file that is there now.
            now = lstat_at(key, locks)
            if now is not None and now.st_ino == os.fstat(fd).st_ino:
                return fd
            os.close(fd)

    def lock_busy(self, key: str) -> bool:
        fd = self.lock(key, blocking=False)
        if fd is None:
            return True
        os.close(fd)
        return False

    # ---- holds -------------------------------------------------------------------------------------------
    def _job_dir(self, job_id: str) -> int:
        """A descriptor of the job's directory under holds/, made if missing."""
        check_job_id(job_id)
        holds = self.sub(HOLDS)
        try:
            os.mkdir(job_id, 0o700, dir_fd=holds)
        except FileExistsError:
            pass
        return open_dir(job_id, holds)

    def add_hold(self, job_id: str, entry: str) -> None:
        jfd = self._job_dir(job_id)
        try:
            os.close(os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=jfd))
        finally:
            os.close(jfd)

    def job_record(self, job_id: str, key: str) -> tuple[str, str] | None:
        """What this job already settled for a source key on this node: ("entry", name) for a hold, or
        ("fallback", reason) when the first task could not stage it. Lock-free: the fast path for every
        task after the first."""
        check_job_id(job_id)
        try:
            jfd = open_dir(job_id, self.sub(HOLDS))
        except OSError:
            return None
        try:
            with os.scandir(jfd) as it:
                names = [e.name for e in it if e.name.startswith(key + ".")]
            for name in names:
                if name.endswith(".fallback"):
                    return "fallback", (read_small(name, jfd, 4096) or "").strip()
                return "entry", name
        finally:
            os.close(jfd)
        return None

    def record_fallback(self, job_id: str, key: str, reason: str) -> None:
        jfd = self._job_dir(job_id)
        try:
            write_atomic(f"{key}.fallback", reason.replace("\n", " ") + "\n", jfd)
        finally:
            os.close(jfd)

    def holds(self) -> dict[str, list[str]]:
        """job id -> the entries it holds."""
        out: dict[str, list[str]] = {}
        holds = self.sub(HOLDS)
        with os.scandir(holds) as it:
            jobs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for job in jobs:
            try:
                jfd = open_dir(job, holds)
            except OSError:
                continue
            try:
                with os.scandir(jfd) as it:
                    out[job] = [e.name for e in it if parse_entry_name(e.name) is not None
                                and e.is_file(follow_symlinks=False)]
            finally:
                os.close(jfd)
        return out

    def held_entries(self) -> set[str]:
        return {entry for entries in self.holds().values() for entry in entries}

    def release(self, job_id: str) -> bool:
        """Drop every hold (and fallback note) of a job. True if it had any."""
        check_job_id(job_id)
        holds = self.sub(HOLDS)
        if lstat_at(job_id, holds) is None:
            return False
        rmtree_at(job_id, holds)
        return True
