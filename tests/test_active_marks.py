"""The marking path shared with the passive checks (slurm_tune.health.apply): the passive checks leave the
active checks' marks and drains alone; the active checks clear only their own."""

from __future__ import annotations

from slurm_tune.health import apply as health_apply
from slurm_tune.nodestate import ACTIVE_COMMENT, ACTIVE_DRAIN, DEGRADED_FEATURE
from slurm_tune.slurm import Node


def node(comment="", features="", reason="", drained=False):
    return Node(
        "n1",
        "idle",
        ("DRAIN",) if drained else (),
        reason,
        "",
        0,
        features,
        features,
        comment,
        ("hdr",),
        "gpu:4",
        "",
        "",
    )


def test_a_healthy_passive_verdict_keeps_the_active_mark():
    n = node(comment=ACTIVE_COMMENT + "nccl_allreduce: 70 GB/s", features=f"bigmem,{DEGRADED_FEATURE}")
    fields, notes = health_apply.plan(
        n, health_apply.Want(health_apply.CLEAR, ""), health_apply.drain_kind(n, {})
    )
    assert fields == {} and "left to them" in notes[0]
    fields, _ = health_apply.plan(
        n, health_apply.Want(health_apply.CLEAR, ""), health_apply.drain_kind(n, {}), keep_active=False
    )
    assert fields == {"features": ["bigmem"], "comment": ""}


def test_a_passive_mark_is_still_cleared_by_the_passive_checks():
    n = node(comment="stune: degraded: mlx5_3/1 rate 100 Gb/s < 200", features=DEGRADED_FEATURE)
    fields, _ = health_apply.plan(
        n, health_apply.Want(health_apply.CLEAR, ""), health_apply.drain_kind(n, {})
    )
    assert fields == {"features": [], "comment": ""}


def test_the_passive_checks_never_resume_an_active_drain():
    n = node(reason=ACTIVE_DRAIN + "ib_write_bw: slow", drained=True)
    assert health_apply.drain_kind(n, {}) == "active"
    fields, _ = health_apply.plan(n, health_apply.Want(health_apply.CLEAR, ""), "active")
    assert "state" not in fields
