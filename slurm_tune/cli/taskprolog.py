"""`stune-task-prolog`: TaskProlog: per-node NCCL variables and dataset staging."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-task-prolog"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "TaskProlog: per-node NCCL variables and dataset staging")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
