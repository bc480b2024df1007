"""Room in a tier: admitting a new copy (evicting this user's least recently used unheld entries past the
high watermark) and the LRU eviction itself, which the epilog and `stune-stage gc` run for every user."""

from __future__ import annotations

import os

from .errors import TierUnavailable
from .namespace import Namespace
from .tier import Tier
from .watch import human


def admit(
    tier: Tier,
    ns: Namespace,
    need: int,
    exclude_key: str | None = None,
    held: int = 0,
    may_evict: bool = True,
) -> int | None:
    """Make room for a copy of `need` bytes, of which `held` are already claimed in its ledger row (and so
    counted in the tier's usage), and return the bytes this copy may write. Past the high watermark, evict
    this user's least recently used unheld entries until usage plus the rest is down to the low watermark
    (other users' entries are root's to evict: the epilog and `stune-stage gc`). Raises TierUnavailable
    when the copy cannot fit. Without `may_evict`: None where it would have to evict (or would not fit
    as things stand), and nothing is evicted."""
    quota = tier.quota()
    if need > quota:
        raise TierUnavailable(
            "over-quota", f"needs {_h(need)}, more than the tier's whole quota of {_h(quota)}"
        )
    more = need - held
    usage = tier.usage()
    if usage + more > tier.config.high * quota:
        if not may_evict:
            return None
        evict_lru(tier, [ns], target=int(tier.config.low * quota) - more, exclude_key=exclude_key)
        usage = tier.usage()
    free, reserve = tier.free_bytes(), tier.reserve()
    if not may_evict and (usage + more > quota or more > free - reserve):
        return None
    if usage + more > quota:
        raise TierUnavailable(
            "over-quota",
            f"needs {_h(need)} but the tier holds {_h(usage - held)} of its "
            f"{_h(quota)} quota in entries in use or not this user's",
        )
    if more > free - reserve:
        raise TierUnavailable(
            "disk-full",
            f"needs {_h(need)} but the cache disk has {_h(free)} free, of which "
            f"{_h(reserve)} is kept in reserve",
        )
    return quota - usage + held


class Claim:
    """A directory copy's room in the tier, claimed in its ledger row (`<bytes> pending <pid>`) while the
    walk that sizes it goes on, so the copy need not wait for the whole walk.

    grow(n) claims the first n bytes walked, only where they fit as things stand: below the high
    watermark, within the quota and the disk's free space less its reserve. It never evicts, so a copy
    that turns out too big has evicted nothing. When they do not fit, it returns False and the copy waits
    for the walk's end, where settle(total) admits the whole exactly as admit() always did: it evicts
    down to the low watermark, or refuses (TierUnavailable), before another byte is copied. A total
    bigger than the whole quota is refused as soon as the walk has seen that much."""

    def __init__(self, tier: Tier, ns: Namespace, entry: str, exclude_key: str | None = None):
        self.tier, self.ns, self.entry, self.exclude_key = tier, ns, entry, exclude_key
        self.bytes = 0  # what the ledger row claims

    def grow(self, need: int) -> bool:
        if need <= self.bytes:
            return True
        if admit(self.tier, self.ns, need, self.exclude_key, held=self.bytes, may_evict=False) is None:
            return False
        self._write(need)
        return True

    def settle(self, need: int) -> int:
        """The walk is done and `need` is the copy's size: admit it (evicting if it must) and claim it
        exactly. Returns the bytes the copy may write."""
        allowance = admit(self.tier, self.ns, need, self.exclude_key, held=self.bytes)
        assert allowance is not None  # may_evict: it raises instead
        if need != self.bytes:
            self._write(need)
        return allowance

    def _write(self, need: int) -> None:
        self.tier.ledger_write(self.ns.uid, self.entry, need, f"pending {os.getpid()}")
        self.bytes = need


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
