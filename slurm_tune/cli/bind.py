"""`stune-bind`: run a command bound to its GPU's NUMA node."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-bind"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "run a command bound to its GPU's NUMA node")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
