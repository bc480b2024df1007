"""Issue 27's layers 1 and 2 on the local Slurm cluster: two partitions as two platforms, through real Slurm
jobs. `vpc` is the plain one (this venv's PyTorch on the CPU); `roce` is the perturbed one, whose
validate.python is tests/validate_standins/python-perturbed (layer norm 2% off) and whose reference is vpc.
The plain one passes both layers and records the reference; the perturbed one fails layer 1 on layer_norm
alone (every other operator passes, against fp64 and against vpc's stored outputs) and layer 2 outside the
band, naming the operator, the dtype and the version matrix, and exits 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.active import store
from slurm_tune.validate.records import valid_record

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PERTURBED = REPO / "tests" / "validate_standins" / "python-perturbed"
# Small and fast: 40 steps (seconds on these CPUs); a band tight enough for a 2% layer norm (about 1% off
# the plain curve at its worst window), loose for two runs of one platform (the same bytes).
VALIDATE = "validate:\n  seed: 11\n  steps: 40\n  cold_steps: 5\n  band: 0.005\n  time_limit: 3m\n"


def profile_dir(tmp: Path) -> Path:
    d = tmp.parent / f"{tmp.name}-profiles"  # root loads profiles only where root alone can write
    d.mkdir()
    for f in (REPO / "partitions").glob("*.yaml"):
        (d / f.name).write_text(f.read_text())
    (d / "vpc.yaml").write_text((REPO / "partitions" / "vpc.yaml").read_text() + VALIDATE)
    roce = (
        (REPO / "partitions" / "roce.yaml").read_text().replace("  count: 8\n", "  count: 4\n")
    )  # 4 fake GPUs
    (d / "roce.yaml").write_text(roce + VALIDATE + f"  python: {PERTURBED}\n  reference: vpc\n")
    return d


def stune_validate(profiles: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "stune-validate"), *argv],
        capture_output=True,
        text=True,
        env=dict(os.environ, STUNE_PARTITIONS=str(profiles)),
        timeout=600,
    )


def test_the_perturbed_platform_fails_layer_norm_alone_and_the_band_against_the_plain_one(slurm, shared_tmp):
    profiles = profile_dir(shared_tmp)
    where = ["--store", str(shared_tmp / "store")]
    plain = stune_validate(profiles, "run", "-p", "vpc", "--json", *where)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    ops, conv = json.loads(plain.stdout)["records"]
    assert (ops["layer"], ops["status"], conv["layer"], conv["status"]) == ("ops", "pass", "converge", "pass")
    assert conv["detail"] == "reference recorded" and len(conv["losses"]) == 40
    assert ops["node"] in ("n1", "n2", "n3") and ops["fingerprint"]["backend"] == "cpu"
    assert all(e["status"] == "pass" for e in ops["ops"]) and len(ops["ops"]) == 9
    job = slurm.run(["scontrol", "show", "job", "-o", ops["job"]])  # a real job, below every user job
    assert "TimeLimit=00:03:00" in job and "Nice=10000" in job and "Requeue=0" in job, job

    bad = stune_validate(profiles, "run", "-p", "roce", *where)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    out = bad.stdout
    assert "layer_norm/fp32  fail" in out, out
    assert "ops: fail: layer_norm/fp32: max abs err" in out and "version matrix: torch 2." in out
    assert "converge: fail: loss over steps " in out
    ops, conv = store.load(str(shared_tmp / "store"), "roce", kind="validate", accept=valid_record)
    assert {f"{e['op']}/{e['dtype']}": e["status"] for e in ops["ops"] if e["status"] != "pass"} == {
        "layer_norm/fp32": "fail"
    }
    assert all(
        e["ref"]["status"] == "pass" and e["ref"]["against"] == "vpc"
        for e in ops["ops"]
        if e["op"] != "layer_norm"
    )
    assert (
        ops["detail"].startswith("layer_norm/fp32: ")
        and "cpu" in ops["detail"]
        and "kernel=" in ops["detail"]
    )
    assert conv["status"] == "fail" and conv["max_dev"] > 0.005 and conv["reference"]["against"] == "vpc"

    shown = stune_validate(profiles, "show", "-p", "roce", *where)
    assert shown.returncode == 0 and shown.stdout.count(" fail ") == 2, shown.stdout

    # the acceptance page of each platform, from what these real jobs stored: the four stages, the
    # perturbed one not correct (layer 1 naming its operator), neither with a baseline or sweeps yet
    pages = {}
    for partition in ("vpc", "roce"):
        status = stune_validate(profiles, "status", "-p", partition, "--json", *where)
        pages[partition] = json.loads(status.stdout)
        assert set(pages[partition]["stages"]) == {"runs", "correct", "fast", "stable"}, status.stdout
    vpc, roce = pages["vpc"]["stages"], pages["roce"]["stages"]
    assert vpc["runs"]["state"] == "pass" and vpc["correct"]["state"] == "pass", vpc
    assert roce["correct"]["state"] == "fail" and "layer_norm.fp32" in roce["correct"]["reason"], roce
    assert "layer 2" in roce["correct"]["reason"] and pages["roce"]["state"] == "fail"
    assert {vpc["fast"]["state"], vpc["stable"]["state"]} == {"pending"}, vpc
