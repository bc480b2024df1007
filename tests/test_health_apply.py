"""Applying a verdict, as pure decisions: what to change in Slurm for each wanted state and kind of drain,
when Slurm must be asked at all, and the circuit breaker's arithmetic and ordering."""

from __future__ import annotations

import pytest

from slurm_tune.health import apply
from slurm_tune.health.result import DEGRADED, FAIL, OK, UNKNOWN, Result, make_verdict
from slurm_tune.nodestate import DEGRADED_FEATURE
from slurm_tune.slurm import Node

NOW = 1_800_000_000.0


def node(name="n1", *, drain=False, reason="", reason_time=0, features="", comment="", partitions=("hdr",)):
    return Node(
        name=name,
        state="idle",
        flags=("DRAIN",) if drain else (),
        reason=reason,
        reason_user="root",
        reason_time=reason_time,
        features=features,
        active_features=features,
        comment=comment,
        partitions=tuple(partitions),
        gres="gpu:4",
        gres_used="",
        tres="",
    )


def test_the_wanted_state_follows_the_verdict():
    down = Result("ib.link", "mlx5_2/1", FAIL, "m", "mlx5_2/1 state DOWN")
    slow = Result("ib.rate", "mlx5_3/1", DEGRADED, "m", "mlx5_3/1 rate 100 Gb/s < 200")
    blind = Result("gpu.nvml", "node", UNKNOWN, "m", "")
    assert apply.want_for(make_verdict([down, slow])) == apply.Want(apply.DRAIN, "mlx5_2/1 state DOWN")
    assert apply.want_for(make_verdict([slow, blind])) == apply.Want(
        apply.DEGRADE, "mlx5_3/1 rate 100 Gb/s < 200"
    )
    assert apply.want_for(make_verdict([blind])) == apply.Want(apply.HOLD, "")
    assert apply.want_for(make_verdict([Result("x", "y", OK, "m", "")])) == apply.Want(apply.CLEAR, "")


@pytest.mark.parametrize(
    "reason, hook_at, expected",
    [
        ("stune: mlx5_2/1 state DOWN", None, "ours"),
        ("Prolog error", NOW - 30, "hook"),  # our prolog failed just before Slurm drained
        ("Prolog error", NOW + 600, "admin"),  # Slurm's drain is older than our record: not ours
        ("Prolog error", None, "admin"),  # another hook failed: stune never failed this node
        ("Epilog error", NOW - 10, "hook"),
        ("bad DIMM, ticket 4711", NOW - 30, "admin"),
    ],
)
def test_whose_drain_it_is(reason, hook_at, expected):
    state = {"hook_fail": {"mode": "prolog", "at": hook_at}} if hook_at else {}
    assert apply.drain_kind(node(drain=True, reason=reason, reason_time=NOW), state) == expected
    assert apply.drain_kind(node(drain=False), state) == "none"


def test_drain_a_healthy_node_and_clear_stune_marks_with_it():
    n = node(features=f"bigmem,{DEGRADED_FEATURE}", comment="stune: degraded: gpu1 row remap pending")
    fields, _ = apply.plan(n, apply.Want(apply.DRAIN, "mlx5_2/1 state DOWN"), "none")
    assert fields == {
        "state": "DRAIN",
        "reason": "stune: mlx5_2/1 state DOWN",
        "features": ["bigmem"],
        "comment": "",
    }


def test_an_admin_drain_is_never_resumed_nor_re_reasoned():
    admin = node(drain=True, reason="bad DIMM, ticket 4711", features="bigmem")
    for want in (apply.Want(apply.DRAIN, "mlx5_2/1 state DOWN"), apply.Want(apply.CLEAR, "")):
        fields, notes = apply.plan(admin, want, "admin")
        assert "state" not in fields and "reason" not in fields
        assert notes == ["drained by someone else ('bad DIMM, ticket 4711'): left alone"]
    fields, _ = apply.plan(admin, apply.Want(apply.DEGRADE, "mlx5_3/1 rate 100 Gb/s < 200"), "admin")
    assert fields == {
        "features": ["bigmem", DEGRADED_FEATURE],
        "comment": "stune: degraded: mlx5_3/1 rate 100 Gb/s < 200",
    }


def test_a_hook_drain_gets_the_stune_reason_and_is_resumed_when_healthy():
    hooked = node(drain=True, reason="Prolog error")
    assert apply.plan(hooked, apply.Want(apply.DRAIN, "mlx5_2/1 state DOWN"), "hook")[0] == {
        "state": "DRAIN",
        "reason": "stune: mlx5_2/1 state DOWN",
    }
    assert apply.plan(hooked, apply.Want(apply.CLEAR, ""), "hook")[0] == {"state": "RESUME"}


def test_degraded_keeps_the_admins_features_and_healthy_removes_only_ours():
    n = node(features="bigmem,nvme")
    fields, _ = apply.plan(n, apply.Want(apply.DEGRADE, "mlx5_3/1 rate 100 Gb/s < 200"), "none")
    assert fields == {
        "features": ["bigmem", "nvme", DEGRADED_FEATURE],
        "comment": "stune: degraded: mlx5_3/1 rate 100 Gb/s < 200",
    }
    marked = node(features=f"bigmem,{DEGRADED_FEATURE},nvme", comment="stune: degraded: x")
    assert apply.plan(marked, apply.Want(apply.CLEAR, ""), "none")[0] == {
        "features": ["bigmem", "nvme"],
        "comment": "",
    }
    assert (
        apply.plan(node(features="bigmem", comment="owner: alice"), apply.Want(apply.CLEAR, ""), "none")[0]
        == {}
    )
    ours = node(drain=True, reason="stune: mlx5_2/1 state DOWN")
    assert apply.plan(ours, apply.Want(apply.DRAIN, "mlx5_2/1 state DOWN"), "ours")[0] == {}


def test_slurm_is_asked_only_when_something_changed():
    want = apply.Want(apply.DEGRADE, "mlx5_3/1 rate 100 Gb/s < 200")
    assert apply.needs_sync(want, {}, NOW) == "the verdict changed"
    state = {"applied": {"action": apply.DEGRADE, "reason": want.reason, "synced_at": NOW, "retry_at": None}}
    assert apply.needs_sync(want, state, NOW + 300) is None
    assert apply.needs_sync(want, state, NOW + apply.RESYNC_S) == "periodic re-check"
    assert apply.needs_sync(apply.Want(apply.HOLD, ""), state, NOW + 300) is None
    assert apply.needs_sync(apply.Want(apply.CLEAR, ""), state, NOW + 300) == "the verdict changed"
    state["hook_fail"] = {"mode": "prolog", "at": NOW + 100}
    assert apply.needs_sync(want, state, NOW + 300) == "the prolog failed this node"
    healthy = {"applied": {"action": apply.CLEAR, "reason": "", "synced_at": NOW, "retry_at": None}}
    assert apply.needs_sync(apply.Want(apply.CLEAR, ""), healthy, NOW + 10 * apply.RESYNC_S) is None
    held = {
        "applied": {"action": apply.DRAIN, "reason": "x", "synced_at": NOW, "retry_at": NOW + apply.RETRY_S}
    }
    assert apply.needs_sync(apply.Want(apply.DRAIN, "x"), held, NOW + 60) is None
    assert apply.needs_sync(apply.Want(apply.DRAIN, "x"), held, NOW + apply.RETRY_S) == "retrying"


@pytest.mark.parametrize(
    "members, fraction, limit",
    [(3, 0.10, 1), (10, 0.10, 1), (25, 0.10, 2), (1000, 0.10, 100), (3, 0.0, 0), (4, 0.5, 2), (0, 0.1, 0)],
)
def test_breaker_limit(members, fraction, limit):
    assert apply.breaker_limit(members, fraction) == limit


def test_the_breaker_counts_recent_stune_drains_of_the_partition_only():
    nodes = [node(f"n{i}") for i in range(1, 21)]
    nodes[0] = node("n1", drain=True, reason="stune: mlx5_0/1 state DOWN", reason_time=NOW - 60)
    nodes[1] = node(
        "n2", drain=True, reason="stune: gpu1 Xid 79", reason_time=NOW - 7200
    )  # outside the window
    nodes[2] = node("n3", drain=True, reason="bad DIMM", reason_time=NOW - 60)  # an admin's: not counted
    nodes[3] = node("n4", drain=True, reason="stune: x", reason_time=NOW - 5, partitions=("roce",))
    b = apply.breaker_check(nodes, "hdr", "n9", NOW, 3600, 0.10)
    assert (b.allowed, b.limit, b.members, b.recent) == (False, 1, 19, ["n1"])  # n4 is another partition
    assert b.message == (
        "circuit breaker open: 1 of 19 nodes in partition hdr were drained by stune within 3600s "
        "(limit 10% = 1); not draining n9"
    )
    assert apply.breaker_check(nodes, "hdr", "n9", NOW, 3600, 0.15).allowed is True  # 19 * 0.15 -> 2


def test_concurrent_drains_keep_exactly_the_first_ones_in_one_order():
    drained = [
        node(f"n{i}", drain=True, reason="stune: mlx5_9 missing", reason_time=NOW + (i > 4))
        for i in range(1, 9)
    ] + [node(f"n{i}") for i in range(9, 31)]
    verdicts = {
        n.name: apply.breaker_confirm(drained, "hdr", n.name, NOW + 3, 3600, 0.10).allowed
        for n in drained[:8]
    }
    assert [name for name, keep in verdicts.items() if keep] == ["n1", "n2", "n3"]  # limit 3 of 30


class FakeSlurm:
    """Just enough of the adapter for sync(): a node table and recorded updates."""

    def __init__(self, nodes):
        self.table = {n.name: n for n in nodes}
        self.updates = []
        self.calls = 0

    def nodes(self):
        self.calls += 1
        return list(self.table.values())

    def update_node(self, name, **fields):
        self.calls += 1
        self.updates.append((name, fields))
        n = self.table[name]
        if fields.get("state") == "DRAIN":
            n = n._replace(flags=("DRAIN",), reason=fields["reason"], reason_time=int(NOW))
        elif fields.get("state") == "RESUME":
            n = n._replace(flags=(), reason="")
        self.table[name] = n


def _profile():
    import healthkit as kit

    return kit.profile("hdr")  # drain_max_fraction 10 %: 1 of these 3 nodes


def test_sync_does_not_drain_past_the_breaker():
    fake = FakeSlurm(
        [node("n1", drain=True, reason="stune: mlx5_9 missing", reason_time=int(NOW)), node("n2"), node("n3")]
    )
    state = {}
    outcome = apply.sync(
        fake, "n2", apply.Want(apply.DRAIN, "mlx5_9 missing"), state, _profile(), NOW, sleep=lambda s: None
    )
    assert not outcome.breaker.allowed and fake.updates == [] and not fake.table["n2"].drain
    assert outcome.notes[-1].endswith("not draining n2")
    assert state["applied"] == {
        "action": apply.DRAIN,
        "reason": "mlx5_9 missing",
        "synced_at": NOW,
        "retry_at": NOW + apply.RETRY_S,
    }


@pytest.mark.parametrize("rival, kept", [("n1", False), ("n3", True)])
def test_sync_undoes_its_drain_when_a_concurrent_drain_sorts_first(rival, kept):
    fake = FakeSlurm([node("n1"), node("n2"), node("n3")])

    def settle(seconds):  # another node drains within the same second while we wait
        assert seconds == apply.BREAKER_SETTLE_S
        fake.table[rival] = node(rival, drain=True, reason="stune: mlx5_9 missing", reason_time=int(NOW))

    outcome = apply.sync(
        fake, "n2", apply.Want(apply.DRAIN, "mlx5_9 missing"), {}, _profile(), NOW, sleep=settle
    )
    assert outcome.breaker.allowed is kept and fake.table["n2"].drain is kept
    states = [fields.get("state") for _, fields in fake.updates]
    assert states == (["DRAIN"] if kept else ["DRAIN", "RESUME"])


class ResumedMeanwhile(FakeSlurm):
    """Slurm as it answers when someone resumed the node between our read and our update."""

    def update_node(self, name, **fields):
        from slurm_tune.errors import SlurmError

        if fields.get("state") == "RESUME":
            self.calls += 1
            raise SlurmError(
                ["scontrol", "update", f"NodeName={name}", "State=RESUME"],
                1,
                "slurm_update error: Invalid node state specified",
            )
        super().update_node(name, **fields)


def test_resuming_a_node_that_is_already_resumed_is_done_not_a_failure():
    fake = ResumedMeanwhile(
        [node("n1", drain=True, reason="stune: mlx5_2/1 state DOWN", features=f"bigmem,{DEGRADED_FEATURE}")]
    )
    state = {}
    outcome = apply.sync(fake, "n1", apply.Want(apply.CLEAR, ""), state, _profile(), NOW)
    assert fake.updates == [("n1", {"features": ["bigmem"]})]  # the rest still applied
    assert (
        outcome.notes[-1] == "n1 was already resumed (Slurm: Invalid node state specified): nothing to undo"
    )
    assert state["applied"]["action"] == apply.CLEAR and state["applied"]["retry_at"] is None


def test_other_slurm_errors_still_fail_the_sync():
    from slurm_tune.errors import SlurmError

    class Refusing(FakeSlurm):
        def update_node(self, name, **fields):
            raise SlurmError(["scontrol"], 1, "slurm_update error: Invalid node name specified")

    with pytest.raises(SlurmError, match="Invalid node name"):
        apply.sync(
            Refusing([node("n1", drain=True, reason="stune: x")]),
            "n1",
            apply.Want(apply.CLEAR, ""),
            {},
            _profile(),
            NOW,
        )
