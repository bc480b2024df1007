"""`stune-gpu-sampler`: per-node GPU utilization sampler daemon."""
from __future__ import annotations

from .common import guarded, not_implemented

PROG = "stune-gpu-sampler"


def _main(argv: list[str]) -> int:
    return not_implemented(PROG, "per-node GPU utilization sampler daemon")


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
