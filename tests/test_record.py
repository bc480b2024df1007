"""frozen.Record: the hot paths' namedtuple stand-in must behave as the namedtuples it replaced."""

from __future__ import annotations

import pytest

from slurm_tune.frozen import Record
from slurm_tune.nodeenv.detect import Port
from slurm_tune.output import json_text
from slurm_tune.stage.spec import StageRequest


class Pair(Record):
    __slots__ = ("left", "right")


def test_record_is_a_read_only_tuple_by_value():
    p = Pair(1, right="x")
    left, right = p
    assert (left, right) == (1, "x") and p[1] == "x" and len(p) == 2
    assert p == (1, "x") and p == Pair(1, "x") and p != Pair(2, "x")
    assert {p, Pair(1, "x")} == {p} and sorted([Pair(2, "a"), p]) == [p, Pair(2, "a")]
    assert p._replace(left=5) == Pair(5, "x") and p._asdict() == {"left": 1, "right": "x"}
    with pytest.raises(AttributeError):
        p.left = 3
    with pytest.raises(TypeError):
        Pair(1)
    with pytest.raises(TypeError):
        Pair(1, 2, 3)


def test_the_replaced_records_keep_their_behaviour():
    port = Port("mlx5_0", 1, "ib0")
    assert str(port) == "mlx5_0:1" and port.netdev == "ib0"
    req = StageRequest("/data/imagenet", "IMAGENET")
    assert req.variable == "STUNE_STAGE_IMAGENET" and str(req) == "/data/imagenet:IMAGENET"
    assert (
        json_text({"req": req})
        == '{\n "req": {\n  "name": "IMAGENET",\n  "source": "/data/imagenet"\n }\n}\n'
    )


def test_the_health_records_are_frozen_records():
    """Result, Verdict and node.Settings share frozen.Record (no second record base in health/)."""
    from slurm_tune.health import result as health_result
    from slurm_tune.health.node import Settings

    r = health_result.Result(
        "ib.state", "mlx5_0/1", health_result.FAIL, "state DOWN", reason="mlx5_0/1 state DOWN"
    )
    assert health_result.Result("ib.state", "mlx5_0/1", health_result.OK, "up").reason == ""
    check, subject, status, _message, reason = r
    assert (check, subject, status, reason) == (
        "ib.state",
        "mlx5_0/1",
        health_result.FAIL,
        "mlx5_0/1 state DOWN",
    )
    assert {r, health_result.fail("ib.state", "mlx5_0/1", "state DOWN", "mlx5_0/1 state DOWN")} == {r}
    assert (
        r.as_dict()
        == r._asdict()
        == {
            "check": "ib.state",
            "subject": "mlx5_0/1",
            "status": health_result.FAIL,
            "message": "state DOWN",
            "reason": "mlx5_0/1 state DOWN",
        }
    )
    assert repr(r).startswith("Result(check='ib.state', subject='mlx5_0/1'")
    with pytest.raises(AttributeError):
        r.status = health_result.OK
    v = health_result.make_verdict([r, health_result.ok("gpu.ecc", "gpu0", "no errors")])
    assert v == health_result.Verdict(
        status=health_result.FAIL, results=v.results, reason="mlx5_0/1 state DOWN"
    )
    assert json_text(v).count('"check"') == 2
    s = Settings(
        node="n1", partition=None, root="/", state_dir="/s", gpu_snapshot=None, prom_path=None, json_path=None
    )
    assert s._replace(partition="vpc").partition == "vpc" and s.partition is None
    with pytest.raises(TypeError):
        Settings("n1", None, "/")


def test_a_probe_result_is_a_frozen_record():
    from slurm_tune.hw.deadline import OK, ProbeResult, run_probe

    result = run_probe("answer", lambda partial: 42, 5.0)
    name, status, value, _elapsed, message, reader = result
    assert (name, status, value, message, reader) == ("answer", OK, 42, "", "") and result.answered
    assert result == ProbeResult("answer", OK, 42, result.elapsed_s, "")
    assert repr(result).startswith("ProbeResult(name='answer', status='ok', value=42, elapsed_s=")
    with pytest.raises(AttributeError):
        result.status = "error"
