"""Tier maintenance for admins and the epilog: list, status, release a job's holds, garbage-collect, init.

Run as root these see every user's namespace (always through O_NOFOLLOW descriptors, see dirfd.py); run as
a user they see that user's own.
"""

from __future__ import annotations

import os
import stat
import time
from collections import namedtuple

from ..errors import StuneError
from ..safeio import lstat_at, rmtree_at
from .dirfd import open_dir
from .errors import TierUnavailable
from .evict import evict_lru
from .layout import LEDGER, LOCKS, QUARANTINE, TMP, generation, new_gen, parse_entry_name
from .namespace import Namespace
from .stager import ledger_from_stamp
from .tier import Tier, TierConfig

# squeue states in which a job may still be using its node's cache.
LIVE_STATES = frozenset(
    {
        "RUNNING",
        "COMPLETING",
        "CONFIGURING",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "REQUEUED",
        "PENDING",
    }
)


def tiers_for(
    partition: str | None, node: str | None, path: str | None = None
) -> list[tuple[str, TierConfig]]:
    """(partitions, tier) for each distinct tier: one partition's, an explicit --path, or every profile's."""
    from ..profiles import PROFILE_SCHEMA, load_profile, load_profiles

    if path:  # no profile: the built-in cache defaults
        cache = PROFILE_SCHEMA.fields["cache"].complete({}, "cache", None)
        return [
            (
                "(path)",
                TierConfig(
                    os.path.normpath(path),
                    None,
                    cache["high_watermark"],
                    cache["low_watermark"],
                    cache["freshness"],
                ),
            )
        ]
    profiles = [load_profile(partition)] if partition else list(load_profiles().values())
    seen: dict[str, tuple[list[str], TierConfig]] = {}
    for profile in profiles:
        if not profile.cache.path:
            continue
        config = TierConfig.from_profile(profile, node)
        seen.setdefault(config.root, ([], config))[0].append(profile.name)
    return [(",".join(names), config) for names, config in seen.values()]


def my_namespaces(tier: Tier) -> list[Namespace]:
    if os.geteuid() == 0:
        return tier.namespaces()
    try:
        return [tier.namespace(create=False)]
    except TierUnavailable:
        return []


# ---- ls ---------------------------------------------------------------------------------------------------

Listing = namedtuple("Listing", "user entry source kind bytes files last_use published holds current")


def list_entries(tier: Tier, problems: list[str] | None = None) -> list[Listing]:
    """Every visible entry, most recently used first. A namespace its user broke (a symlink where a
    directory belongs) is skipped, and said so in `problems`."""
    rows = {(r.uid, r.entry): r for r in _ledger_or_empty(tier)}
    out = []
    if problems is not None and os.geteuid() == 0:
        problems += [
            f"{bad.problem}: skipped (`stune-stage init` repairs it)" for bad in tier.namespace_problems()
        ]
    for ns in my_namespaces(tier):
        with ns:
            try:
                out += _list_namespace(ns, rows)
            except (TierUnavailable, OSError) as exc:
                if problems is not None:
                    problems.append(f"{ns.path}: skipped: {exc}")
    return sorted(out, key=lambda r: -(r.last_use or 0))


def _list_namespace(ns: Namespace, rows) -> list[Listing]:
    held_by: dict[str, list[str]] = {}
    for job, held in ns.holds().items():
        for entry in held:
            held_by.setdefault(entry, []).append(job)
    entries = ns.entries()
    newest = {e.key: e for e in sorted(entries, key=generation)}
    out = []
    for e in entries:
        stamp = ns.read_stamp(e.name) or {}
        row = rows.get((ns.uid, e.name))
        out.append(
            Listing(
                ns.user,
                e.name,
                stamp.get("source", "?"),
                stamp.get("kind", "?"),
                int(stamp.get("bytes", 0) or 0),
                int(stamp.get("files", 0) or 0),
                row.last_use if row else None,
                float(stamp.get("published", 0) or 0),
                sorted(held_by.get(e.name, []), key=int),
                newest[e.key] == e,
            )
        )
    return out


def _ledger_or_empty(tier: Tier):
    try:
        return tier.ledger()
    except TierUnavailable:
        return []


# ---- status -----------------------------------------------------------------------------------------------

Status = namedtuple(
    "Status",
    "root quota usage high low fs_size fs_free entries held pending users problem "
    "namespace_problems ledger_problems reserve",
)


def status(tier: Tier) -> Status:
    config = tier.config
    try:
        tier.fd
    except TierUnavailable as exc:
        return Status(
            config.root, config.quota, 0, config.high, config.low, 0, 0, 0, 0, 0, 0, str(exc), [], [], 0
        )
    vfs = tier.statvfs()
    problem = None
    ledger_problems: list[str] = []
    try:
        if os.geteuid() == 0:  # root sees every entry, so it reports what the entries really take
            ledger, ledger_problems = tier.verified_ledger()
        else:
            ledger = tier.ledger()
    except TierUnavailable as exc:
        ledger, problem = [], str(exc)
    bad = [b.problem for b in tier.namespace_problems()] if os.geteuid() == 0 else []
    held = 0
    users = 0
    for ns in my_namespaces(tier):
        with ns:
            users += 1
            held += len(ns.held_entries())
    return Status(
        config.root,
        tier.quota(),
        tier.usage(ledger),
        config.high,
        config.low,
        vfs.f_blocks * vfs.f_frsize,
        vfs.f_bavail * vfs.f_frsize,
        sum(1 for r in ledger if r.state == "ready"),
        held,
        sum(1 for r in ledger if r.state != "ready"),
        users,
        problem,
        bad,
        ledger_problems,
        tier.reserve(),
    )


# ---- release (the epilog) ---------------------------------------------------------------------------------


def release_job(tier: Tier, job_id: str, uid: int | None = None, user: str | None = None) -> bool:
    """Drop a finished job's holds in its user's namespace. True if it held anything."""
    try:
        ns = tier.namespace(uid, user, create=False)
    except TierUnavailable as exc:
        if exc.kind == "missing":
            return False
        raise
    with ns:
        return ns.release(job_id)


def evict_above_high(tier: Tier, dry_run: bool = False) -> list[tuple[str, str, int]]:
    """Past the high watermark, evict unheld entries (every user's, as root) down to the low watermark."""
    quota = tier.quota()
    if tier.usage() <= tier.config.high * quota:
        return []
    # Claims are checked against the entries before anyone loses one; root corrects the rows it checked.
    rows, _problems = tier.verified_ledger(fix=not dry_run and os.geteuid() == 0)
    if tier.usage(rows) <= tier.config.high * quota:
        return []
    namespaces = my_namespaces(tier)
    try:
        return evict_lru(tier, namespaces, int(tier.config.low * quota), dry_run=dry_run, rows=rows)
    finally:
        for ns in namespaces:
            ns.close()


# ---- gc ---------------------------------------------------------------------------------------------------

GcReport = namedtuple(
    "GcReport",
    "stale_holds tmp_removed ledger_fixed old_removed evicted locks_removed bad_namespaces problems",
)


def live_job_ids(slurm) -> set[str]:
    """Job ids that may still use a node's cache. Raises StuneError when Slurm cannot say: then nothing
    counts as dead (a hold is only reclaimed on Slurm's word)."""
    return {str(j.job_id) for j in slurm.jobs() if not LIVE_STATES.isdisjoint(j.state_set)}


def gc(
    tier: Tier, slurm=None, dry_run: bool = False, to_low: bool = False, evict_all: bool = False
) -> GcReport:
    """Reclaim what dead stagers and dead jobs left behind, then evict LRU past the high watermark
    (with to_low: down to the low watermark in any case; with evict_all: every unheld entry)."""
    namespaces = my_namespaces(tier)
    stale, tmp_removed, ledger_fixed, old_removed, locks_removed = [], [], [], [], []
    problems = []
    bad_namespaces = [b.problem for b in tier.namespace_problems()] if os.geteuid() == 0 else []
    try:
        # Holds first, liveness second: a job that starts after the squeue snapshot cannot have a hold
        # in a listing taken before it, so no live job's hold is ever taken for dead.
        holders = {}
        for ns in list(namespaces):
            try:
                holders[ns.user] = list(ns.holds())
            except (TierUnavailable, OSError) as exc:  # a namespace its user broke: leave it alone
                problems.append(f"{ns.path}: skipped: {exc}")
                namespaces.remove(ns)
                ns.close()
        alive: set[str] | None = None
        if any(holders.values()):
            try:
                if slurm is None:
                    from ..slurm import Slurm

                    slurm = Slurm.from_env()
                alive = live_job_ids(slurm)
            except StuneError as exc:
                problems.append(f"job liveness unknown, no hold reclaimed: {exc}")
        ledger = {(r.uid, r.entry): r for r in _ledger_or_empty(tier)}
        for ns in list(namespaces):
            try:
                if alive is not None:
                    for job in holders[ns.user]:
                        if job not in alive:
                            stale.append((ns.user, job))
                            if not dry_run:
                                ns.release(job)
                locks_removed += _remove_bad_locks(ns, dry_run)
                tmp_removed += _clean_tmp(ns, dry_run)
                ledger_fixed += _fix_ledger(tier, ns, ledger, dry_run)
                old_removed += _drop_old_generations(tier, ns, dry_run)
                locks_removed += _clean_locks(ns, dry_run)
            except (TierUnavailable, OSError) as exc:
                problems.append(f"{ns.path}: skipped: {exc}")
                namespaces.remove(ns)
                ns.close()
        quota = tier.quota()
        evicted = []
        rows = _ledger_or_empty(tier)
        if evict_all or to_low or tier.usage(rows) > tier.config.high * quota:
            try:  # nobody is evicted on a claim: each row is checked against its entry first
                rows, _claims = tier.verified_ledger()
            except TierUnavailable:
                rows = []
        if evict_all or to_low or tier.usage(rows) > tier.config.high * quota:
            target = -1 if evict_all else int(tier.config.low * quota)
            evicted = evict_lru(tier, namespaces, target, dry_run=dry_run, rows=rows)
    finally:
        for ns in namespaces:
            ns.close()
    return GcReport(
        stale, tmp_removed, ledger_fixed, old_removed, evicted, locks_removed, bad_namespaces, problems
    )


def _remove_bad_locks(ns: Namespace, dry_run: bool) -> list[str]:
    """Lock files nobody may use (a planted FIFO, hard link, symlink, someone else's file): unlinked, never
    opened. Unlinking a hard link leaves the file it points to untouched."""
    removed = []
    for name in ns.bad_locks():
        if not dry_run:
            try:
                rmtree_at(name, ns.sub(LOCKS))
            except OSError:
                continue
        removed.append(f"{ns.user}/locks/{name} (not a plain lock file of {ns.user}'s)")
    return removed


def _clean_tmp(ns: Namespace, dry_run: bool) -> list[str]:
    """tmp/ holds copies in progress (their key is locked) and leftovers of killed stagers (it is not)."""
    removed = []
    tmp = ns.sub(TMP)
    with os.scandir(tmp) as it:
        names = [e.name for e in it]
    for name in names:
        # "<key>.<gen>.<pid>.staging" (a copy) or "<key>.<gen>.evicted.<pid>" (a deletion): both under the
        # key's lock while their process lives.
        key = name.split(".", 1)[0]
        lock = ns.lock(key, blocking=False) if parse_entry_name(f"{key}.0") else None
        if lock is None and parse_entry_name(f"{key}.0"):
            continue
        try:
            if not dry_run:
                rmtree_at(name, tmp)
            removed.append(f"{ns.user}/tmp/{name}")
        except OSError:
            continue
        finally:
            if lock is not None:
                os.close(lock)
    return removed


def _fix_ledger(tier: Tier, ns: Namespace, ledger: dict, dry_run: bool) -> list[str]:
    """Pending rows of dead stagers and rows of vanished entries go; published entries without a row (an
    admin copied them in, or a crash between rename and ledger update) get one."""
    fixed = []
    entries = {e.name: e for e in ns.entries()}
    for (uid, entry), row in ledger.items():
        if uid != ns.uid:
            continue
        parsed = parse_entry_name(entry)
        if row.state == "ready" and entry in entries:
            real = ns.measure(row)
            if real is not None and row.bytes > real:  # a size claim its entry does not back
                if not dry_run:
                    tier.ledger_write(uid, entry, real, "ready")
                fixed.append(f"{ns.user}/{entry}: claimed {row.bytes} bytes, takes {real}")
            continue
        if row.state != "ready":
            if entry in entries:  # published, but killed before the ledger said so
                if not dry_run:
                    ledger_from_stamp(tier, ns, entry)
                fixed.append(f"{ns.user}/{entry}: published")
                continue
            if ns.lock_busy(parsed.key):
                continue
        if not dry_run:
            tier.ledger_remove(uid, entry)
        fixed.append(f"{ns.user}/{entry}: {'abandoned reservation' if row.state != 'ready' else 'no entry'}")
    for name in entries:
        if (ns.uid, name) not in ledger:
            if not dry_run:
                ledger_from_stamp(tier, ns, name)
            fixed.append(f"{ns.user}/{name}: missing row")
    return fixed


def _drop_old_generations(tier: Tier, ns: Namespace, dry_run: bool) -> list[str]:
    by_key: dict[str, list] = {}
    for e in ns.entries():
        by_key.setdefault(e.key, []).append(e)
    removed = []
    for key, entries in by_key.items():
        if len(entries) < 2:
            continue
        lock = ns.lock(key, blocking=False)
        if lock is None:
            continue
        try:
            held = ns.held_entries()
            newest = max(entries, key=generation)
            for e in entries:
                if e is newest or e.name in held:
                    continue
                if not dry_run and ns.remove_entry(e.name):
                    tier.ledger_remove(ns.uid, e.name)
                removed.append(f"{ns.user}/{e.name}")
        finally:
            os.close(lock)
    return removed


def _clean_locks(ns: Namespace, dry_run: bool) -> list[str]:
    """Lock files of sources with no entry and no copy in progress (taken, then unlinked, under the lock:
    a stager waiting on the old file notices and locks the new one)."""
    keys = {e.key for e in ns.entries()}
    locks = ns.sub(LOCKS)
    with os.scandir(locks) as it:
        names = [e.name for e in it if e.is_file(follow_symlinks=False)]
    removed = []
    for name in names:
        if name in keys or len(name) != 32:
            continue
        fd = ns.lock(name, blocking=False)
        if fd is None:
            continue
        try:
            if not dry_run:
                os.unlink(name, dir_fd=locks)
            removed.append(f"{ns.user}/locks/{name}")
        finally:
            os.close(fd)
    return removed


# ---- init -------------------------------------------------------------------------------------------------


def init(config: TierConfig) -> list[str]:
    """Create (or repair) a tier root: root-owned, mode 1777, with the ledger directory. Root only."""
    if os.geteuid() != 0:
        raise StuneError("`stune-stage init` must run as root (it makes a shared, root-owned directory)")
    done = []
    parent = os.path.dirname(config.root)
    if not os.path.isdir(parent):
        raise TierUnavailable("missing", f"{parent} does not exist: mount the local disk first")
    try:
        os.mkdir(config.root, 0o755)
        done.append(f"created {config.root}")
    except FileExistsError:
        pass
    st = os.lstat(config.root)
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(config.root)
    if not stat.S_ISDIR(st.st_mode):
        raise TierUnavailable("unsafe", f"{config.root} exists and is not a directory")
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o1777:
        os.chown(config.root, 0, 0)
        os.chmod(config.root, 0o1777)
        done.append(f"{config.root}: owner root, mode 1777")
    fd = open_dir(config.root, follow_symlinks=True)
    try:
        ledger = lstat_at(LEDGER, fd)
        if ledger is not None and (not stat.S_ISDIR(ledger.st_mode) or ledger.st_uid != 0):
            # made by a user before init (a planted file, FIFO or link, or a directory full of forged rows):
            # moved aside, never chowned or reused
            with Tier(config) as tier:
                qfd = tier._quarantine()
                try:
                    aside = f"{LEDGER[1:]}.{new_gen()}"
                    os.rename(LEDGER, aside, src_dir_fd=fd, dst_dir_fd=qfd)
                finally:
                    os.close(qfd)
            done.append(
                f"{config.root}/{LEDGER}: owned by uid {ledger.st_uid}, mode {ledger.st_mode:o}: "
                f"moved aside to {config.root}/{QUARANTINE}/{aside}"
            )
            ledger = None
        if ledger is None:
            os.mkdir(LEDGER, 0o755, dir_fd=fd)
            done.append(f"created {config.root}/{LEDGER}")
        lfd = open_dir(LEDGER, fd)
        try:
            st = os.fstat(lfd)
            if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o1777:
                os.chown(lfd, 0, 0)
                os.chmod(lfd, 0o1777)
                done.append(f"{config.root}/{LEDGER}: owner root, mode 1777")
        finally:
            os.close(lfd)
    finally:
        os.close(fd)
    with Tier(config) as tier:
        for bad in tier.namespace_problems():
            done.append(f"repaired {bad.problem}: {tier.repair_namespace(bad)}")
    return done


def age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    seconds = max(0, (now or time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
