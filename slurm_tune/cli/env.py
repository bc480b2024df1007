"""`stune-env`: NCCL variables for eval on sites without the TaskProlog."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-env"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "NCCL variables for eval on sites without the TaskProlog")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
