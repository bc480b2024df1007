"""Active checks on the local Slurm cluster: stand-in tools (tests/active_standins) print the real formats
with values injected per node; fio, dd and iperf3 run for real. Sweeps go through real sbatch jobs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for_state

from slurm_tune.active import store as active_store
from slurm_tune.active import sweep as active_sweep
from slurm_tune.nodestate import DEGRADED_FEATURE
from slurm_tune.profiles import load_profile
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STANDINS = REPO / "tests" / "active_standins"


def profile_dir(tmp: Path, active: str, hcas: str = "    - {device: mlx5_0, port: 1}\n") -> Path:
    """The repo's profiles, with hdr reduced to one HCA and given an `active` section."""
    d = tmp.parent / f"{tmp.name}-profiles"  # root loads profiles only where root alone can write: not in the
    d.mkdir()  # job-writable tmp
    for f in (REPO / "partitions").glob("*.yaml"):
        (d / f.name).write_text(f.read_text())
    text = (REPO / "partitions" / "hdr.yaml").read_text()
    start = text.index("  hcas:\n") + len("  hcas:\n")
    end = text.index("  rate_gbps")
    text = text[:start] + hcas + text[end:]
    text = text.replace("  count: 8\n", "  count: 4\n")  # the dev cluster's nodes have 4 (fake) GPUs
    (d / "hdr.yaml").write_text(text + active)
    return d


ACTIVE = f"""active:
  checks:
    nccl_allreduce: {{time_limit: 2m}}
    ib_write_bw: {{time_limit: 2m, floor: 180}}
    nccl_pair: {{time_limit: 2m, floor: 80}}
    nvbandwidth: {{time_limit: 2m}}
    dcgm_diag: {{time_limit: 2m}}
  tools:
    all_reduce_perf: {STANDINS}/all_reduce_perf
    ib_write_bw: {STANDINS}/ib_write_bw
    nvbandwidth: {STANDINS}/nvbandwidth
    dcgmi: {STANDINS}/dcgmi
  runs: 3
  k: 2
  n: 3
"""


class Rig:
    def __init__(
        self, slurm, tmp: Path, monkeypatch, active=ACTIVE, hcas="    - {device: mlx5_0, port: 1}\n"
    ):
        self.slurm, self.tmp = slurm, tmp
        self.profiles = profile_dir(tmp, active, hcas)
        self.profile = load_profile("hdr", self.profiles)
        self.store = tmp / "store"
        self.values = tmp / "values.json"
        state = tmp / "standin-state"
        state.mkdir()
        roots = tmp / "roots"
        for n in NODES:
            self.driver(n, "535.104.05", roots)
        monkeypatch.setenv("STUNE_STANDIN_VALUES", str(self.values))
        monkeypatch.setenv("STUNE_STANDIN_STATE", str(state))
        monkeypatch.setenv("STUNE_SYSFS_ROOT", f"{roots}/%n")
        self.roots = roots
        self.log: list[str] = []

    def driver(self, node: str, version: str, roots: Path | None = None) -> None:
        f = (roots or self.roots) / node / "proc" / "driver" / "nvidia" / "version"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Oct  5 21:04:57 UTC 2023\n"
        )

    def set_values(self, values: dict) -> None:
        self.values.write_text(json.dumps(values))
        for f in (self.tmp / "standin-state").iterdir():
            f.unlink()

    def sweep(self, **kw):
        opts = active_sweep.Options("hdr", str(self.store), spool=str(self.tmp / "spool"), **kw)
        return active_sweep.sweep(self.slurm, self.profile, opts, log=self.log.append)


@pytest.fixture
def rig(slurm, shared_tmp, monkeypatch):
    return Rig(slurm, shared_tmp, monkeypatch)


def stune_sbatch_nodes(shared_tmp) -> str:
    proc = subprocess.run(
        [
            str(BIN / "stune-sbatch"),
            "--parsable",
            "-p",
            "hdr",
            "-N2",
            "-o",
            str(shared_tmp / "multi-%j.txt"),
            "--wrap",
            "echo $SLURM_JOB_NODELIST",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, STUNE_PARTITIONS=str(REPO / "partitions")),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_node_at_70_percent_in_2_of_3_runs_is_marked_and_excluded_then_cleared(rig, slurm, shared_tmp):
    rig.set_values({"all_reduce_perf": {"n2": [70.0, 100.0, 70.0], "*": 100.0}, "ib_write_bw": {"*": 196.0}})
    out = rig.sweep(checks=["nccl_allreduce"])
    assert out["nodes"] == list(NODES)
    n2 = slurm.node("n2")
    assert DEGRADED_FEATURE in n2.feature_set and not n2.drain
    assert n2.comment.startswith("stune: degraded: active nccl_allreduce: 70 GB/s vs partition median 100"), (
        n2.comment
    )
    assert "2 of 3 runs slow" in n2.comment
    assert all(DEGRADED_FEATURE not in slurm.node(n).feature_set for n in ("n1", "n3"))
    # the jobs were ordinary Slurm jobs: low priority, with the check's time limit
    rec = [r for r in active_store.load(str(rig.store), "hdr") if r["subject"] == "n2"]
    assert [r["value"] for r in rec] == [70.0, 100.0, 70.0] and rec[0]["fingerprint"][
        "driver"
    ] == "535.104.05"
    job = slurm.run(["scontrol", "show", "job", "-o", rec[0]["job"]])
    assert "TimeLimit=00:02:00" in job and "Nice=10000" in job and "Requeue=0" in job
    assert re.search(r"TresPerNode=gres[:/]gpu:4", job), job  # the GPU checks ask for the node's GPUs
    # the next multi-node job avoids it
    multi = int(stune_sbatch_nodes(shared_tmp).strip().split(";")[0])
    assert wait_for_state(slurm, multi, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"multi-{multi}.txt").read_text().split() == ["n[1,3]"]
    # a later sweep that passes clears the mark
    rig.set_values({"all_reduce_perf": {"*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    n2 = slurm.node("n2")
    assert DEGRADED_FEATURE not in n2.feature_set and n2.comment == ""


def test_a_slow_gpu_copy_and_a_failing_dcgm_diag_are_marked_with_what_failed(rig, slurm):
    rig.set_values({"nvbandwidth": {"n1": [20, 100, 20], "*": 100}, "dcgmi": {"n3": [0, 0, 1], "*": 1}})
    rig.sweep(checks=["nvbandwidth", "dcgm_diag"])
    n1, n2, n3 = (slurm.node(n) for n in NODES)
    assert n1.comment.startswith(
        "stune: degraded: active nvbandwidth: 177.2 GB/s vs partition median 221.5"
    ), n1
    assert "slowest 11.07 at 0->2" in n1.comment
    assert n3.comment.startswith(
        "stune: degraded: active dcgm_diag: dcgmi diag PCIe: GPU 2 PCIe link width 8x"
    ), n3
    assert DEGRADED_FEATURE not in n2.feature_set


def test_a_single_slow_run_marks_nothing(rig, slurm):
    rig.set_values({"all_reduce_perf": {"n1": [100.0, 70.0, 100.0], "*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    assert all(DEGRADED_FEATURE not in slurm.node(n).feature_set and not slurm.node(n).comment for n in NODES)


def test_a_pair_slow_because_of_one_node_names_that_node_and_hca(slurm, shared_tmp, monkeypatch):
    rig = Rig(
        slurm,
        shared_tmp,
        monkeypatch,
        hcas="    - {device: mlx5_0, port: 1}\n    - {device: mlx5_1, port: 1}\n",
    )
    rig.set_values({"ib_write_bw": {"n3/mlx5_1": 120.0, "*": 196.0}})
    out = rig.sweep(checks=["ib_write_bw"])
    assert set(out["named"]) == {"n3"}, rig.log
    assert any("bisection of n3+n1/mlx5_1: n3 mlx5_1: slow with known-good n2" in line for line in rig.log), (
        rig.log
    )
    n3 = slurm.node("n3")
    assert DEGRADED_FEATURE in n3.feature_set
    assert n3.comment.startswith("stune: degraded: active ib_write_bw: n3 mlx5_1: slow with known-good n2"), (
        n3
    )
    rec = active_store.load(str(rig.store), "hdr")
    jobs = {r["job"] for r in rec if r["check"] == "ib_write_bw"}
    for job in jobs:  # one job per pair measures each HCA in turn
        assert len({r["subject"].split("/")[1] for r in rec if r["job"] == job}) == 2
    assert all(DEGRADED_FEATURE not in slurm.node(n).feature_set for n in ("n1", "n2"))


def test_a_slow_two_node_nccl_ring_names_its_bad_node_and_gives_it_back_once_its_pairs_pass(rig, slurm):
    """nccl_pair: one 2-node all_reduce_perf launched by srun across the pair (the stand-in prints on rank 0).
    A partition with pair checks alone has no node check to clear the node: its passing pairs do."""
    rig.set_values({"all_reduce_perf": {"n3": 60.0, "*": 100.0}})
    out = rig.sweep(checks=["nccl_pair"])
    assert set(out["named"]) == {"n3"}, rig.log
    assert out["named"]["n3"].startswith("active nccl_pair: n3: slow with known-good n2")
    rec = [r for r in active_store.load(str(rig.store), "hdr") if r["subject"] == "n1+n2"]
    assert rec and rec[0]["value"] == 100.0 and rec[0]["fingerprint"]["nccl"] == "2.19.3"
    assert DEGRADED_FEATURE in slurm.node("n3").feature_set
    # n3 repaired: the next pair sweep passes and gives it back, and the bisection's one-off pairs (measured
    # once, never again) are not re-bisected into a faulty cable between two good nodes
    rig.set_values({"all_reduce_perf": {"*": 100.0}})
    rig.log.clear()
    out = rig.sweep(checks=["nccl_pair"])
    assert not out["named"] and not out["bisect"], rig.log
    assert not any("bisection" in line or "path between" in line for line in rig.log), rig.log
    n3 = slurm.node("n3")
    assert DEGRADED_FEATURE not in n3.feature_set and n3.comment == "", n3
    # passing pairs clear a pair check's mark only: a node check's mark waits for that check to pass
    mark = "stune: degraded: active nccl_allreduce: 70 GB/s vs partition median 100 (2 of 3 runs slow)"
    slurm.update_node("n1", features=sorted(slurm.node("n1").feature_set | {DEGRADED_FEATURE}), comment=mark)
    active_sweep.apply_marks(
        slurm, rig.profile, active_sweep.node_verdicts(out["verdicts"], {}), str(rig.store), time.time()
    )
    n1 = slurm.node("n1")
    assert DEGRADED_FEATURE in n1.feature_set and n1.comment == mark, n1


def test_report_shows_node_against_baseline_and_a_new_driver_starts_a_new_baseline(rig, slurm, tmp_path):
    rig.set_values({"all_reduce_perf": {"n2": 70.0, "*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    env = dict(os.environ, STUNE_PARTITIONS=str(rig.profiles), STUNE_ACTIVE_DIR=str(rig.store))
    rep = subprocess.run(
        [
            str(BIN / "stune-sweep"),
            "report",
            "-p",
            "hdr",
            "--format",
            "json",
            "--png",
            str(tmp_path / "r.png"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert rep.returncode == 0, rep.stderr
    rows = {r["subject"]: r for r in json.loads(rep.stdout)["rows"]}
    assert (
        rows["n2"]["status"] == "outlier" and rows["n2"]["baseline"] == 100.0 and rows["n2"]["ratio"] == 0.7
    )
    assert "driver=535.104.05" in rows["n2"]["fingerprint"]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    # a driver upgrade on every node: the slower new driver is the new baseline, nobody is compared with the old
    for n in NODES:
        rig.driver(n, "550.54.15")
    rig.set_values({"all_reduce_perf": {"*": 80.0}})
    rig.sweep(checks=["nccl_allreduce"])
    rows = {
        r["subject"]: r
        for r in json.loads(
            subprocess.run(
                [str(BIN / "stune-sweep"), "report", "-p", "hdr", "--format", "json"],
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        )["rows"]
    }
    assert {r["status"] for r in rows.values()} == {"ok"} and rows["n1"]["baseline"] == 80.0
    assert "driver=550.54.15" in rows["n1"]["fingerprint"]
    assert DEGRADED_FEATURE not in slurm.node("n2").feature_set  # cleared: its latest sweep passed
    drift = subprocess.run(
        [str(BIN / "stune-sweep"), "report", "-p", "hdr", "--drift"], capture_output=True, text=True, env=env
    ).stdout
    assert "driver 535.104.05 -> 550.54.15" in drift and "n1" in drift


def test_sweep_runs_inside_the_named_reservation_and_iperf3_runs_for_real(slurm, shared_tmp, monkeypatch):
    active = """active:
  checks:
    iperf3: {time_limit: 1m}
    disk_read: {time_limit: 1m}
    dcgm_diag: {time_limit: 1m}
  tools:
    dcgmi: /nonexistent/dcgmi
  runs: 1
  min_peers: 2
"""
    rig = Rig(
        slurm,
        shared_tmp,
        monkeypatch,
        active=active.replace("disk_read: {time_limit: 1m}", "disk_read: {time_limit: 1m}\n")
        + f"  disk_path: {shared_tmp}\n  disk_size: 16M\n",
    )
    slurm.run(
        [
            "scontrol",
            "create",
            "reservation",
            "ReservationName=stune-maint",
            "Nodes=n1,n2",
            "StartTime=now",
            "Duration=10",
            "Users=root",
            "Flags=maint,ignore_jobs",
        ]
    )
    try:
        out = rig.sweep(reservation="stune-maint")
        assert out["nodes"] == ["n1", "n2"]  # only the reservation's nodes
        rec = active_store.load(str(rig.store), "hdr")
        iperf = [r for r in rec if r["check"] == "iperf3"]
        job = slurm.run(["scontrol", "show", "job", "-o", iperf[0]["job"]])
        assert "Reservation=stune-maint" in job and "TimeLimit=00:01:00" in job
    finally:
        slurm.run(["scontrol", "delete", "ReservationName=stune-maint"], check=False)
    disk = [r for r in rec if r["check"] == "disk_read"]
    assert [r["status"] for r in iperf] == ["ok"] and iperf[0]["value"] > 0.01, iperf
    assert iperf[0]["subject"] == "n1+n2" and iperf[0]["unit"] == "Gb/s"
    assert {r["subject"] for r in disk} == {"n1", "n2"} and all(r["status"] == "ok" for r in disk), disk
    # a missing tool: said once, with what to install, and no node is marked for it
    assert any(
        line.startswith(
            "dcgm_diag: not available on 2 node(s) (n1,n2): /nonexistent/dcgmi "
            "(active.tools.dcgmi) is not an executable file: install DCGM"
        )
        for line in rig.log
    ), rig.log
    assert all(DEGRADED_FEATURE not in slurm.node(n).feature_set and not slurm.node(n).drain for n in NODES)


def test_drain_is_opt_in_and_a_drained_node_returns_only_after_its_checks_pass(
    slurm, shared_tmp, monkeypatch
):
    rig = Rig(slurm, shared_tmp, monkeypatch, active=ACTIVE + "  drain: true\n")
    rig.set_values({"all_reduce_perf": {"n2": [70.0, 100.0, 70.0], "*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    n2 = slurm.node("n2")
    assert n2.drain and n2.reason.startswith("stune: active nccl_allreduce: 70 GB/s"), n2
    assert not any(slurm.node(n).drain for n in ("n1", "n3"))
    # still slow: re-checked inside its own reservation, and drained again
    rig.set_values({"all_reduce_perf": {"n2": 70.0, "*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    assert slurm.node("n2").drain and any("resumed inside reservation" in line for line in rig.log), rig.log
    assert "stune-recheck" not in slurm.run(["scontrol", "show", "reservation"], check=False)
    # fast again: the re-check passes and the node returns to service
    rig.set_values({"all_reduce_perf": {"*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])
    n2 = slurm.node("n2")
    assert not n2.drain and n2.comment == "", n2


def test_gate_resume_hands_a_passive_drain_to_the_active_checks(slurm, shared_tmp, monkeypatch):
    from slurm_tune.health import apply

    rig = Rig(slurm, shared_tmp, monkeypatch, active=ACTIVE + "  gate_resume: true\n")
    rig.set_values({"all_reduce_perf": {"*": 100.0}})
    rig.sweep(checks=["nccl_allreduce"])  # a baseline
    slurm.update_node("n3", state="DRAIN", reason="stune: mlx5_0/1 state DOWN")
    # the passive checks pass again: with gate_resume they hand the drain over instead of resuming
    outcome = apply.sync(slurm, "n3", apply.Want(apply.CLEAR, ""), {}, rig.profile, 0.0)
    n3 = slurm.node("n3")
    assert n3.drain and n3.reason.startswith("stune: active awaiting active checks (was: stune: mlx5_0/1"), (
        outcome
    )
    rig.sweep(checks=["nccl_allreduce"])
    assert not slurm.node("n3").drain
