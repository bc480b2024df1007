"""`stune-fairshare`: GPU-utilization fair-share accountant."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-fairshare"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "GPU-utilization fair-share accountant")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
