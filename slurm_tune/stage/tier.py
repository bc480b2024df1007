"""One node's cache tier: layout, per-user namespaces, locks, holds, the usage ledger and eviction.

Layout under the tier root (see docs/stage.md):

    ROOT/                     root-owned, mode 1777 (sticky, like /tmp): `stune-stage init` makes it
    ROOT/.ledger/             root-owned, 1777: one file per entry, "<uid>.<entry>", owned by the entry's
                              user; content "<bytes> ready|pending <pid>" (a claim: see Tier.ledger); its
                              mtime is the entry's last use
    ROOT/.quarantine/         root-only: bad namespaces `init` moved aside (Tier.repair_namespace)
    ROOT/<user>/              the user's namespace, mode 0700, owned by the user
        entries/<key>.<gen>/  a published entry: `stamp` (what was copied, and from which source state) and
                              `data/` (the copy, read-only); <key> identifies the source path, <gen> the copy
        tmp/                  copies in progress and entries being deleted (same filesystem: rename)
        locks/<key>           flock(2) files, one per source; the kernel drops a dead stager's lock
        holds/<jobid>/<entry> a running job uses <entry>: never evicted while the file exists

Root (the epilog, `gc`, `init`) works here only through slurm_tune.safeio's rules: directories opened with
O_NOFOLLOW|O_DIRECTORY relative to their parent's descriptor, files with O_NOFOLLOW|O_NONBLOCK and checked
(type, owner, link count) on the descriptor, new files made with O_EXCL. Root never writes, truncates or
chowns a file it did not just create, and trusts no size a user wrote without checking it on disk.

This module is on the TaskProlog and epilog paths: it imports only os, stat, fcntl and pwd up front.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections import namedtuple

from .. import safeio
from ..safeio import UnsafePathError, lstat_at, rmtree_at
from ..thisnode import expand, uses_node
from .errors import TierUnavailable

LEDGER = ".ledger"
QUARANTINE = ".quarantine"      # bad namespaces moved aside by root (root-only, for the admin to inspect)
ENTRIES, TMP, LOCKS, HOLDS = "entries", "tmp", "locks", "holds"
STAMP, DATA = "stamp", "data"
RESERVE_MAX = 64 << 20      # free space kept on the tier's filesystem (see reserve_bytes)
ROW_MAX_DIGITS = 19         # a ledger size has at most this many digits (below 2**63)
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
    return os.path.normpath(expand(path, node or ""))


Entry = namedtuple("Entry", "name key gen")
LedgerRow = namedtuple("LedgerRow", "uid entry bytes state last_use")


def parse_row(text: str, limit: int) -> tuple[int, str] | None:
    """(bytes, state) of a ledger row "<bytes> ready|pending <pid>", or None for garbage: a size that is
    not plain digits, has more than ROW_MAX_DIGITS of them, or exceeds `limit` (the tier's filesystem)."""
    fields = text.split()
    if not fields or not fields[0].isascii() or not fields[0].isdigit() or len(fields[0]) > ROW_MAX_DIGITS:
        return None
    nbytes = int(fields[0])
    if nbytes > limit:
        return None
    state = " ".join(fields[1:3]) if len(fields) > 1 else "ready"
    if state != "ready" and not state.startswith("pending"):
        return None
    return nbytes, state


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


# ---- descriptor-relative helpers (root's safe-open rules live in slurm_tune.safeio) ------------------------

def open_dir(name: str, dir_fd: int | None = None, owner: int | None = None) -> int:
    """safeio.open_dir, raising OSError like os.open does (callers here treat a planted symlink or file where
    a directory belongs as "not usable", the same as missing)."""
    try:
        return safeio.open_dir(name, dir_fd, owner=owner)
    except UnsafePathError as exc:
        raise NotADirectoryError(errno.ENOTDIR, exc.problem, exc.path) from None


def read_text(name: str, dir_fd: int, limit: int = 65536, owner: int | None = None) -> str | None:
    """safeio.read_small, decoded: None when missing, not a regular file (symlink, FIFO...), not `owner`'s,
    or longer than `limit`."""
    data = safeio.read_small(name, dir_fd, limit, owner=owner)
    return None if data is None else data.decode("utf-8", "replace")


def write_stamp(entry_fd: int, stamp: dict[str, str]) -> None:
    """An entry's stamp as key=value lines (Namespace.read_stamp reads it back), flushed to disk."""
    safeio.write_atomic(STAMP, "".join(f"{k}={v}\n" for k, v in stamp.items()), mode=0o600, dir_fd=entry_fd,
                        sync=True)


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


def reserve_bytes(fs_size: int) -> int:
    """Free space the tier always leaves on its filesystem: 64 MiB, or 1/16 of a filesystem smaller than
    1 GiB (so a small test tier is not all reserve). Admission and the copy's guard both use this rule."""
    return min(RESERVE_MAX, fs_size // 16)


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

    def fs_size(self) -> int:
        vfs = self.statvfs()
        return vfs.f_blocks * vfs.f_frsize

    def used_bytes(self) -> int:
        """Bytes in use on the tier's filesystem (by anything): the most the entries can take."""
        vfs = self.statvfs()
        return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize

    def reserve(self) -> int:
        return reserve_bytes(self.fs_size())

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
        """Every entry's claimed size and last use, all users. A row counts only when its file is a regular
        file with one link, owned by the uid in its name, and says "<size> <state>" with a size no bigger than
        the tier's filesystem: anything else is a forgery or garbage and is ignored. Sizes are still a
        user's claim: see usage() and verified_ledger()."""
        fd = self.ledger_fd()
        rows = []
        limit = max(self.quota(), self.fs_size())
        try:
            with os.scandir(fd) as it:
                names = [(e.name, e.stat(follow_symlinks=False)) for e in it if not e.name.startswith(".")]
            for name, st in names:
                uid, dot, entry = name.partition(".")
                if not dot or not uid.isdigit() or len(uid) > 10 or int(uid) != st.st_uid \
                        or not stat.S_ISREG(st.st_mode) or parse_entry_name(entry) is None:
                    continue
                row = parse_row(read_text(name, fd, 256, owner=int(uid)) or "", limit)
                if row is not None:
                    rows.append(LedgerRow(int(uid), entry, row[0], row[1], st.st_mtime))
        finally:
            os.close(fd)
        return rows

    def usage(self, rows: list[LedgerRow] | None = None) -> int:
        """Bytes in entries, as the ledger claims them, but never more than the tier's filesystem really
        has in use: a claim cannot make space disappear that no file takes."""
        rows = self.ledger() if rows is None else rows
        return min(sum(r.bytes for r in rows), self.used_bytes())

    def verified_ledger(self, fix: bool = False) -> tuple[list[LedgerRow], list[str]]:
        """Root's ledger (before it evicts anyone): each ready row sized by what its entry really takes on
        disk when the row claims more, rows of entries that do not exist dropped, pending rows counted only
        while their stager holds the key's lock. Returns (rows, what did not match, one line each).
        Run as a user it can only check that user's own rows; others' are taken as claimed. With `fix`
        (root), a ready row without its entry is removed and an inflated one rewritten with the real size."""
        import pwd

        rows, problems = [], []
        by_uid: dict[int, list[LedgerRow]] = {}
        for row in self.ledger():
            by_uid.setdefault(row.uid, []).append(row)
        for uid, mine in by_uid.items():
            try:
                ns = self.namespace(uid, pwd.getpwuid(uid).pw_name, create=False)
            except (KeyError, TierUnavailable, OSError):
                if os.geteuid() == 0:  # root can see every namespace: no namespace, no entries
                    problems += [f"{uid}.{r.entry}: no namespace for uid {uid}; not counted" for r in mine]
                else:
                    rows += mine
                continue
            with ns:
                for row in mine:
                    real = ns.measure(row)
                    if real is None:
                        problems.append(f"{ns.user}/{row.entry}: no such entry; not counted")
                        if fix and row.state == "ready":
                            self.ledger_remove(uid, row.entry)
                    elif row.bytes > real:
                        problems.append(f"{ns.user}/{row.entry}: the ledger claims {row.bytes} bytes, the entry "
                                        f"takes {real}; counted as {real}")
                        rows.append(row._replace(bytes=real))
                        if fix and row.state == "ready":
                            self.ledger_write(uid, row.entry, real, "ready")
                    else:
                        rows.append(row)
        return rows, problems

    def ledger_write(self, uid: int, entry: str, nbytes: int, state: str) -> None:
        """A row belongs to the entry's user: root writing one on a user's behalf (gc) gives the temporary
        it just created to that user before renaming it into place, or ledger() would ignore the row."""
        fd = self.ledger_fd()
        try:
            safeio.write_atomic(f"{uid}.{entry}", f"{nbytes} {state}\n", mode=0o644, dir_fd=fd,
                                owner=uid if os.geteuid() == 0 else None)
        finally:
            os.close(fd)

    def ledger_touch(self, uid: int, entry: str) -> None:
        """Mark an entry used now (its LRU time): through a descriptor of the row itself, checked to be the
        user's own single-linked file, so a planted link never gets another file's time changed."""
        fd = self.ledger_fd()
        try:
            rfd = safeio.open_file(f"{uid}.{entry}", fd, owner=uid)
        except (OSError, UnsafePathError):
            return
        finally:
            os.close(fd)
        try:
            os.utime(rfd)
        finally:
            os.close(rfd)

    def ledger_remove(self, uid: int, entry: str) -> None:
        """Unlinking a name is safe whatever it is (a hard link's target keeps its other names)."""
        try:
            fd = self.ledger_fd()
        except TierUnavailable:
            return
        try:
            os.unlink(f"{uid}.{entry}", dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
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
            fd = self._create_namespace(user, uid)
        except OSError as exc:  # a symlink planted where the namespace should be, or someone else's dir
            raise TierUnavailable("unsafe", f"namespace {self.root}/{user} must be a directory owned by {user} "
                                            f"with mode 0700; it is {self._what(user, uid, exc)}") from None
        problem = namespace_problem(os.fstat(fd), uid)
        if problem:
            os.close(fd)
            raise TierUnavailable("unsafe", f"namespace {self.root}/{user} must be owned by {user} with mode "
                                            f"0700; it is {problem}")
        return Namespace(self, user, uid, fd)

    def _what(self, name: str, uid: int, exc: OSError | None = None) -> str:
        st = lstat_at(name, self.fd)
        if st is None:
            return exc.strerror if exc is not None else "missing"
        if stat.S_ISLNK(st.st_mode):
            return "a symlink"
        if not stat.S_ISDIR(st.st_mode):
            return f"not a directory (mode {st.st_mode:o}, owned by uid {st.st_uid})"
        return namespace_problem(st, uid) or (exc.strerror if exc is not None else "unusable")

    def _create_namespace(self, user: str, uid: int) -> int:
        """mkdir the namespace 0700; root creating it for a user hands the directory it just made over
        through its descriptor. Someone else's directory that appeared meanwhile is never chowned."""
        try:
            os.mkdir(user, 0o700, dir_fd=self.fd)
        except FileExistsError:
            return open_dir(user, self.fd)
        except OSError as exc:
            raise TierUnavailable("unsafe", f"cannot create namespace {self.root}/{user}: {exc.strerror} "
                                            "(the tier root should be mode 1777: `stune-stage init`)") from None
        fd = open_dir(user, self.fd)
        st = os.fstat(fd)
        if os.geteuid() == 0 and uid != 0 and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700:
            os.fchown(fd, uid, -1)  # ours (root's, 0700, in a sticky root nobody else can rename it in)
        return fd

    def namespaces(self) -> list["Namespace"]:
        """Every user's sound namespace (for root: gc, ls, status). Anything else is skipped here and
        reported by namespace_problems()."""
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

    def namespace_problems(self) -> list["BadNamespace"]:
        """Names in the tier root that are not a sound namespace: a symlink, file or FIFO, a directory of a
        user name that does not exist, or one not owned by its user with mode 0700 (squatted by another
        user with `mkdir -m 0777`, or opened up by its owner). Jobs of that user fall back until it is
        repaired (repair_namespace, `stune-stage init`)."""
        import pwd

        out = []
        with os.scandir(self.fd) as it:
            names = sorted(e.name for e in it if not e.name.startswith("."))
        for name in names:
            st = lstat_at(name, self.fd)
            if st is None:
                continue
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                out.append(BadNamespace(name, None, f"{self.root}/{name}: no user {name!r}: not a namespace"))
                continue
            if stat.S_ISDIR(st.st_mode):
                problem = namespace_problem(st, uid)
                if problem is None:
                    continue
            else:
                problem = self._what(name, uid)
            out.append(BadNamespace(name, uid, f"{self.root}/{name}: namespace of {name} must be a directory "
                                               f"owned by {name} with mode 0700; it is {problem}"))
        return out

    def repair_namespace(self, bad: "BadNamespace") -> str:
        """Root's repair of a bad namespace: its owner's own directory with a wrong mode gets mode 0700
        back (through a no-follow descriptor); anything else (another user's directory, a symlink, a file) is
        moved aside into ROOT/.quarantine/ (root-only) for the admin to inspect, and the user's namespace is
        made afresh, empty, owned by the user. Returns what was done, in one line."""
        if os.geteuid() != 0:
            raise TierUnavailable("unsafe", "repairing a namespace needs root")
        name = bad.name
        st = lstat_at(name, self.fd)
        if st is None:
            return f"{self.root}/{name}: gone meanwhile"
        if bad.uid is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == bad.uid:
            fd = open_dir(name, self.fd, owner=bad.uid)
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
            return f"{self.root}/{name}: mode set back to 0700"
        qfd = self._quarantine()
        try:
            aside = f"{name}.{new_gen()}"
            os.rename(name, aside, src_dir_fd=self.fd, dst_dir_fd=qfd)
        finally:
            os.close(qfd)
        done = f"{self.root}/{name}: moved aside to {self.root}/{QUARANTINE}/{aside}"
        if bad.uid is not None:
            os.close(self._create_namespace(name, bad.uid))
            done += f"; made a new namespace owned by {name}, mode 0700"
        return done

    def _quarantine(self) -> int:
        """A descriptor of ROOT/.quarantine (root-only, made if missing), where init moves bad things aside."""
        try:
            os.mkdir(QUARANTINE, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        fd = open_dir(QUARANTINE, self.fd, owner=0)
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
            os.fchmod(fd, 0o700)
        return fd


BadNamespace = namedtuple("BadNamespace", "name uid problem")


def namespace_problem(st: os.stat_result, uid: int) -> str | None:
    """What is wrong with a namespace directory's status for user `uid` (uid -1: any owner), or None."""
    mode = stat.S_IMODE(st.st_mode)
    if uid >= 0 and st.st_uid != uid:
        return f"owned by uid {st.st_uid} (mode {mode:04o})"
    if mode != 0o700:
        return f"mode {mode:04o} (owner uid {st.st_uid})"
    return None


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
        """Descriptor of entries/, tmp/, locks/ or holds/, created 0700 when missing. It must be a real
        directory owned by the namespace's user (root made it on the user's behalf, or the user did)."""
        fd = self._sub.get(name)
        if fd is None:
            try:
                try:
                    fd = open_dir(name, self.fd, owner=self.uid)
                except FileNotFoundError:
                    try:
                        os.mkdir(name, 0o700, dir_fd=self.fd)
                        created = True
                    except FileExistsError:
                        created = False
                    if created and os.geteuid() == 0 and self.uid != 0:
                        fd = open_dir(name, self.fd, owner=0)
                        os.fchown(fd, self.uid, -1)  # root just made it (in a 0700 directory of the user's)
                    else:
                        fd = open_dir(name, self.fd, owner=self.uid)
            except FileNotFoundError:
                raise
            except (OSError, UnsafePathError) as exc:
                raise TierUnavailable("unsafe", f"{self.path}/{name} is not a directory of {self.user}'s "
                                                f"(a symlink?): {getattr(exc, 'strerror', None) or exc}") from None
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
            text = read_text(STAMP, efd)
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

    def measure(self, row) -> int | None:
        """What a ledger row's entry really takes on disk, for checking the row's claim: the published
        entry (a ready row), or the copy in progress in tmp/ (a pending row: a reservation counts only as
        far as it has been filled, so a forged one counts nothing). None when a ready row has no entry."""
        if parse_entry_name(row.entry) is None:
            return None
        if row.state == "ready":
            if lstat_at(row.entry, self.sub(ENTRIES)) is None:
                return None
            return allocated_bytes(row.entry, self.sub(ENTRIES))
        tmp = self.sub(TMP)
        with os.scandir(tmp) as it:
            names = [e.name for e in it if e.name.startswith(row.entry + ".")]
        return sum(allocated_bytes(name, tmp) for name in names)

    # ---- locks -------------------------------------------------------------------------------------------
    def lock(self, key: str, blocking: bool = True) -> int | None:
        """flock the source key; returns the descriptor (close it to unlock), or None if busy and not
        blocking. The kernel releases the lock when its holder dies, so a killed stager never wedges it.
        The lock file is opened only if it is the user's own single-linked regular file (no FIFO, no hard
        link, no symlink: TierUnavailable), or created with O_EXCL; root never chowns one it did not create."""
        locks = self.sub(LOCKS)
        while True:
            try:
                fd = safeio.open_or_create(key, locks, owner=self.uid)
            except UnsafePathError as exc:
                raise TierUnavailable("unsafe", f"lock file {exc.path} {exc.problem}: remove it "
                                                "(`stune-stage gc` does)") from None
            try:
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

    def bad_locks(self) -> list[str]:
        """Names in locks/ that are not usable lock files (a planted FIFO, hard link, symlink, directory,
        or someone else's file): each makes its source unstageable until removed."""
        locks = self.sub(LOCKS)
        with os.scandir(locks) as it:
            names = [e.name for e in it]
        bad = []
        for name in names:
            st = lstat_at(name, locks)
            if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != self.uid):
                bad.append(name)
        return bad

    def lock_busy(self, key: str) -> bool:
        fd = self.lock(key, blocking=False)
        if fd is None:
            return True
        os.close(fd)
        return False

    # ---- holds -------------------------------------------------------------------------------------------
    def _job_dir(self, job_id: str) -> int:
        """A descriptor of the job's directory under holds/ (the user's own), made if missing."""
        check_job_id(job_id)
        holds = self.sub(HOLDS)
        try:
            os.mkdir(job_id, 0o700, dir_fd=holds)
        except FileExistsError:
            pass
        try:
            return open_dir(job_id, holds, owner=self.uid)
        except (OSError, UnsafePathError) as exc:
            raise TierUnavailable("unsafe", f"{self.path}/{HOLDS}/{job_id} is not a directory: {exc}") from None

    def add_hold(self, job_id: str, entry: str) -> None:
        """The hold is an empty file made with O_EXCL; one already there must be a regular file (a FIFO
        planted there is never opened, so it cannot hang the stager)."""
        jfd = self._job_dir(job_id)
        try:
            try:
                os.close(safeio.create_exclusive(entry, jfd, 0o600, flags=os.O_RDONLY))
            except FileExistsError:
                st = lstat_at(entry, jfd)
                if st is None or not stat.S_ISREG(st.st_mode):
                    raise TierUnavailable("unsafe", f"{self.path}/{HOLDS}/{job_id}/{entry} is not a regular "
                                                    "file") from None
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
            with os.scandir(jfd) as it:  # regular files only: a FIFO or link planted here is no record
                names = sorted(e.name for e in it if e.name.startswith(key + ".") and e.is_file(follow_symlinks=False))
            for name in names:
                if name == f"{key}.fallback":
                    reason = read_text(name, jfd, 4096)
                    if reason is not None:
                        return "fallback", reason.strip()
                elif parse_entry_name(name) is not None:
                    return "entry", name
        finally:
            os.close(jfd)
        return None

    def record_fallback(self, job_id: str, key: str, reason: str) -> None:
        jfd = self._job_dir(job_id)
        try:
            safeio.write_atomic(f"{key}.fallback", reason.replace("\n", " ") + "\n", mode=0o600, dir_fd=jfd)
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
