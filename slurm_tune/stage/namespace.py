"""One user's namespace in the cache tier: published entries and their stamps, the per-source locks, and
the holds of running jobs. Reached through the namespace's directory descriptor (Tier.namespace opens it)."""

from __future__ import annotations

import os
import stat

from .. import safeio
from ..readback import COUNT_MAX, EPOCH_MAX, parse
from ..safeio import UnsafePathError, lstat_at, rmtree_at
from .dirfd import allocated_bytes, open_dir, read_text
from .errors import TierUnavailable
from .layout import (
    DATA,
    ENTRIES,
    HOLDS,
    LOCKS,
    STAMP,
    STAMP_NUMBERS,
    TMP,
    Entry,
    check_job_id,
    generation,
    parse_entry_name,
)


class Namespace:
    """One user's corner of the tier, reached through a directory descriptor."""

    def __init__(self, tier, user: str, uid: int, fd: int):
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
                raise TierUnavailable(
                    "unsafe",
                    f"{self.path}/{name} is not a directory of {self.user}'s "
                    f"(a symlink?): {getattr(exc, 'strerror', None) or exc}",
                ) from None
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
        for key, integer in STAMP_NUMBERS:  # a size or time stune never writes: not a sound entry
            if (
                key in out
                and parse(out[key], 0, COUNT_MAX if integer else EPOCH_MAX, integer=integer) is None
            ):
                return None
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
                raise TierUnavailable(
                    "unsafe", f"lock file {exc.path} {exc.problem}: remove it (`stune-stage gc` does)"
                ) from None
            try:
                locked = safeio.lock_fd(fd, blocking=blocking)
            except BaseException:
                os.close(fd)
                raise
            if not locked:
                os.close(fd)
                return None
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
            raise TierUnavailable(
                "unsafe", f"{self.path}/{HOLDS}/{job_id} is not a directory: {exc}"
            ) from None

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
                    raise TierUnavailable(
                        "unsafe", f"{self.path}/{HOLDS}/{job_id}/{entry} is not a regular file"
                    ) from None
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
                names = sorted(
                    e.name for e in it if e.name.startswith(key + ".") and e.is_file(follow_symlinks=False)
                )
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
                    out[job] = [
                        e.name
                        for e in it
                        if parse_entry_name(e.name) is not None and e.is_file(follow_symlinks=False)
                    ]
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
