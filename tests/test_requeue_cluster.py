"""Requeue that avoids the culprit on the local cluster (issue 25 section 5): a 2-node job breaks an HCA port
of its batch node and fails; that node's epilog fails, Slurm drains it, `stune-health run` takes the drain
over and requeues the job once without the node, and the job's second run lands elsewhere. From 25.11.3 the
expedited forms too: Slurm's own expedited requeue, and the release of a job Slurm held."""

from __future__ import annotations

import os

import healthkit as kit
import pytest
from helpers import wait_until
from test_health_cluster import Health

from slurm_tune.health import state
from slurm_tune.hostlist import expand_hostlist

pytestmark = pytest.mark.cluster
REASON = "mlx5_2/1 state DOWN"


@pytest.fixture
def health(cluster, slurm, tmp_path):
    h = Health(cluster, slurm, tmp_path)
    # root loads profiles only from where root alone can write: beside the cluster, not in the job-writable tmp
    recovery = "recovery:\n  avoid_culprit: true\n  expedite: true\n"
    h.write_env(
        kit.profile_dir(
            cluster.layout.root / "requeue-profiles",
            {"hdr.yaml": [("placement:\n", recovery + "placement:\n")]},
        )
    )
    h.install_hooks()
    yield h
    h.remove_hooks()


def breaking_job(health, out, *, exit_code=3, garbage=False) -> str:
    """A batch script that, on its first run only, breaks its batch node (mlx5_2/1 DOWN; or, with `garbage`,
    a counter that reads as garbage: unknown, which fails nothing) and exits `exit_code`; a later run prints
    its nodes and succeeds."""
    port = f"{health.layout.root}/nodes/$SLURMD_NODENAME/health/root/sys/class/infiniband/mlx5_2/ports/1"
    damage = (
        f"printf '%05000d\\n' 9 > {port}/counters/symbol_error"
        if garbage
        else f"printf '1: DOWN\\n' > {port}/state; printf '3: Disabled\\n' > {port}/phys_state"
    )
    return (
        '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && { echo "first $SLURMD_NODENAME $SLURM_JOB_NODELIST"; '
        f'{damage}; exit {exit_code}; }}; echo "again $SLURM_JOB_NODELIST"'
    )


def submit(slurm, health, shared_tmp, *extra, **script) -> int:
    return slurm.submit(
        [
            "-p",
            "hdr",
            "-N2",
            "--open-mode=append",
            "-o",
            str(shared_tmp / "rq-%j.txt"),
            *extra,
            "--wrap",
            breaking_job(health, shared_tmp, **script),
        ]
    )


def settled(slurm, job: int, states=("COMPLETED", "FAILED"), timeout: float = 90) -> str:
    """The job's state in slurmctld once it is one of `states`. Not sacct's: an expedited job's run reads
    FAILED there until its epilogs are in and Slurm rewrites it to REQUEUED."""
    return wait_until(
        f"job {job} to be one of {states}",
        lambda: (lambda s: s if s in states else None)(slurm.job_record(job).get("JobState")),
        timeout=timeout,
    )


def lines(shared_tmp, job: int) -> list[list[str]]:
    return [line.split() for line in (shared_tmp / f"rq-{job}.txt").read_text().splitlines()]


def start_now(slurm, job: int) -> bool:
    """Skip Slurm's requeue delay (BeginTime); true once the job left PENDING."""
    queued = slurm.job(job)
    if queued.state == "PENDING" and queued.reason == "BeginTime":
        slurm.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    return queued.state != "PENDING"


def test_a_failed_2_node_job_on_a_node_stune_drained_is_requeued_without_it(health, slurm, shared_tmp):
    health.all_healthy()  # trusted, and seen healthy: the window opens
    job = submit(slurm, health, shared_tmp, "--requeue")
    declined = submit(slurm, health, shared_tmp, "--no-requeue")
    assert settled(slurm, job) == settled(slurm, declined) == "FAILED"
    first, culprit, nodes = lines(shared_tmp, job)[0]
    assert first == "first" and culprit in expand_hostlist(nodes) and len(expand_hostlist(nodes)) == 2
    wait_until(
        f"{culprit} drained by its failed epilog",
        lambda: slurm.node(culprit).reason == "Epilog error",
        timeout=60,
    )
    code, doc = health.run(culprit)
    assert (code, doc["status"], doc["sync"]) == (0, "fail", "the epilog failed this node")
    assert slurm.node(culprit).reason == f"stune: {REASON}"
    assert (
        f"requeued job {job} without {culprit} (it failed on {','.join(expand_hostlist(nodes))})"
        in doc["notes"]
    )
    if lines(shared_tmp, declined)[0][1] == culprit:  # it broke the same node (both usually run on n[1-2])
        assert any(n.startswith(f"job {declined} not requeued: Requeue=0") for n in doc["notes"]), doc[
            "notes"
        ]
    # recorded: the job's own record, the node's state, the log line
    record = slurm.job_record(job)
    assert record["ExcNodeList"] == culprit and record["Restarts"] == "1"
    assert f"stune: requeued once without {culprit}: {REASON}" in slurm.job(job).comment
    held = state.read(str(health.base(culprit) / "state"))[0]
    assert [(e["job"], e["node"], e["form"]) for e in held["requeued"]] == [(job, culprit, "requeue")]
    log = (health.base(culprit) / "state/health.log").read_text()
    assert f"requeued job {job} without {culprit}" in log
    assert slurm.job_record(declined)["JobState"] == "FAILED"  # the user said --no-requeue
    # once: the next runs requeue nothing more
    for _ in range(2):
        _code, doc = health.run(culprit)
        assert not any(n.startswith(f"requeued job {job}") for n in doc["notes"])
    wait_until("the requeued job to start", lambda: start_now(slurm, job), timeout=90, interval=1)
    assert settled(slurm, job) == "COMPLETED"
    again = lines(shared_tmp, job)[-1]
    assert again[0] == "again" and culprit not in expand_hostlist(again[1])
    assert slurm.job_record(job)["Restarts"] == "1"  # requeued once
    health.port(culprit, "mlx5_2")
    code, doc = health.run(culprit)
    assert (code, doc["status"]) == (0, "ok") and not slurm.node(culprit).drain


def expedited(slurm, cluster):
    if not slurm.expedited_requeue():
        pytest.skip(f"Slurm {slurm.version()} has no --requeue=expedite as stune uses it (25.11.3+)")
    cluster.set_fragment("expedite", "SlurmctldParameters=enable_expedited_requeue", reconfigure=False)
    cluster.restart_controller()


@pytest.fixture
def expedite(cluster, slurm):
    expedited(slurm, cluster)
    yield
    cluster.set_fragment("expedite", None, reconfigure=False)
    cluster.restart_controller()


def stune_sbatch(health, shared_tmp, script: str) -> int:
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "stune-sbatch"),
            "--parsable",
            "-p",
            "hdr",
            "-N2",
            "--open-mode=append",
            "-o",
            str(shared_tmp / "rq-%j.txt"),
            "--wrap",
            script,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, STUNE_PARTITIONS=health.env["STUNE_PARTITIONS"]),
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def test_slurms_expedited_requeue_restarts_the_job_at_once_and_stune_does_not_requeue_it_again(
    health, slurm, shared_tmp, expedite
):
    health.all_healthy()
    job = stune_sbatch(health, shared_tmp, breaking_job(health, shared_tmp))
    assert slurm.job_record(job).get("ExpeditedRequeue") == "Yes"  # stune-sbatch asked for it
    assert settled(slurm, job) == "COMPLETED"  # restarted at once: no requeue delay
    first, again = lines(shared_tmp, job)[0], lines(shared_tmp, job)[-1]
    culprit = first[1]
    assert again[0] == "again" and culprit not in expand_hostlist(again[1])
    assert slurm.node(culprit).reason == "Epilog error"
    code, doc = health.run(culprit)
    assert (code, doc["status"]) == (0, "fail") and not any("requeued job" in n for n in doc["notes"])
    assert slurm.job_record(job)["Restarts"] == "1"


def test_a_job_slurm_held_after_an_expedited_requeue_is_released_without_the_node(
    health, slurm, shared_tmp, expedite
):
    health.all_healthy()
    # the first run leaves a counter that reads as garbage (unknown: the epilog passes, so Slurm holds the job)
    job = stune_sbatch(health, shared_tmp, breaking_job(health, shared_tmp, garbage=True))
    wait_until(
        "Slurm to hold the job", lambda: slurm.job_record(job).get("JobState") == "REQUEUE_HOLD", timeout=90
    )
    culprit = lines(shared_tmp, job)[0][1]
    assert not slurm.node(culprit).drain
    health.port(culprit, "mlx5_2", "1: DOWN", "3: Disabled")  # what the periodic run then finds
    code, doc = health.run(culprit)
    assert (code, doc["status"]) == (0, "fail") and slurm.node(culprit).reason == f"stune: {REASON}"
    assert f"released job {job} without {culprit} (Slurm held it after its expedited requeue)" in doc["notes"]
    assert settled(slurm, job) == "COMPLETED"
    again = lines(shared_tmp, job)[-1]
    assert again[0] == "again" and culprit not in expand_hostlist(again[1])
    assert slurm.job_record(job)["ExcNodeList"] == culprit
