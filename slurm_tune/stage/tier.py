"""One node's cache tier: its root, the usage ledger of every entry, and the users' namespaces in it.

The layout and the formats are in layout.py; one user's namespace (entries, locks, holds) in namespace.py.
Root reaches everything here through directory descriptors (dirfd.py, slurm_tune.safeio's rules).

This module is on the TaskProlog and epilog paths: it imports only os, stat and collections up front (pwd when
it needs a user name).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections import namedtuple

from .. import safeio
from ..safeio import UnsafePathError, lstat_at
from ..thisnode import expand, uses_node
from .dirfd import open_dir, read_text, unsafe_shared_dir
from .errors import TierUnavailable
from .layout import LEDGER, QUARANTINE, LedgerRow, new_gen, parse_entry_name, parse_row
from .namespace import Namespace

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

RESERVE_MAX = 64 << 20  # free space kept on the tier's filesystem (see reserve_bytes)


class TierConfig(namedtuple("TierConfig", "root quota high low freshness")):
    """A partition's cache tier on this node. `root` has `%n` expanded; `quota` None means the size of
    the filesystem holding the tier."""

    __slots__ = ()

    @classmethod
    def from_profile(cls, profile: Profile, node: str | None) -> TierConfig:
        cache = profile.cache
        if not cache.path:
            raise TierUnavailable(
                "missing", f"partition {profile.name!r} has no cache tier (cache.path is empty)"
            )
        return cls(
            root=expand_path(cache.path, node),
            quota=cache.quota,
            high=cache.high_watermark,
            low=cache.low_watermark,
            freshness=cache.freshness,
        )


def expand_path(path: str, node: str | None) -> str:
    """`%n` is the node name (one profile serves every node of a one-machine test cluster); `%%` is `%`."""
    if uses_node(path) and not node:
        raise TierUnavailable(
            "missing",
            f"cache.path {path!r} uses %n but the node name is unknown "
            "(SLURMD_NODENAME is not set; pass --node)",
        )
    return os.path.normpath(expand(path, node or ""))


def reserve_bytes(fs_size: int) -> int:
    """Free space the tier always leaves on its filesystem: 64 MiB, or 1/16 of a filesystem smaller than
    1 GiB (so a small test tier is not all reserve). Admission and the copy's guard both use this rule."""
    return min(RESERVE_MAX, fs_size // 16)


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
            fd = open_dir(self.root, follow_symlinks=True)
        except FileNotFoundError:
            raise TierUnavailable(
                "missing",
                f"cache tier {self.root} does not exist (is the local disk "
                "mounted? `stune-stage init` creates it)",
            ) from None
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
            raise TierUnavailable(
                "missing", f"cache tier {self.root} is not initialised (run `stune-stage init` as root)"
            ) from None
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
                if (
                    not dot
                    or not uid.isdigit()
                    or len(uid) > 10
                    or int(uid) != st.st_uid
                    or not stat.S_ISREG(st.st_mode)
                    or parse_entry_name(entry) is None
                ):
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
                        problems.append(
                            f"{ns.user}/{row.entry}: the ledger claims {row.bytes} bytes, the entry "
                            f"takes {real}; counted as {real}"
                        )
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
            safeio.write_atomic(
                f"{uid}.{entry}",
                f"{nbytes} {state}\n",
                mode=0o644,
                dir_fd=fd,
                owner=uid if os.geteuid() == 0 else None,
            )
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
    def namespace(self, uid: int | None = None, user: str | None = None, create: bool = True) -> Namespace:
        """The namespace of `uid` (default: this process's user). Created 0700 when missing (by its own user,
        or by root on the user's behalf). Refused when it is not a directory owned by uid with mode 0700."""
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
            raise TierUnavailable(
                "unsafe",
                f"namespace {self.root}/{user} must be a directory owned by {user} "
                f"with mode 0700; it is {self._what(user, uid, exc)}",
            ) from None
        problem = namespace_problem(os.fstat(fd), uid)
        if problem:
            os.close(fd)
            raise TierUnavailable(
                "unsafe",
                f"namespace {self.root}/{user} must be owned by {user} with mode 0700; it is {problem}",
            )
        return Namespace(self, user, uid, fd)

    def _what(self, name: str, uid: int, exc: OSError | None = None) -> str:
        st = lstat_at(name, self.fd)
        if st is None:
            return (exc.strerror or str(exc)) if exc is not None else "missing"
        if stat.S_ISLNK(st.st_mode):
            return "a symlink"
        if not stat.S_ISDIR(st.st_mode):
            return f"not a directory (mode {st.st_mode:o}, owned by uid {st.st_uid})"
        return namespace_problem(st, uid) or ((exc.strerror or str(exc)) if exc is not None else "unusable")

    def _create_namespace(self, user: str, uid: int) -> int:
        """mkdir the namespace 0700; root creating it for a user hands the directory it just made over
        through its descriptor. Someone else's directory that appeared meanwhile is never chowned."""
        try:
            os.mkdir(user, 0o700, dir_fd=self.fd)
        except FileExistsError:
            return open_dir(user, self.fd)
        except OSError as exc:
            raise TierUnavailable(
                "unsafe",
                f"cannot create namespace {self.root}/{user}: {exc.strerror} "
                "(the tier root should be mode 1777: `stune-stage init`)",
            ) from None
        fd = open_dir(user, self.fd)
        st = os.fstat(fd)
        if os.geteuid() == 0 and uid != 0 and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700:
            os.fchown(fd, uid, -1)  # ours (root's, 0700, in a sticky root nobody else can rename it in)
        return fd

    def namespaces(self) -> list[Namespace]:
        """Every user's sound namespace (for root: gc, ls, status). Anything else is skipped here and
        reported by namespace_problems()."""
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

    def namespace_problems(self) -> list[BadNamespace]:
        """Names in the tier root that are not a sound namespace: a symlink, file or FIFO, a directory of a
        user name that does not exist, or one not owned by its user with mode 0700 (squatted by another
        user with `mkdir -m 0777`, or opened up by its owner). Jobs of that user fall back until it is
        repaired (repair_namespace, `stune-stage init`)."""
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
            out.append(
                BadNamespace(
                    name,
                    uid,
                    f"{self.root}/{name}: namespace of {name} must be a directory "
                    f"owned by {name} with mode 0700; it is {problem}",
                )
            )
        return out

    def repair_namespace(self, bad: BadNamespace) -> str:
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
