"""`stune-stage gc`: reclaim what dead stagers and dead jobs left in a tier (stale holds, tmp/ copies, ledger
rows, old generations, bad lock files), then evict LRU past the high watermark.

Run as root it sees every user's namespace (always through O_NOFOLLOW descriptors, see dirfd.py); run as a
user it sees that user's own (admin.my_namespaces)."""

from __future__ import annotations

import os
from collections import namedtuple

from ..errors import StuneError
from ..safeio import rmtree_at
from ..slurm import Slurm
from .admin import ledger_or_empty, my_namespaces
from .errors import TierUnavailable
from .evict import evict_lru
from .layout import LOCKS, TMP, generation, parse_entry_name
from .namespace import Namespace
from .stager import ledger_from_stamp
from .tier import Tier

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
                    slurm = Slurm.from_env()
                alive = live_job_ids(slurm)
            except StuneError as exc:
                problems.append(f"job liveness unknown, no hold reclaimed: {exc}")
        ledger = {(r.uid, r.entry): r for r in ledger_or_empty(tier)}
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
        rows = ledger_or_empty(tier)
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
            if parsed is not None and ns.lock_busy(parsed.key):  # (a name that is no entry's has no lock)
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
