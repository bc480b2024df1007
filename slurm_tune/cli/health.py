"""`stune-health`: node health checks and hooks."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-health"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "node health checks and hooks")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
