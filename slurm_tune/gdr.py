"""When a partition's profile expects GPUDirect RDMA: one rule, read by NCCL's transport verdicts
(comm/expect.py) and the tuning-drift checks (health/drift.py: nvidia-peermem loaded, PCIe ACS off).

Plain module-level Python: the drift checks are on `stune-health check`'s path (docs/speed.md)."""

from __future__ import annotations

RDMA = ("ib", "roce")
NO_GDR_LEVELS = ("", "0", "LOC")  # NCCL_NET_GDR_LEVEL values that turn GPUDirect RDMA off


def gdr_expected(fabric, level) -> bool:
    """An RDMA fabric whose profile sets nccl.net_gdr_level to a level other than LOC (empty lets NCCL
    decide: then GPUDirect RDMA is not expected, and its absence is no finding)."""
    return str(fabric or "") in RDMA and str(level or "") not in NO_GDR_LEVELS


def profile_expects_gdr(profile) -> bool:
    return gdr_expected(profile.fabric.type, profile.nccl.net_gdr_level)
