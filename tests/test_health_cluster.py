"""Acceptance on the local Slurm cluster: the shipped hooks in prolog.d / epilog.d, `stune-health run` as the
HealthCheckProgram, real drains, requeues, resumes, degraded marks and the circuit breaker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import healthkit as kit
import pytest
from helpers import wait_for_state, wait_until

from slurm_tune.nodestate import DEGRADED_FEATURE
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class Health:
    """The health setup of the three nodes: per-node sysfs trees, GPU snapshots and state, one env file."""

    def __init__(self, cluster, slurm, tmp_path):
        self.cluster, self.slurm = cluster, slurm
        self.layout = cluster.layout
        self.env_file = self.layout.root / "stune-health.env"
        self.profiles = Path(os.environ["STUNE_PARTITIONS"])
        for n in NODES:
            base = self.base(n)
            if base.exists():
                import shutil

                shutil.rmtree(base)
            kit.tree(base / "root", "hdr")
            kit.gpu_file(base / "gpus.json")
        self.write_env()

    def base(self, node: str) -> Path:
        return self.layout.node_dir(node) / "health"

    def write_env(self, profiles: Path | None = None) -> None:
        nodes = self.layout.root / "nodes"
        values = {
            "STUNE_BIN": BIN,
            "STUNE_PARTITIONS": profiles or self.profiles,
            "STUNE_CACHE_DIR": self.layout.root / "health-cache",
            "STUNE_HEALTH_PARTITION": "hdr",
            "STUNE_SYSFS_ROOT": f"{nodes}/%n/health/root",
            "STUNE_GPU_SNAPSHOT": f"{nodes}/%n/health/gpus.json",
            "STUNE_STATE_DIR": f"{nodes}/%n/health/state",
            **self.cluster.slurm_env(),
        }
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.env = {k: str(v) for k, v in values.items()}

    def install_hooks(self) -> None:
        for kind in ("prolog", "epilog"):
            self.cluster.install_hook(
                kind,
                "10-stune-health",
                f"#!/bin/sh\nSTUNE_ENV_FILE={self.env_file} exec {REPO}/{kind}/10-stune-health\n",
            )

    def remove_hooks(self) -> None:
        for kind in ("prolog", "epilog"):
            self.cluster.install_hook(kind, "10-stune-health", None)

    def run(self, node: str, *args) -> tuple[int, dict]:
        """`stune-health run` as slurmd runs it on `node` (the HealthCheckProgram), with --json."""
        env = dict(os.environ, **self.env, SLURMD_NODENAME=node)
        proc = subprocess.run(
            [str(BIN / "stune-health"), "run", "--json", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, json.loads(proc.stdout)

    def port(self, node: str, hca: str, state="4: ACTIVE", phys="5: LinkUp", rate=None) -> None:
        port = self.base(node) / f"root/sys/class/infiniband/{hca}/ports/1"
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text(phys + "\n")
        if rate:
            (port / "rate").write_text(rate + "\n")

    def node(self, name: str):
        return self.slurm.node(name)

    def all_healthy(self) -> None:
        for n in NODES:
            code, doc = self.run(n)
            assert (code, doc["status"]) == (0, "ok"), doc


@pytest.fixture
def health(cluster, slurm, tmp_path):
    h = Health(cluster, slurm, tmp_path)
    h.install_hooks()
    yield h
    h.remove_hooks()
    cluster.set_fragment("health", None)


def job_nodes(slurm, job_id: int, since: float) -> list[str]:
    """Every node the job was allocated, over all its runs (sacct -D lists requeued runs too). Only records
    submitted since `since`: after a controller restart Slurm may hand out a job id again."""
    rows = slurm.sacct(["JobID", "NodeList", "State", "Submit"], job_ids=[str(job_id)], extra=["-D"])
    return [r["NodeList"] for r in rows if r["Submit"].isdigit() and int(r["Submit"]) >= int(since) - 1]


def test_a_port_down_drains_the_node_requeues_the_job_and_resumes_when_fixed(health, slurm, shared_tmp):
    health.all_healthy()  # the nodes pass this policy: from now on a failure is the hardware's
    health.port("n1", "mlx5_2", "1: DOWN", "3: Disabled")
    since = time.time()
    job = slurm.submit(
        ["-p", "hdr", "-N1", "-o", str(shared_tmp / "out-%j.txt"), "--wrap", "echo ran on $SLURMD_NODENAME"]
    )
    n1 = wait_until(
        "n1 drained by its failed prolog", lambda: (lambda n: n if n.drain else None)(slurm.node("n1"))
    )
    assert n1.reason == "Prolog error"  # Slurm's own words; stune's prolog makes no Slurm call
    wait_until("the job requeued", lambda: slurm.job(job).restart_count >= 1)
    code, doc = health.run("n1")
    assert (code, doc["status"]) == (0, "fail")
    assert doc["sync"] in ("the prolog failed this node", "the epilog failed this node")  # Slurm runs both
    n1 = slurm.node("n1")
    assert n1.drain and n1.reason == "stune: mlx5_2/1 state DOWN"

    def ended() -> bool:
        # skip Slurm's 2-minute requeue delay until the job ends, not only until it starts: a run whose epilog
        # fails again is requeued, with the delay, once more
        queued = slurm.job(job)
        if queued.state == "PENDING" and queued.reason == "BeginTime":
            slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        return queued.state in ("COMPLETED", "FAILED")

    wait_until("the requeued job to run to its end", ended, timeout=180, interval=1)
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED"
    ran_on = (shared_tmp / f"out-{job}.txt").read_text().split()[-1]
    assert ran_on in ("n2", "n3")
    assert "n1" in job_nodes(slurm, job, since)  # it was sent to n1 first
    health.port("n1", "mlx5_2")
    code, doc = health.run("n1")
    assert (code, doc["status"], doc["applied"]) == (0, "ok", ["state"])
    n1 = slurm.node("n1")
    assert not n1.drain and n1.reason == ""


def test_an_admins_drain_survives_every_stune_run(health, slurm):
    health.all_healthy()
    slurm.drain("n2", "bad DIMM, ticket 4711")
    health.port("n2", "mlx5_0", "1: DOWN", "3: Disabled")
    for _ in range(2):
        assert health.run("n2")[1]["status"] == "fail"
    assert (slurm.node("n2").drain, slurm.node("n2").reason) == (True, "bad DIMM, ticket 4711")
    health.port("n2", "mlx5_0", rate="100 Gb/sec (2X HDR)")
    _code, doc = health.run("n2")
    assert doc["status"] == "degraded"
    n2 = slurm.node("n2")
    assert (n2.drain, n2.reason) == (True, "bad DIMM, ticket 4711") and DEGRADED_FEATURE in n2.feature_set
    health.port("n2", "mlx5_0", rate="200 Gb/sec (4X HDR)")
    for _ in range(2):
        _code, doc = health.run("n2")
        assert doc["status"] == "ok"
    n2 = slurm.node("n2")
    assert (n2.drain, n2.reason) == (True, "bad DIMM, ticket 4711")
    assert DEGRADED_FEATURE not in n2.feature_set  # stune's own mark goes; the drain stays


def test_a_degraded_node_runs_single_node_jobs_and_multi_node_jobs_avoid_it(health, slurm, shared_tmp):
    health.all_healthy()
    slurm.update_node("n2", features=["bigmem"])  # the admin's own feature
    health.port("n2", "mlx5_3", rate="100 Gb/sec (2X HDR)")
    code, doc = health.run("n2")
    assert (code, doc["status"], doc["reason"]) == (0, "degraded", "mlx5_3/1 rate 100 Gb/s < 200")
    n2 = slurm.node("n2")
    assert not n2.drain and n2.feature_set == {"bigmem", DEGRADED_FEATURE}
    assert n2.comment == "stune: degraded: mlx5_3/1 rate 100 Gb/s < 200"
    single = slurm.submit(
        ["-p", "hdr", "-w", "n2", "-o", str(shared_tmp / "single-%j.txt"), "--wrap", "true"]
    )
    assert wait_for_state(slurm, single, ("COMPLETED", "FAILED")) == "COMPLETED"
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
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    multi = int(proc.stdout.strip().split(";")[0])
    assert wait_for_state(slurm, multi, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"multi-{multi}.txt").read_text().split() == ["n[1,3]"]  # as the job saw it
    health.port("n2", "mlx5_3", rate="200 Gb/sec (4X HDR)")
    code, doc = health.run("n2")
    assert doc["status"] == "ok"
    n2 = slurm.node("n2")
    assert n2.feature_set == {"bigmem"} and n2.comment == ""


def test_a_policy_that_fails_every_node_trips_the_breaker(health, slurm, shared_tmp, tmp_path):
    health.all_healthy()
    # root loads profiles only from where root alone can write: not from this test's job-writable tmp_path
    broken = kit.profile_dir(
        health.layout.root / "broken-profiles",
        {
            "hdr.yaml": [
                (
                    "    - {device: mlx5_7, port: 1}\n",
                    "    - {device: mlx5_7, port: 1}\n    - {device: mlx5_9, port: 1}\n",
                )
            ]
        },
    )
    health.write_env(broken)
    runs = {
        n: subprocess.Popen(
            [str(BIN / "stune-health"), "run", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **health.env, SLURMD_NODENAME=n),
        )
        for n in NODES
    }
    results = {n: (p.wait(120), json.loads(p.stdout.read()), p.stderr.read()) for n, p in runs.items()}
    drained = [n for n in NODES if slurm.node(n).drain]
    assert len(drained) == 1, results  # 10 % of 3 nodes, at least one
    assert slurm.node(drained[0]).reason == "stune: mlx5_9 missing"
    for n in NODES:
        code, doc, err = results[n]
        assert doc["status"] == "fail"
        if n != drained[0]:
            assert code == 7 and doc["breaker"]["open"] and "circuit breaker open: " in err
    for n in NODES:  # later runs hold the line too, loudly, without asking Slurm again before the retry time
        code, doc = health.run(n)
        if n != drained[0]:
            assert (code, doc["breaker"]["open"], doc["sync"]) == (7, True, "")
            assert (health.base(n) / "state/health.log").read_text().count("circuit breaker open: ") >= 2
    assert [n for n in NODES if slurm.node(n).drain] == drained
    # nor can the prologs drain the fleet: no node has ever passed this policy, so they do not fail jobs
    job = slurm.submit(["-p", "hdr", "-N1", "-o", str(shared_tmp / "b-%j.txt"), "--wrap", "true"])
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert [n for n in NODES if slurm.node(n).drain] == drained


def test_an_unchanged_node_makes_no_slurm_call(health, slurm):
    from slurm_tune.health import node as health_node
    from slurm_tune.slurm import Slurm

    env = dict(os.environ, **health.env, SLURMD_NODENAME="n3")
    cfg = health_node.settings({}, env)
    first = Slurm(conf=str(health.layout.slurm_conf))
    health_node.run(cfg, first, environ=env)
    assert first.calls  # the first run reads the node once, to clear any stale marks
    again = Slurm(conf=str(health.layout.slurm_conf))
    for _ in range(3):
        code, doc = health_node.run(cfg, again, environ=env)
        assert (code, doc["status"], doc["sync"]) == (0, "ok", "")
    assert again.calls == []
    health.port("n3", "mlx5_3", rate="100 Gb/sec (2X HDR)")
    marking = Slurm(conf=str(health.layout.slurm_conf))
    health_node.run(cfg, marking, environ=env)
    node_read = (
        ["sinfo", "--json"] if slurm.version() < (23, 2) else ["scontrol", "--json"]
    )  # slurm9: per release
    assert [c[:2] for c in marking.calls] == [node_read, ["scontrol", "update"]]
    quiet = Slurm(conf=str(health.layout.slurm_conf))
    for _ in range(3):
        assert health_node.run(cfg, quiet, environ=env)[1]["status"] == "degraded"
    assert quiet.calls == []
    # and slurmctld agrees: no node read or update reached it while nothing changed
    slurm.run(["sdiag", "-r"])
    for _ in range(3):
        assert health.run("n3")[1]["sync"] == ""
    stats = slurm.run(["sdiag"])
    per_type = stats.split("Remote Procedure Call statistics by message type", 1)[1].split(
        "Remote Procedure", 1
    )[0]
    assert "REQUEST_UPDATE_NODE" not in per_type and "REQUEST_NODE_INFO" not in per_type, per_type


def test_the_epilog_catches_a_fatal_xid_the_job_left(health, slurm, shared_tmp):
    kmsg = health.base("n1") / "root/dev/kmsg"
    kmsg.parent.mkdir(parents=True, exist_ok=True)
    kmsg.write_text("6,1201,350123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05\n")
    health.all_healthy()
    line = "4,1288,9912345678,-;NVRM: Xid (PCI:0000:47:00): 79, pid=2231, name=python, GPU has fallen off the bus."
    job = slurm.submit(
        ["-p", "hdr", "-w", "n1", "-o", str(shared_tmp / "x-%j.txt"), "--wrap", f"echo '{line}' >> {kmsg}"]
    )
    wait_for_state(slurm, job, ("COMPLETED", "FAILED"))
    n1 = wait_until(
        "n1 drained by its failed epilog", lambda: (lambda n: n if n.drain else None)(slurm.node("n1"))
    )
    assert n1.reason == "Epilog error"
    _code, doc = health.run("n1")
    assert (doc["status"], slurm.node("n1").reason) == ("fail", "stune: gpu2 Xid 79")
    assert health.run("n1")[1]["status"] == "fail"  # held: the GPU needs a reset
    env = dict(os.environ, **health.env, SLURMD_NODENAME="n1")
    subprocess.run([str(BIN / "stune-health"), "clear", "--xid"], env=env, check=True, capture_output=True)
    _code, doc = health.run("n1")
    assert doc["status"] == "ok" and not slurm.node("n1").drain


def test_slurmd_runs_the_health_check_program_which_drains_and_resumes(health, slurm, cluster):
    health.all_healthy()
    wrapper = health.layout.root / "stune-health-run"
    wrapper.write_text(f"#!/bin/sh\nSTUNE_ENV_FILE={health.env_file} exec {REPO}/prolog/stune-health-run\n")
    wrapper.chmod(0o755)
    cluster.set_fragment(
        "health", f"HealthCheckProgram={wrapper}\nHealthCheckInterval=2\nHealthCheckNodeState=ANY"
    )
    health.port("n3", "mlx5_5", "1: DOWN", "3: Disabled")
    wait_until(
        "n3 drained by the HealthCheckProgram",
        lambda: slurm.node("n3").reason == "stune: mlx5_5/1 state DOWN",
        timeout=60,
    )
    health.port("n3", "mlx5_5")
    wait_until("n3 resumed by the HealthCheckProgram", lambda: not slurm.node("n3").drain, timeout=60)
    cluster.set_fragment("health", None)
    assert (
        "run fail: mlx5_5/1 state DOWN; Slurm: the verdict changed"
        in (health.base("n3") / "state/health.log").read_text()
    )


def test_without_a_partition_setting_the_run_asks_slurm_once(health, slurm):
    del health.env["STUNE_HEALTH_PARTITION"]
    env = dict(os.environ, **health.env, SLURMD_NODENAME="n2")
    env.pop("STUNE_HEALTH_PARTITION", None)

    def run():
        proc = subprocess.run(
            [str(BIN / "stune-health"), "run", "--json"], capture_output=True, text=True, env=env
        )
        return json.loads(proc.stdout)

    first = run()
    assert (first["partition"], first["profile_from"]) == ("hdr", "first profiled partition of n2 in Slurm")
    assert run()["profile_from"] == "used by this node before"


def test_an_unknown_that_stays_marks_the_node_degraded_and_clears_when_reads_recover(health, slurm):
    health.all_healthy()
    counter = health.base("n3") / "root/sys/class/infiniband/mlx5_5/ports/1/counters/symbol_error"
    counter.write_text("9" * 5000 + "\n")  # a counter that reads as garbage, run after run
    for _ in range(2):
        code, doc = health.run("n3")
        assert (code, doc["status"], doc["sync"]) == (0, "unknown", "")  # unknown: stune does not act, yet
        assert doc["reason"].startswith("mlx5_5/1: unreadable symbol_error '999")
        assert DEGRADED_FEATURE not in slurm.node("n3").feature_set
    code, doc = health.run("n3")  # health.unknown_degrade_after: 3 by default
    assert (code, doc["status"], doc["action"]) == (0, "degraded", "degraded")
    n3 = slurm.node("n3")
    assert not n3.drain and DEGRADED_FEATURE in n3.feature_set
    assert n3.comment.startswith("stune: degraded: mlx5_5/1 unknown for 3 runs: unreadable symbol_error")
    counter.write_text("0\n")
    code, doc = health.run("n3")
    assert (code, doc["status"]) == (0, "ok")
    n3 = slurm.node("n3")
    assert DEGRADED_FEATURE not in n3.feature_set and n3.comment == "" and not n3.drain
