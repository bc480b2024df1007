"""The remediation ladder as `stune-health run` takes it (health/ladder.py), on one node with a stand-in for
the Slurm adapter (incidentkit.StandInSlurm) and a stand-in GPU reset command that records its calls: each
step once, in order, only on stune's own drain of an idle node, and a drain for repair at the end. The same
story against real Slurm: tests/test_incidents_cluster.py."""

from __future__ import annotations

import incidentkit as ik
import pytest

from slurm_tune.health import state as health_state


def ladder(tmp_path, monkeypatch, extra: str = "", **recorder):
    yaml, log = ik.reset_recorder(tmp_path, **recorder)
    world = ik.World(tmp_path, monkeypatch, profile_yaml="remediation:\n  enabled: true\n" + yaml + extra)
    return world, log


def xid_message(doc) -> str:
    return next(r["message"] for r in doc["results"] if r["check"] == "gpu.xid" and r["status"] == "fail")


def steps(world) -> list:
    st, _ = health_state.read(world.env["STUNE_STATE_DIR"])
    return [(s["step"], s["ok"]) for s in st.get("ladder", {}).get("steps", [])]


def test_a_reset_that_does_not_clear_a_recurring_xid_leads_to_one_reboot_then_a_drain(tmp_path, monkeypatch):
    world, resets = ladder(tmp_path, monkeypatch)
    assert world.run()[1]["status"] == "ok"
    world.xid(48, text="DBE (double bit error) ECC error")
    code, doc = world.run()
    assert (code, doc["status"], doc["reason"]) == (0, "fail", "gpu2 Xid 48")
    assert world.slurm.state["n1"]["reason"] == "stune: gpu2 Xid 48"  # drained (the breaker let it)
    # the same run: the node is stune's drain and idle, so the GPU is reset
    assert resets.read_text() == "0000:47:00.0\n" and steps(world) == [("reset", True)]
    assert doc["remediation"]["note"].startswith("remediation: GPU reset done")
    _code, doc = world.run()  # the reset released it: judged healthy again, resumed
    assert doc["status"] == "ok" and "DRAIN" not in world.slurm.state["n1"]["flags"]
    world.xid(48)  # a job hits it again
    _code, doc = world.run()
    assert doc["reason"] == "gpu2 Xid 48"
    assert "again after the GPU reset" in xid_message(doc)
    reboots = [c for c in world.slurm.calls if c[0] == "reboot_node"]
    assert reboots == [("reboot_node", "n1", "stune: reboot: gpu2 Xid 48", True, "RESUME")]
    assert resets.read_text().count("\n") == 1 and steps(world) == [("reset", True), ("reboot", True)]
    for _ in range(2):  # until it reboots, the node is Slurm's: no call at all
        _code, doc = world.run()
        assert doc["status"] == "fail" and world.new_calls == [] and doc["action"] == "hold"
    world.reboot("boot-2")
    assert world.run()[1]["status"] == "ok"
    world.xid(48)
    _code, doc = world.run()
    assert doc["reason"].startswith("repair: gpu2 Xid 48 x3 after reset ") and ", reboot " in doc["reason"]
    assert world.slurm.state["n1"]["reason"] == "stune: " + doc["reason"]
    assert [c for c in world.slurm.calls if c[0] == "reboot_node"] == reboots  # one reboot, ever
    assert resets.read_text().count("\n") == 1  # one reset, ever
    world.xid(48, 5)
    for _ in range(2):
        _code, doc = world.run()
        assert doc["reason"].startswith("repair: gpu2 Xid 48 x3 ") and world.new_calls == []
    log = (tmp_path / "state" / "health.log").read_text()
    assert "remediation: GPU reset done" in log and "remediation: reboot request done" in log


def test_xid_79_goes_straight_to_a_reboot(tmp_path, monkeypatch):
    world, resets = ladder(tmp_path, monkeypatch)
    world.run()
    world.xid(79, 3)
    _code, doc = world.run()
    assert doc["reason"] == "gpu2 Xid 79" and not resets.exists()
    assert [c[0] for c in world.slurm.calls].count("reboot_node") == 1


def test_no_step_on_an_admins_drain(tmp_path, monkeypatch):
    world, resets = ladder(tmp_path, monkeypatch)
    world.run()
    world.slurm.update_node("n1", state="DRAIN", reason="bad DIMM, ticket 4711")
    world.xid(48)
    for _ in range(2):
        _code, doc = world.run()
        assert doc["status"] == "fail" and not resets.exists()
        assert "waits: the node is under someone else's drain ('bad DIMM" in doc["remediation"]["note"]
    assert world.slurm.state["n1"]["reason"] == "bad DIMM, ticket 4711"
    assert not [c for c in world.slurm.calls if c[0] == "reboot_node"]


def test_no_reset_while_jobs_run_nor_while_the_node_fails_otherwise(tmp_path, monkeypatch):
    world, resets = ladder(tmp_path, monkeypatch)
    world.run()
    world.slurm.state["n1"]["base"] = "mixed"  # a job still runs there: the drain waits for it
    world.xid(48)
    _code, doc = world.run()
    assert world.slurm.state["n1"]["reason"] == "stune: gpu2 Xid 48"
    assert "waits: jobs still run on the node (mixed)" in doc["remediation"]["note"] and not resets.exists()
    world.slurm.state["n1"]["base"] = "idle"
    port = world.root / "sys/class/infiniband/mlx5_2/ports/1"
    (port / "state").write_text("1: DOWN\n")
    _code, doc = world.run()
    assert "waits: the node also fails ib.link (mlx5_2/1 state DOWN)" in doc["remediation"]["note"]
    assert not resets.exists()
    (port / "state").write_text("4: ACTIVE\n")
    _code, doc = world.run()
    assert resets.read_text() == "0000:47:00.0\n" and steps(world) == [("reset", True)]


def test_a_breaker_that_holds_the_drain_back_holds_the_ladder_back(tmp_path, monkeypatch):
    world, resets = ladder(tmp_path, monkeypatch)
    world.run()
    for other in ("n2", "n3"):  # 10 % of 3 nodes is one: another stune drain fills it
        world.slurm.update_node(other, state="DRAIN", reason="stune: mlx5_0/1 state DOWN")
    world.xid(48)
    code, doc = world.run()
    assert code == 7 and doc["breaker"]["open"] and "DRAIN" not in world.slurm.state["n1"]["flags"]
    assert not resets.exists() and "remediation" not in doc


@pytest.mark.parametrize(
    "recorder, said",
    [({"exit_code": 3}, "exited 3: GPU reset stand-in: exit 3"), ({"sleep": 30}, "did not finish within 1s")],
)
def test_a_reset_that_fails_or_hangs_is_a_failed_step_and_the_reboot_comes_next(
    tmp_path, monkeypatch, recorder, said
):
    world, _resets = ladder(tmp_path, monkeypatch, "  reset_timeout: 1\n", **recorder)
    world.run()
    world.xid(48)
    _code, doc = world.run()
    assert doc["remediation"]["ok"] is False and said in doc["remediation"]["note"]
    assert steps(world) == [("reset", False)]
    _code, doc = world.run()  # still held: the next step
    assert [c[0] for c in world.new_calls].count("reboot_node") == 1
    assert steps(world) == [("reset", False), ("reboot", True)]


def test_a_failed_reboot_request_means_a_drain_for_repair(tmp_path, monkeypatch):
    from slurm_tune.errors import SlurmError

    world, _ = ladder(tmp_path, monkeypatch, "  reset: false\n")

    def refused(node, reason, **kw):
        raise SlurmError(["scontrol", "reboot"], 1, "RebootProgram isn't defined")

    world.slurm.reboot_node = refused
    world.run()
    world.xid(48)
    _code, doc = world.run()
    assert doc["remediation"]["ok"] is False and "RebootProgram isn't defined" in doc["remediation"]["note"]
    _code, doc = world.run()
    assert doc["reason"] == "repair: gpu2 Xid 48 x1 after reboot " + doc["reason"].split("after reboot ")[1]
    assert doc["reason"].endswith(" failed")


def test_without_the_opt_in_nothing_is_tried(tmp_path, monkeypatch):
    world = ik.World(tmp_path, monkeypatch)
    world.run()
    world.xid(48)
    _code, doc = world.run()
    assert doc["reason"] == "gpu2 Xid 48" and "remediation" not in doc
    assert not [c for c in world.slurm.calls if c[0] in ("reboot_node", "node")]
