"""The acceptance page (`stune-validate status -p P`): runs, correct, fast and stable from synthetic records, each
pass / fail / pending / attention with its reason."""

from __future__ import annotations

import json
import time

import comparekit as kit
import pytest

from slurm_tune.active import acceptance
from slurm_tune.cli import validate
from slurm_tune.profiles import load_profile

NOW = time.time()
WINDOW = 30 * 86400
NODES = [f"n{i}" for i in range(1, 7)]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiles")
    for f in (kit.REPO / "partitions").glob("*.yaml"):
        (d / f.name).write_text(f.read_text())
    with open(d / "hdr.yaml", "a") as fh:
        fh.write(
            "active:\n  checks:\n    nccl_allreduce: {}\n    disk_read: {}\nvalidate:\n  reference: ascend\n"
        )
    return load_profile("hdr", d)


def page(profile, results=(), validate=(), scaling=(), reference=None):
    return acceptance.page(
        profile, "hdr", NOW, WINDOW, list(results), list(validate), list(scaling), reference
    )


def healthy(**kw):
    return kit.sweeps("hdr", NODES, {"nccl_allreduce": 100.0, "disk_read": 2.0}, NOW - 20000, **kw)


def layers(ops_status="pass", converge_status="pass", bad_op=None):
    out = []
    for node in NODES:
        ops = [kit.op("matmul", "bf16"), kit.op("layernorm", "fp32")]
        status = "pass"
        if node == "n2" and bad_op:
            ops.append(bad_op)
            status = "fail"
        out.append(
            kit.validate(
                "hdr", "ops", node, status if ops_status == "pass" else ops_status, NOW - 500, ops=ops
            )
        )
        out.append(kit.validate("hdr", "converge", node, converge_status, NOW - 400, max_dev=0.01, band=0.05))
    return out


def test_nothing_stored_is_pending_everywhere(profile):
    p = page(profile)
    assert {k: s["state"] for k, s in p["stages"].items()} == dict.fromkeys(
        ("runs", "correct", "fast", "stable"), "pending"
    )
    assert (
        p["state"] == "pending"
        and "no check or validation job stored a result" in p["stages"]["runs"]["reason"]
    )
    assert "layer 1 (operator alignment) not measured yet" in p["stages"]["correct"]["reason"]


def test_a_healthy_partition_passes_every_stage(profile):
    p = page(profile, healthy(), layers(), [kit.curve("hdr", "nodes", {1: 1.0, 2: 0.97, 4: 0.93}, NOW - 100)])
    states = {k: s["state"] for k, s in p["stages"].items()}
    assert states == dict.fromkeys(("runs", "correct", "fast", "stable"), "pass"), p["stages"]
    assert "layer 3 (training) not reported" in p["stages"]["correct"]["reason"]
    assert "3 sweeps, outlier share median 0.0%" in p["stages"]["stable"]["reason"]
    assert {b["check"] for b in p["stages"]["fast"]["baselines"]} == {"nccl_allreduce", "disk_read"}
    text = acceptance.text(p)
    assert (
        text.startswith("partition hdr: pass")
        and "RUNS" in text
        and "scaling nodes (nccl_allreduce): pass" in text
    )
    json.dumps(p)  # the page is its JSON


def test_runs_fail_when_nothing_was_measured_and_attention_for_a_silent_check(profile):
    unknown = [
        kit.result("hdr", "nccl_allreduce", n, None, NOW - 100 + i, status="unknown")
        for i, n in enumerate(NODES)
    ]
    unknown[-1]["detail"] = "job not started before its deadline"
    p = page(profile, unknown)
    assert p["stages"]["runs"]["state"] == "fail" and "none measured" in p["stages"]["runs"]["reason"]
    assert "job not started before its deadline" in p["stages"]["runs"]["reason"]
    only_nccl = kit.sweeps("hdr", NODES, {"nccl_allreduce": 100.0}, NOW - 20000)
    runs = page(profile, only_nccl)["stages"]["runs"]
    assert (
        runs["state"] == "attention" and "without a measurement in the last 30d: disk_read" in runs["reason"]
    )


def test_a_failing_operator_is_named_and_fails_correct(profile):
    bad = kit.op("softmax", "fp16", "fail", max_rel=0.25, tol_rel=0.01)
    c = page(profile, healthy(), layers(bad_op=bad))["stages"]["correct"]
    assert c["state"] == "fail"
    assert (
        "1 of 6 node(s) fail (n2)" in c["reason"]
        and "softmax.fp16 on n2: max rel error 0.25 (tolerance 0.01)" in c["reason"]
    )
    assert c["layers"]["ops"]["worst"]["op"] == "softmax"


def test_correct_pending_attention_and_training_verdict(profile):
    only_ops = [r for r in layers() if r["layer"] == "ops"]
    c = page(profile, healthy(), only_ops)["stages"]["correct"]
    assert c["state"] == "pending" and "layer 2 (convergence) not measured yet" in c["reason"]
    unsure = layers(converge_status="unknown")
    unsure[1]["detail"] = "loss is NaN at step 3"
    c = page(profile, healthy(), unsure)["stages"]["correct"]
    assert c["state"] == "attention" and "6 of 6 node(s) unknown (loss is NaN at step 3)" in c["reason"]
    diverged = layers(converge_status="fail")
    diverged[3]["max_dev"] = 0.4
    c = page(profile, healthy(), diverged)["stages"]["correct"]
    assert c["state"] == "fail" and "loss off the reference by 0.4 (band 0.05) on n2" in c["reason"]
    user = kit.validate(
        "hdr",
        "training",
        "n1",
        "fail",
        NOW - 10,
        verdict="diverged",
        note="loss spikes at 3k steps",
        by="alice",
    )
    c = page(profile, healthy(), [*layers(), user])["stages"]["correct"]
    assert (
        c["state"] == "fail"
        and "layer 3 (training): diverged by alice (loss spikes at 3k steps)" in c["reason"]
    )


def test_an_outlier_makes_fast_attention(profile):
    f = page(profile, healthy(slow={"n4"}), layers())["stages"]["fast"]
    assert (
        f["state"] == "attention" and "2 outlier(s) now: n4 (disk_read), n4 (nccl_allreduce)" in f["reason"]
    )
    assert f["outliers"][0]["subject"] == "n4"


def test_knee_and_failed_scaling_and_missing_baseline(profile):
    knee = {
        "n": 8,
        "efficiency": 0.62,
        "nodes_added": ["n7", "n8"],
        "switches": 2,
        "pairs": [],
        "why": "crosses a spine",
    }
    curve = kit.curve("hdr", "nodes", {1: 1.0, 4: 0.9, 8: 0.62}, NOW - 100, "knee", knee)
    p = page(profile, healthy(), layers(), [curve])
    f = p["stages"]["fast"]
    assert (
        f["state"] == "attention"
        and "multi-node scaling has a knee at n=8 (efficiency 0.62: crosses a spine)" in f["reason"]
    )
    assert (
        "scaling nodes (nccl_allreduce): knee, knee at n=8; efficiency 1:1.0 4:0.9 8:0.62"
        in acceptance.text(p)
    )
    failed = kit.curve("hdr", "node", {1: 1.0, 8: 0.3}, NOW - 90, "fail")
    assert page(profile, healthy(), layers(), [failed])["stages"]["fast"]["state"] == "fail"
    two = kit.sweeps("hdr", ["n1", "n2"], {"nccl_allreduce": 100.0, "disk_read": 2.0}, NOW - 20000)
    f = page(profile, two, layers())["stages"]["fast"]
    assert (
        f["state"] == "pending"
        and "no baseline yet for disk_read: 2 subject(s) under its fingerprint, need 3" in f["reason"]
    )


def test_stable_pending_fail_and_version_change(profile):
    s = page(profile, kit.sweeps("hdr", NODES, {"nccl_allreduce": 100.0}, NOW - 9000, n_sweeps=2))["stages"][
        "stable"
    ]
    assert s["state"] == "pending" and "2 sweep(s) in the window; stability needs 3" in s["reason"]
    s = page(profile, healthy(slow={"n4"}))["stages"]["stable"]
    assert s["state"] == "fail" and "each of the last 3 sweeps had over 10%" in s["reason"]
    assert [w["outliers"] for w in s["sweeps"]] == [2, 2, 2] and s["sweeps"][0]["subjects"] == 12
    new = healthy(fp=dict(kit.NV, driver="550.54.15"))
    for r in new:
        r["at"] += 40000
        r["sweep"] = "t" + r["sweep"]
    s = page(profile, healthy() + new)["stages"]["stable"]
    assert s["state"] == "pass" and s["fingerprint_changes"][0]["changed"] == "driver 535.104.05 -> 550.54.15"
    assert s["fingerprint_changes"][0]["nodes"] == 6
    s = page(profile, healthy() + new[: len(new) // 3])["stages"]["stable"]
    assert (
        s["state"] == "pending"
        and "1 sweep(s) since the latest version change (driver 535.104.05 -> 550.54.15)" in s["reason"]
    )


def test_build_reads_the_store_with_the_reference_and_the_cli_prints_it(profile, tmp_path, capsys):
    store = tmp_path / "store"
    kit.put(store, "hdr", healthy(slow={"n4"}), layers())
    kit.put(
        store,
        "ascend",
        kit.sweeps("ascend", ["a1", "a2", "a3"], {"hccl_allreduce": 50.0}, NOW - 20000, fp=kit.ASCEND),
    )
    p = acceptance.build(str(store), profile, "hdr", NOW, WINDOW)
    ref = p["stages"]["fast"]["reference"]
    assert ref["partition"] == "ascend" and [(r["metric"], r["ratio"]) for r in ref["rows"]] == [
        ("all-reduce busbw", 2.0)
    ]
    assert p["stages"]["fast"]["state"] == "attention"
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for f in (kit.REPO / "partitions").glob("*.yaml"):
        (profiles / f.name).write_text(f.read_text())
    code = validate.main(
        ["status", "-p", "hdr", "--store", str(store), "--partitions-dir", str(profiles), "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["stages"]["fast"]["state"] == "attention" and doc["partition"] == "hdr"
    code = validate.main(
        ["status", "-p", "hdr", "--store", str(tmp_path / "empty"), "--partitions-dir", str(profiles)]
    )
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("partition hdr: pending")
