"""Room in a tier: admitting a new copy (evicting this user's least recently used unheld entries past the
high watermark) and the LRU eviction itself, which the epilog and `stune-stage gc` run for every user."""

from __future__ import annotations

import os

from .errors import TierUnavailable
from .namespace import Namespace
from .tier import Tier
from .watch import human


def admit(tier: Tier, ns: Namespace, need: int, exclude_key: str | None = None) -> int:
    """Make room for `need` bytes and return the bytes this copy may write. Past the high watermark,
    evict this user's least recently used unheld entries until usage + need is down to the low watermark
    (other users' entries are root's to evict: the epilog and `stune-stage gc`). Raises TierUnavailable
    when the entry cannot fit."""
    quota = tier.quota()
    if need > quota:
        raise TierUnavailable(
            "over-quota", f"needs {_h(need)}, more than the tier's whole quota of {_h(quota)}"
        )
    usage = tier.usage()
    if usage + need > tier.config.high * quota:
        evict_lru(tier, [ns], target=int(tier.config.low * quota) - need, exclude_key=exclude_key)
        usage = tier.usage()
    if usage + need > quota:
        raise TierUnavailable(
            "over-quota",
            f"needs {_h(need)} but the tier holds {_h(usage)} of its "
            f"{_h(quota)} quota in entries in use or not this user's",
        )
    free, reserve = tier.free_bytes(), tier.reserve()
    if need > free - reserve:
        raise TierUnavailable(
            "disk-full",
            f"needs {_h(need)} but the cache disk has {_h(free)} free, of which "
            f"{_h(reserve)} is kept in reserve",
        )
    return quota - usage


def evict_lru(
    tier: Tier,
    namespaces: list[Namespace],
    target: int,
    exclude_key: str | None = None,
    dry_run: bool = False,
    rows=None,
) -> list[tuple[str, str, int]]:
    """Delete unheld entries of `namespaces`, least recently used first, until the tier's usage is at most
    `target`. Entries being staged or checked right now (their key lock is busy) are skipped. Returns the
    (user, entry, bytes) evicted."""
    rows = {(r.uid, r.entry): r for r in (tier.ledger() if rows is None else rows)}
    usage = tier.usage(list(rows.values()))
    candidates = []
    for ns in namespaces:
        try:
            held = ns.held_entries()
            entries = ns.entries()
        except (TierUnavailable, OSError):  # a namespace its owner broke: not ours to fix here
            continue
        for entry in entries:
            row = rows.get((ns.uid, entry.name))
            if entry.name in held or entry.key == exclude_key:
                continue
            candidates.append((row.last_use if row else 0.0, ns, entry, row.bytes if row else 0))
    evicted = []
    for _last_use, ns, entry, nbytes in sorted(candidates, key=lambda c: c[0]):
        if usage <= target:
            break
        try:
            lock = ns.lock(entry.key, blocking=False)
        except TierUnavailable:  # a lock file its user broke (gc removes it): skip, evict the others
            continue
        if lock is None:
            continue
        try:
            if entry.name in ns.held_entries():  # a hold taken since we looked
                continue
            if not dry_run:
                if not ns.remove_entry(entry.name):
                    continue
                tier.ledger_remove(ns.uid, entry.name)
        finally:
            os.close(lock)
        usage -= nbytes
        evicted.append((ns.user, entry.name, nbytes))
    return evicted


def _h(n: int) -> str:
    return human(n)
