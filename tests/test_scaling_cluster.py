"""`stune-sweep scaling` on the local Slurm cluster (3 nodes, 4 fake GPUs each): real sbatch jobs, the agent
inside them, the all-reduce stand-in printing nccl-tests' table with a scaling curve injected by device count
and node count (tests/active_standins/standin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_active_cluster import ACTIVE, Rig

from slurm_tune.active import scaling, streams
from slurm_tune.active import store as active_store
from slurm_tune.active.scaling_judge import valid_record

pytestmark = pytest.mark.cluster

SCALING = """scaling:
  devices: [1, 2, 4, 8]
  knee: 0.8
  time_limit: 2m
"""


@pytest.fixture
def rig(slurm, shared_tmp, monkeypatch):
    return Rig(slurm, shared_tmp, monkeypatch, active=ACTIVE + SCALING)


def scaling_run(rig, **kw):
    opts = scaling.Options("hdr", str(rig.store), spool=str(rig.tmp / "spool"), **kw)
    return scaling.run(rig.slurm, rig.profile, opts, log=rig.log.append)


def sbatches(slurm) -> list[list[str]]:
    return [c for c in slurm.calls if os.path.basename(c[0]) == "sbatch"]


def test_a_drop_at_three_nodes_is_the_knee_and_names_the_node_that_joined(rig, slurm):
    rig.set_values(
        {
            "all_reduce_perf": {
                "scaling": {
                    "devices": {"1": 0, "2": 180, "4": 175},
                    "nodes": {"1": 170, "2": 160, "3": 60},
                }
            }
        }
    )
    out = scaling_run(rig)
    node, nodes = out["curves"]
    # in one node: 1, 2, 4 devices (8 is capped at the node's 4), against the 2-device busbw
    assert [p["n"] for p in node["points"]] == [1, 2, 4] and node["verdict"] == "pass"
    assert node["points"][0]["efficiency"] is None and node["points"][0]["metric"] == "algbw"
    assert node["baseline"] == pytest.approx(180 * 1.0, rel=0.01)
    assert node["points"][2]["efficiency"] == pytest.approx(175 / 180, rel=0.01)
    assert node["fingerprint"]["driver"] == "535.104.05"
    # across nodes: 1, 2 and all 3 nodes, against the 1-node figure; the knee at 3, n3 joined
    assert [(p["n"], p["nodes"]) for p in nodes["points"]] == [
        (1, ["n1"]),
        (2, ["n1", "n2"]),
        (3, ["n1", "n2", "n3"]),
    ]
    assert nodes["verdict"] == "knee" and nodes["baseline"] == pytest.approx(170, rel=0.01)
    knee = nodes["knee"]
    assert (
        knee["n"] == 3
        and knee["nodes_added"] == ["n3"]
        and knee["efficiency"] == pytest.approx(60 / 170, rel=0.01)
    )
    assert knee["switches"] == [] and "no topology known" in knee["why"]
    assert scaling.exit_attention(out["curves"])
    # one job for the curve in one node, one per node count; sweep jobs: nice, exclusive, the GPUs
    submitted = sbatches(slurm)
    assert len(submitted) == 4
    assert all("--exclusive" in c and "--no-requeue" in c and "--gres=gpu:4" in c for c in submitted)
    stored = streams.load_scaling(str(rig.store), "hdr")
    assert [r["scope"] for r in stored] == ["node", "nodes"] and all(valid_record(r) for r in stored)
    assert stored[1]["knee"]["nodes_added"] == ["n3"]


def test_a_knee_inside_one_node_stops_the_multinode_curve_before_any_job(rig, slurm, shared_tmp):
    rig.set_values(
        {"all_reduce_perf": {"scaling": {"devices": {"1": 0, "2": 180, "4": 100}, "nodes": {"1": 170}}}}
    )
    env = dict(os.environ, STUNE_ACTIVE_DIR=str(rig.store))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_tune.cli.sweep",
            "scaling",
            "-p",
            "hdr",
            "--json",
            "--partitions-dir",
            str(rig.profiles),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=shared_tmp,
    )
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    node, nodes = doc["curves"]
    assert node["verdict"] == "knee" and node["knee"]["n"] == 4
    assert node["knee"]["efficiency"] == pytest.approx(100 / 180, rel=0.01)
    assert nodes["verdict"] == "skipped" and nodes["points"] == []
    assert "single-node curve did not pass (knee" in nodes["detail"]
    # only the single-node job was submitted: no multi-node job ever ran
    outputs = list((rig.store / "spool").glob("*.out"))  # every sweep job writes its output there
    assert len(outputs) == 1 and "STUNE-ACTIVE" in outputs[0].read_text()
    stored = active_store.load(str(rig.store), "hdr", kind="scaling", accept=valid_record)
    assert [r["verdict"] for r in stored] == ["knee", "skipped"]
