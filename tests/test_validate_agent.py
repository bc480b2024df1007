"""stune-validate's scripts run for real with this venv's PyTorch (CPU), and its agent as a job runs it: the
seeded suite is the same bytes every time, an operator the backend cannot run is unsupported, a missing or
torch-less interpreter is unavailable, a script past its deadline is unknown, and the perturbed platform
(tests/validate_standins: layer norm 2% off) fails layer 1 on layer_norm alone and layer 2 outside the band."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from slurm_tune.validate import judge, opsuite, trainrun
from slurm_tune.validate.agent import RECORD_MARK, run_spec
from slurm_tune.validate.records import valid_record

REPO = Path(__file__).resolve().parent.parent
PERTURBED = REPO / "tests" / "validate_standins" / "python-perturbed"


def spec(**kw) -> dict:
    return dict(
        {
            "partition": "p",
            "layers": ["ops", "converge"],
            "python": sys.executable,
            "python_from": "validate.python",
            "seed": 20240601,
            "steps": 60,
            "cold_steps": 5,
            "band": 0.005,
            "accelerator": "nvidia",
            "timeouts": {"ops": 120, "converge": 120},
        },
        **kw,
    )


def agent(s: dict, **env) -> dict:
    lines: list[str] = []
    assert run_spec(s, emit=lines.append, environ=dict(SLURMD_NODENAME="n1", SLURM_JOB_ID="7", **env)) == 0
    records = [json.loads(line[len(RECORD_MARK) :]) for line in lines]
    assert [r["layer"] for r in records] == s["layers"] and all(valid_record(r, raw=True) for r in records)
    return {r["layer"]: r for r in records}


def test_the_suite_runs_every_operator_on_the_cpu_the_same_way_twice():
    started = time.monotonic()
    a = opsuite.run(5)
    assert time.monotonic() - started < 30  # a few seconds here; the budget is 60 s per device
    b = opsuite.run(5)
    assert a["backend"] == "cpu" and all(e["status"] == "ok" for e in a["ops"])
    assert [(e["op"], e["dtype"]) for e in a["ops"]] == [
        ("matmul", "fp32"),
        ("matmul", "bf16"),
        ("matmul", "fp16"),
        ("softmax", "fp32"),
        ("layer_norm", "fp32"),
        ("attention", "fp32"),
        ("conv2d", "fp32"),
        ("sum", "fp32"),
        ("mean", "fp32"),
    ]
    assert [e["sample"] for e in a["ops"]] == [e["sample"] for e in b["ops"]]  # inputs from the seed
    assert len(a["ops"][0]["sample"]) == opsuite.SAMPLE and len(a["ops"][-1]["sample"]) == 1
    assert opsuite.run(6)["ops"][0]["sample"] != a["ops"][0]["sample"]


def test_an_operator_the_backend_cannot_run_is_unsupported(monkeypatch):
    import torch

    real = torch.matmul

    def matmul(x, y):
        if x.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return real(x, y)

    monkeypatch.setattr(torch, "matmul", matmul)
    out = opsuite.run(5)
    fp16 = next(e for e in out["ops"] if e["dtype"] == "fp16")
    assert fp16 == {
        "op": "matmul",
        "dtype": "fp16",
        "status": "unsupported",
        "detail": "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
    }
    assert all(e["status"] == "ok" for e in out["ops"] if e is not fp16)


def test_the_training_run_learns_and_times_cold_and_steady_apart():
    out = trainrun.run(3, steps=40, cold_steps=4)
    assert out["steps"] == 40 and len(out["losses"]) == 40 and out["losses"][-1] < 0.7 * out["losses"][0]
    assert out["cold"]["steps"] == 4 and out["steady"]["steps"] == 36 and out["steady"]["steps_per_s"] > 0
    assert out["peak_mem_kind"] == "process peak RSS (getrusage)" and out["peak_mem_bytes"] > 10 << 20
    assert trainrun.run(3, steps=40, cold_steps=4)["losses"] == out["losses"]


def test_the_agent_runs_both_layers_through_the_nodes_interpreter():
    r = agent(spec())
    ops, conv = r["ops"], r["converge"]
    assert ops["node"] == "n1" and ops["job"] == "7" and ops["status"] == "unknown"  # judged by `run`
    assert ops["fingerprint"]["backend"] == "cpu" and ops["fingerprint"]["torch"].startswith("2.")
    assert "kernel" in ops["fingerprint"] and all(e["status"] == "measured" for e in ops["ops"])
    assert len(conv["losses"]) == 60 and conv["band"] == 0.005 and conv["cold"]["steps"] == 5
    assert judge.judge_ops(ops, {}, None)["status"] == "pass"


def test_the_perturbed_platform_fails_layer_norm_only_and_leaves_the_band():
    plain = agent(spec())
    ref_ops = judge.judge_ops(plain["ops"], {}, None)
    ref_conv = judge.judge_converge(plain["converge"], None, 0.005, "", recording=True)
    assert (ref_ops["status"], ref_conv["detail"]) == ("pass", "reference recorded")
    bad = agent(spec(python=str(PERTURBED)))
    ops = judge.judge_ops(bad["ops"], {}, ref_ops, "plain")
    assert ops["status"] == "fail"
    assert {f"{e['op']}/{e['dtype']}": e["status"] for e in ops["ops"] if e["status"] != "pass"} == {
        "layer_norm/fp32": "fail"
    }
    assert ops["detail"].startswith("layer_norm/fp32: max abs err") and "torch 2." in ops["detail"]
    conv = judge.judge_converge(bad["converge"], ref_conv, 0.005, "plain")
    assert (
        conv["status"] == "fail" and conv["detail"].startswith("loss over steps ") and conv["max_dev"] > 0.005
    )


def test_a_missing_interpreter_or_one_without_torch_is_unavailable(tmp_path):
    r = agent(spec(python=str(tmp_path / "nope"), python_from="validate.python"))
    assert (
        r["ops"]["status"] == "unavailable" and "(validate.python) is not an executable" in r["ops"]["detail"]
    )
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('No module named torch')\n")
    wrapper = tmp_path / "python-no-torch"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shadow} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    r = agent(spec(python=str(wrapper)))
    for layer in ("ops", "converge"):
        assert r[layer]["status"] == "unavailable" and "install torch" in r[layer]["detail"], r[layer]


def test_a_script_past_its_deadline_is_unknown():
    r = agent(spec(layers=["ops"], timeouts={"ops": 1, "converge": 1}))
    assert (
        r["ops"]["status"] == "unknown"
        and r["ops"]["detail"] == "the ops script was killed at its deadline (1s)"
    )


@pytest.mark.parametrize("layer", ["ops", "converge"])
def test_the_scripts_run_by_path_print_one_marked_line(layer, tmp_path):
    import subprocess

    script = {"ops": opsuite.__file__, "converge": trainrun.__file__}[layer]
    argv = [sys.executable, "-I", script, "--seed", "1", "--json"] + (
        ["--steps", "12"] if layer == "converge" else []
    )
    out = subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=120)
    marked = [line for line in out.stdout.splitlines() if line.startswith(b"STUNE-VALIDATE ")]
    assert (
        out.returncode == 0 and len(marked) == 1 and json.loads(marked[0].split(b" ", 1)[1])["layer"] == layer
    )
