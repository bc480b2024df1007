"""Tier maintenance for admins and the epilog: list, status, release a job's holds, init (gc.py:
garbage-collect).

Run as root these see every user's namespace (always through O_NOFOLLOW descriptors, see dirfd.py); run as
a user they see that user's own.
"""

from __future__ import annotations

import os
import stat
import time
from collections import namedtuple

from ..errors import StuneError
from ..profiles import PROFILE_SCHEMA, load_profile, load_profiles
from ..safeio import lstat_at
from ..schema import Where
from .dirfd import open_dir
from .errors import TierUnavailable
from .evict import evict_lru
from .layout import LEDGER, QUARANTINE, generation, new_gen
from .namespace import Namespace
from .tier import Tier, TierConfig


def tiers_for(
    partition: str | None, node: str | None, path: str | None = None
) -> list[tuple[str, TierConfig]]:
    """(partitions, tier) for each distinct tier: one partition's, an explicit --path, or every profile's."""
    if path:  # no profile: the built-in cache defaults (every cache key has one)
        cache = PROFILE_SCHEMA.fields["cache"].complete({}, "cache", Where("(the built-in cache defaults)"))
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
    rows = {(r.uid, r.entry): r for r in ledger_or_empty(tier)}
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


def ledger_or_empty(tier: Tier):
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
        _ = tier.fd  # opening the tier's directory is what says whether it is there
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
        done.extend(
            f"repaired {bad.problem}: {tier.repair_namespace(bad)}" for bad in tier.namespace_problems()
        )
    return done


def age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    seconds = max(0, (now or time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
