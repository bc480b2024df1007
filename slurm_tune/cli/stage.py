"""`stune-stage`: dataset staging to the node-local cache tier."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-stage"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "dataset staging to the node-local cache tier")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
