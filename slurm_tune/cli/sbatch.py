"""`stune-sbatch`: drop-in sbatch with per-partition NCCL settings."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-sbatch"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "drop-in sbatch with per-partition NCCL settings")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
