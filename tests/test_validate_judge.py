"""stune-validate's judging (slurm_tune/validate/judge.py), its records and the reading of its scripts' output:
tolerances and their overrides, unsupported operators, the reference partition's samples, layer 2's band,
and garbage (byte-level fuzzing of real outputs captured here: tests/fixtures/validate)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_active_parse import mutate

from slurm_tune.errors import ConfigError
from slurm_tune.profiles import load_profile
from slurm_tune.validate import judge, scriptout
from slurm_tune.validate.agent import base_record, record_from
from slurm_tune.validate.records import valid_record, version_matrix
from slurm_tune.validate.run import tolerances

FIX = Path(__file__).parent / "fixtures" / "validate"
FP = {"driver": "550.54.14", "cuda": "12.4", "nccl": "", "hca_fw": "", "kernel": "6.1.0"}
SPEC = {"partition": "p", "seed": 7, "steps": 30, "band": 0.05}


def fixture(name: str) -> bytes:
    return (FIX / name).read_bytes()


def agent_record(layer: str, name: str) -> dict:
    status, reading, detail = scriptout.parse(fixture(name), layer)
    assert status == "done", detail
    return record_from(base_record(SPEC, layer, "n1", "42", dict(FP)), status, reading, detail)


def op(name, dtype, max_abs, scale=1.0, sample=None, status="measured", **kw) -> dict:
    return dict(
        {"op": name, "dtype": dtype, "status": status, "max_abs": max_abs, "max_rel": max_abs / scale},
        scale=scale,
        nonfinite=0,
        sample=sample if sample is not None else [0.5, -0.25],
        detail="",
        **kw,
    )


def ops_record(*ops) -> dict:
    base = base_record(SPEC, "ops", "n1", "42", dict(FP, torch="2.3.1", device="H100", backend="cuda"))
    return dict(base, ops=list(ops), detail="measured, not judged yet")


# ---- tolerances -------------------------------------------------------------------------------------------
def test_default_tolerances_by_dtype_and_an_override_of_one_operator():
    assert judge.tolerance("matmul", "fp32", {}) == (1e-6, 1e-5)
    assert judge.tolerance("matmul", "bf16", {}) == (1e-3, 1e-2)
    assert judge.tolerance("matmul", "fp16", {}) == (1e-4, 2e-3)
    assert judge.tolerance("matmul", "bf16", {"matmul.bf16": {"abs": 0.5, "rel": 0.1}}) == (0.5, 0.1)
    assert judge.tolerance("matmul", "bf16", {"matmul.bf16": {"rel": 0.1}}) == (1e-3, 0.1)  # abs kept
    r = judge.judge_ops(ops_record(op("matmul", "bf16", 0.05, scale=1.0)), {}, None)
    assert r["status"] == "fail" and r["ops"][0]["tol_rel"] == 1e-2
    loose = judge.judge_ops(
        ops_record(op("matmul", "bf16", 0.05)), {"matmul.bf16": {"abs": 0, "rel": 0.1}}, None
    )
    assert loose["status"] == "pass" and loose["ops"][0]["tol_rel"] == 0.1


def test_the_tolerance_is_relative_to_the_outputs_scale_not_element_wise():
    # a sum of 4M values off by 0.08 is 4e-8 of its scale: within fp32's 1e-5
    r = judge.judge_ops(ops_record(op("sum", "fp32", 0.08, scale=2.1e6)), {}, None)
    assert r["status"] == "pass" and r["ops"][0]["status"] == "pass"


def test_a_profile_may_override_one_part_of_a_tolerance(tmp_path):
    text = (Path(__file__).parent.parent / "partitions" / "hdr.yaml").read_text()
    (tmp_path / "hdr.yaml").write_text(text + "validate:\n  tolerances:\n    matmul.bf16: {rel: 0.02}\n")
    assert judge.tolerance("matmul", "bf16", tolerances(load_profile("hdr", tmp_path))) == (1e-3, 0.02)


def test_a_profile_tolerance_for_no_operator_of_the_suite_is_one_line_naming_the_key(tmp_path):
    text = (Path(__file__).parent.parent / "partitions" / "hdr.yaml").read_text()
    (tmp_path / "hdr.yaml").write_text(
        text + "validate:\n  tolerances:\n    matmull.bf16: {abs: 0.1, rel: 0.1}\n"
    )
    with pytest.raises(ConfigError) as exc:
        tolerances(load_profile("hdr", tmp_path))
    assert "validate.tolerances.matmull.bf16" in str(exc.value) and "\n" not in str(exc.value)
    assert "matmul" in str(exc.value)


# ---- layer 1 ----------------------------------------------------------------------------------------------
def test_a_failing_operator_names_itself_its_dtype_and_the_version_matrix():
    r = judge.judge_ops(
        ops_record(op("matmul", "fp32", 1e-7, scale=60.0), op("layer_norm", "fp32", 0.09, scale=4.5)),
        {},
        None,
    )
    assert r["status"] == "fail"
    assert [e["status"] for e in r["ops"]] == ["pass", "fail"]
    assert r["detail"].startswith("layer_norm/fp32: max abs err 0.09 (max rel 0.02)")
    for part in ("torch 2.3.1", "cuda H100", "driver=550.54.14", "kernel=6.1.0"):
        assert part in r["detail"], r["detail"]


def test_an_operator_the_backend_cannot_run_is_unsupported_never_fail():
    unsupported = {
        "op": "matmul",
        "dtype": "fp16",
        "status": "unsupported",
        "detail": "not implemented for 'Half'",
    }
    r = judge.judge_ops(ops_record(op("matmul", "fp32", 1e-7, scale=60.0), unsupported), {}, None)
    assert r["status"] == "pass" and r["ops"][1]["status"] == "unsupported"
    assert "unsupported here: matmul/fp16" in r["detail"]
    only = judge.judge_ops(ops_record(unsupported), {}, None)
    assert only["status"] == "unknown" and "no operator could run" in only["detail"]


def test_an_operator_that_raised_is_unknown_and_non_finite_output_fails():
    error = {"op": "conv2d", "dtype": "fp32", "status": "error", "detail": "RuntimeError: CUDA error: ECC"}
    r = judge.judge_ops(ops_record(op("matmul", "fp32", 1e-7, scale=60.0), error), {}, None)
    assert r["status"] == "unknown" and "conv2d/fp32: RuntimeError: CUDA error: ECC" in r["detail"]
    nan = dict(op("softmax", "fp32", 0.0), max_abs=None, max_rel=None, nonfinite=3)
    bad = judge.judge_ops(ops_record(nan), {}, None)
    assert bad["status"] == "fail" and "softmax/fp32: 3 non-finite" in bad["detail"]


def test_the_reference_partitions_sample_is_compared_within_twice_the_tolerance():
    ref = judge.judge_ops(ops_record(op("softmax", "fp32", 1e-7, sample=[0.5, 0.25])), {}, None)
    ref["node"] = "a1"
    close = ops_record(op("softmax", "fp32", 1e-7, sample=[0.5 + 1.5e-5, 0.25]))  # < 2 x (1e-7 + 1e-5)
    r = judge.judge_ops(close, {}, ref, "plain")
    assert r["status"] == "pass" and r["ops"][0]["ref"]["status"] == "pass"
    assert r["ops"][0]["ref"]["against"] == "plain" and r["detail"].endswith("match plain")
    far = ops_record(op("softmax", "fp32", 1e-7, sample=[0.5 + 1e-3, 0.25]))
    r = judge.judge_ops(far, {}, ref, "plain")
    assert r["status"] == "fail" and r["ops"][0]["ref"]["status"] == "fail"
    assert "softmax/fp32: differs from plain (node a1) by 0.001" in r["detail"]
    none = judge.judge_ops(ops_record(op("softmax", "fp32", 1e-7)), {}, None, "plain")
    assert none["status"] == "pass" and "no passing layer-1 record of plain" in none["detail"]
    other_seed = judge.judge_ops(far, {}, dict(ref, seed=8), "plain")  # other inputs: never compared
    assert other_seed["status"] == "pass" and other_seed["ops"][0]["ref"] is None
    assert "plain's layer-1 record ran seed 8, this one 7: not compared" in other_seed["detail"]


def test_the_real_cpu_suite_passes_its_own_defaults_and_matches_itself():
    r = judge.judge_ops(agent_record("ops", "opsuite-cpu.txt"), {}, None)
    assert r["status"] == "pass", r["detail"]
    assert {(e["op"], e["dtype"]) for e in r["ops"]} >= {
        ("matmul", "bf16"),
        ("layer_norm", "fp32"),
        ("sum", "fp32"),
    }
    again = judge.judge_ops(agent_record("ops", "opsuite-cpu.txt"), {}, r, "p")
    assert again["status"] == "pass" and all(e["ref"]["max_abs"] == 0 for e in again["ops"])
    assert valid_record(again) and not valid_record(
        agent_record("ops", "opsuite-cpu.txt")
    )  # raw until judged
    assert valid_record(agent_record("ops", "opsuite-cpu.txt"), raw=True)


# ---- layer 2 ----------------------------------------------------------------------------------------------
def converge(losses, **kw) -> dict:
    base = base_record(SPEC, "converge", "n1", "42", dict(FP, torch="2.3.1", device="cpu", backend="cpu"))
    return dict(base, losses=list(losses), loss_every=1, detail="measured", **kw)


CURVE = [2.0 - i * 0.05 for i in range(30)]


def test_without_a_reference_the_run_is_recorded_as_the_reference():
    r = judge.judge_converge(converge(CURVE), None, 0.05, "", recording=True)
    assert (r["status"], r["detail"], r["reference"]) == ("pass", "reference recorded", None)
    r = judge.judge_converge(converge(CURVE), None, 0.05, "plain")
    assert r["status"] == "unknown" and "no passing layer-2 run of plain" in r["detail"]


def test_within_the_band_passes_and_the_first_window_outside_fails_with_how_far():
    ref = dict(converge(CURVE), status="pass", node="a1")
    near = [x * 1.01 for x in CURVE]
    r = judge.judge_converge(converge(near), ref, 0.05, "plain")
    assert r["status"] == "pass" and r["max_dev"] == pytest.approx(0.01)
    off = CURVE[:10] + [x * 1.08 for x in CURVE[10:]]
    r = judge.judge_converge(converge(off), ref, 0.05, "plain")
    assert r["status"] == "fail" and r["max_dev"] == pytest.approx(0.08)
    assert r["detail"].startswith("loss over steps 10-19: ") and "(+8.00%, band 5.00%)" in r["detail"]
    assert r["reference"] == {"against": "plain", "node": "a1", "at": ref["at"]} and valid_record(r)


def test_a_non_finite_loss_fails_and_an_incomparable_reference_is_unknown():
    r = judge.judge_converge(converge([*CURVE[:12], None, *CURVE[13:]]), None, 0.05, "", True)
    assert r["status"] == "fail" and r["detail"] == "the loss became non-finite by step 12"
    ref = dict(converge(CURVE), steps=200)
    r = judge.judge_converge(converge(CURVE), ref, 0.05, "plain")
    assert r["status"] == "unknown" and "steps 200 vs 30" in r["detail"]


def test_the_real_training_output_reads_back_whole():
    r = agent_record("converge", "trainrun-cpu-30.txt")
    assert r["steps"] == 30 and len(r["losses"]) == 30 and r["losses"][-1] < r["losses"][0]
    assert r["cold"]["steps"] == 5 and r["steady"]["steps"] == 25 and r["peak_mem_bytes"] > 0
    assert r["peak_mem_kind"] == "process peak RSS (getrusage)" and r["fingerprint"]["backend"] == "cpu"


# ---- records and the parser's garbage ---------------------------------------------------------------------
def test_version_matrix_puts_the_software_first():
    assert version_matrix(dict(FP, torch="2.3.1", device="H100", backend="cuda", accel="12.4")) == (
        "torch 2.3.1, cuda H100 12.4, cuda=12.4, driver=550.54.14, kernel=6.1.0"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"at": math.nan},
        {"layer": "bogus"},
        {"status": "ok"},
        {"fingerprint": {"torch": 2}},
        {"ops": [{"op": "x", "dtype": "fp32", "status": "pass", "max_abs": math.inf}]},
        {"node": None},
    ],
)
def test_valid_record_refuses_what_stune_never_writes(change):
    good = judge.judge_ops(ops_record(op("matmul", "fp32", 1e-7, scale=60.0)), {}, None)
    assert valid_record(good) and not valid_record(dict(good, **change))


def test_unavailable_torch_and_missing_marker_and_nan():
    line = b'STUNE-VALIDATE {"layer":"ops","status":"unavailable","detail":"PyTorch does not import: install torch"}'
    assert scriptout.parse(b"noise\n" + line + b"\n", "ops") == (
        "unavailable",
        None,
        "PyTorch does not import: install torch",
    )
    status, _, detail = scriptout.parse(b"Traceback...\nSegmentation fault\n", "ops")
    assert status == "unknown" and "Segmentation fault" in detail
    text = fixture("opsuite-cpu.txt").replace(b'"max_abs":', b'"max_abs":NaN,"x":', 1)
    status, _, detail = scriptout.parse(text, "ops")
    assert status == "unknown" and "NaN" in detail
    assert scriptout.parse(fixture("opsuite-cpu.txt"), "converge")[0] == "unknown"  # the wrong layer's line


LAYER_OF = {"opsuite-cpu.txt": "ops", "trainrun-cpu-30.txt": "converge"}


def _sane(result) -> None:
    status, reading, detail = result
    assert status in ("done", "unknown", "unavailable") and isinstance(detail, str) and "\n" not in detail
    if status == "done":
        json.dumps(reading, allow_nan=False)  # what stune stores is JSON, with no NaN
    else:
        assert reading is None


@pytest.mark.parametrize("name", sorted(LAYER_OF))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_byte_level_fuzz_never_raises(name, data):
    _sane(scriptout.parse(mutate(data, fixture(name)), LAYER_OF[name]))


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=2048), layer=st.sampled_from(["ops", "converge"]))
def test_random_bytes_are_unknown(blob, layer):
    status, reading, _ = scriptout.parse(blob, layer)
    assert (status, reading) == ("unknown", None)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(["at", "layer", "status", "fingerprint", "ops", "losses", "band", "metrics", "node"]),
    value=JSON,
)
def test_valid_record_answers_any_json_without_raising(key, value):
    good = judge.judge_ops(ops_record(op("matmul", "fp32", 1e-7, scale=60.0)), {}, None)
    assert valid_record(dict(good, **{key: value})) in (True, False)
    assert valid_record(value) is False or isinstance(value, dict)
