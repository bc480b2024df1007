"""What every copy reports and watches: its progress lines (Progress) and the tier's free space and the
copy's byte allowance (Guard), checked every TICK_S; and sizes in words (human)."""

from __future__ import annotations

import os
import time

from ..streams import say
from .errors import TierUnavailable

TICK_S = 0.5  # progress and disk-space cadence; the last worker's exit wakes the stager at once


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """Progress lines for a long copy: the first after `delay` seconds, then one every `every` seconds, and
    a last one when done. Short copies print nothing."""

    def __init__(
        self,
        stream,
        label: str,
        total_bytes: int,
        total_files: int | None = None,
        delay: float = 2.0,
        every: float = 10.0,
    ):
        self.stream, self.label = stream, label
        self.total_bytes, self.total_files = total_bytes, total_files
        self.start = time.monotonic()
        self.next = self.start + delay
        self.every = every
        self.printed = False

    def update(self, done_bytes: int, done_files: int | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if self.stream is None or (now < self.next and not force):
            return
        self.next = now + self.every
        elapsed = max(now - self.start, 1e-6)
        rate = done_bytes / elapsed
        parts = [f"{human(done_bytes)}"]
        if self.total_bytes:
            parts[0] += f" / {human(self.total_bytes)} ({100 * done_bytes / self.total_bytes:.0f}%)"
        if self.total_files:
            parts.append(f"{done_files or 0:,} / {self.total_files:,} files")
        parts.append(f"{human(rate)}/s")
        if self.total_bytes and rate > 0 and done_bytes < self.total_bytes:
            parts.append(f"ETA {max(0, (self.total_bytes - done_bytes) / rate):.0f}s")
        self.emit(f"{self.label}: {', '.join(parts)}")
        self.printed = True

    def emit(self, line: str) -> None:
        if self.stream is not None and not say(self.stream, f"stune-stage: {line}"):
            self.stream = None  # a closed job log must not fail the copy

    def sized(self, total_bytes: int, total_files: int | None = None) -> None:
        """The totals, once known (a tree's walk ends after its copy has started)."""
        self.total_bytes, self.total_files = total_bytes, total_files

    def done(self, done_bytes: int, done_files: int | None = None) -> None:
        if self.printed:
            self.update(done_bytes, done_files, force=True)


class Guard:
    """Stops a copy before it overfills the tier: the filesystem keeps `reserve` bytes free (the rule in
    tier.reserve_bytes, which admission applies too), and the copy writes at most `allowance` bytes
    (statvfs deltas: cheap, and conservative when others write too)."""

    def __init__(self, path: str, allowance: int | None, reserve: int = 0):
        self.path, self.allowance, self.reserve = path, allowance, reserve
        self.free_at_start = self._free()

    def _free(self) -> int:
        vfs = os.statvfs(self.path)
        return vfs.f_bavail * vfs.f_frsize

    def check(self) -> None:
        free = self._free()
        if free < self.reserve:
            raise TierUnavailable(
                "disk-full",
                f"the cache disk is full ({human(free)} left, {human(self.reserve)} is kept in reserve)",
            )
        if self.allowance is not None and self.free_at_start - free > self.allowance:
            raise TierUnavailable(
                "over-quota", f"the copy outgrew its quota allowance of {human(self.allowance)}"
            )
