"""The foundation against the live local cluster: jobs, drains, SiteFactor and errors, through the adapter."""

from __future__ import annotations

import os
import stat

import pytest
from helpers import wait_for_state, wait_until

from slurm_tune.errors import SlurmError
from stune_dev.devcluster import GPUS_PER_NODE, NODES
from stune_dev.layout import DAVINCI_MAJOR, NPUS_PER_NODE

pytestmark = pytest.mark.cluster


def test_the_cluster_has_three_gpu_nodes_in_every_profile_partition(cluster, slurm):
    nodes = slurm.nodes()
    assert sorted(n.name for n in nodes) == list(NODES)
    every = {"amd", "ascend", "hdr", "roce", "vpc"}  # one per shipped profile
    for node in nodes:
        assert node.gres == f"gpu:{GPUS_PER_NODE},npu:{NPUS_PER_NODE}"  # the ascend partition's NPUs too
        assert set(node.partitions) == every
        assert "gres/gpu=4" in node.tres and "gres/npu=4" in node.tres
    assert {p.name for p in slurm.partitions()} == every
    assert slurm.default_partition() == "hdr"  # the first NVIDIA one, not amd
    for i in range(GPUS_PER_NODE):
        dev = os.stat(cluster.layout.dev / f"nvidia{i}")
        assert stat.S_ISCHR(dev.st_mode) and os.major(dev.st_rdev) == 195 and os.minor(dev.st_rdev) == i
    for i in range(NPUS_PER_NODE):
        dev = os.stat(cluster.layout.dev / f"davinci{i}")
        assert (
            stat.S_ISCHR(dev.st_mode)
            and os.major(dev.st_rdev) == DAVINCI_MAJOR
            and os.minor(dev.st_rdev) == i
        )


def test_up_twice_is_harmless(cluster, slurm):
    before = {n: (cluster.layout.run / f"slurmd-{n}.pid").read_text() for n in NODES}
    cluster.up(install=False)
    after = {n: (cluster.layout.run / f"slurmd-{n}.pid").read_text() for n in NODES}
    assert before == after  # nothing restarted
    assert all(cluster.status().values())


def test_a_gpu_job_runs_to_completion_and_sacct_shows_its_gpus(slurm, shared_tmp):
    job_id = slurm.submit(
        ["--gres=gpu:2", "-N1", f"--chdir={shared_tmp}", "-o", "out-%j.txt"],
        script="#!/bin/bash\necho gpus=$CUDA_VISIBLE_DEVICES\n",
    )
    assert wait_for_state(slurm, job_id, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"out-{job_id}.txt").read_text().strip() == "gpus=0,1"
    row = slurm.sacct(["JobID", "State", "AllocTRES", "User"], job_ids=[str(job_id)])[0]
    assert "gres/gpu=2" in row["AllocTRES"]
    assert row["User"] == "root"


def test_a_test_user_runs_a_job_under_their_own_account(slurm, shared_tmp):
    script = shared_tmp / "job.sh"
    script.write_text("#!/bin/bash\nid -un\n")
    rc, out, err = slurm.run_full(
        [
            "runuser",
            "-u",
            "stune-alice",
            "--",
            "sbatch",
            "--parsable",
            "-A",
            "physics",
            f"--chdir={shared_tmp}",
            "-o",
            "alice-%j.txt",
            "--gres=gpu:1",
            str(script),
        ]
    )
    assert rc == 0, err
    job_id = int(out.strip())
    assert wait_for_state(slurm, job_id, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"alice-{job_id}.txt").read_text().strip() == "stune-alice"
    row = slurm.sacct(["JobID", "User", "Account"], job_ids=[str(job_id)])[0]
    assert (row["User"], row["Account"]) == ("stune-alice", "physics")


def test_drain_with_a_reason_shows_in_sinfo_and_resume_clears_it(slurm):
    slurm.drain("n2", "stune: mlx5_2/1 state DOWN")
    node = slurm.node("n2")
    assert node.drain and node.reason == "stune: mlx5_2/1 state DOWN"
    sinfo = slurm.run(["sinfo", "-h", "-N", "-n", "n2", "-p", "hdr", "-o", "%N|%t|%E"]).strip()
    assert sinfo == "n2|drain|stune: mlx5_2/1 state DOWN"
    slurm.resume("n2")
    node = slurm.node("n2")
    assert not node.drain and node.reason == ""
    # Slurm pings a resumed node before it shows plain idle again ("idle*" for a moment).
    wait_until(
        "n2 idle",
        lambda: slurm.run(["sinfo", "-h", "-N", "-n", "n2", "-p", "hdr", "-o", "%t"]).strip() == "idle",
    )


def test_features_and_comment_can_be_set_on_a_node(slurm):
    slurm.update_node("n3", features={"stune_degraded"})
    slurm.update_node("n3", comment="stune: mlx5_0/1 rate 100 Gb/sec, expected 200")  # leaves the features
    node = slurm.node("n3")
    assert node.feature_set == {"stune_degraded"} == node.active_feature_set
    assert node.comment == "stune: mlx5_0/1 rate 100 Gb/sec, expected 200"


def test_site_factor_is_visible_in_sprio(slurm):
    # Fill every GPU so the next two jobs pend; sprio only lists pending jobs.
    blocker = slurm.submit(["-N3", "--exclusive", "--gres=gpu:4", "--wrap", "sleep 120"])
    pending = [slurm.submit(["-N1", "--gres=gpu:1", "--wrap", "true"]) for _ in range(2)]
    slurm.set_site_factor(pending[1], 4321)
    rows = {r.job_id: r for r in slurm.sprio(pending)}
    assert rows[pending[1]].site == 4321
    assert rows[pending[0]].site == 0
    assert rows[pending[1]].priority - rows[pending[0]].priority == 4321
    slurm.cancel([blocker, *pending])


def test_a_slurm_error_carries_slurms_own_message(slurm):
    with pytest.raises(SlurmError) as info:
        slurm.submit(["-p", "no-such-partition", "--wrap", "true"])
    assert info.value.returncode == 1
    assert "invalid partition specified: no-such-partition" in info.value.message
    assert info.value.command[:2] == ["sbatch", "--parsable"]


def test_a_user_cannot_write_admin_fields(slurm):
    job_id = slurm.submit(["--wrap", "true"])
    wait_for_state(slurm, job_id, ("COMPLETED",))
    rc, _, err = slurm.run_full(
        [
            "runuser",
            "-u",
            "stune-bob",
            "--",
            "sacctmgr",
            "-i",
            "modify",
            "job",
            "where",
            f"JobID={job_id}",
            "set",
            "AdminComment=fake",
        ]
    )
    assert rc != 0 and "privilege" in err
    slurm.set_admin_comment(job_id, "stune-test")
    assert slurm.sacct(["JobID", "AdminComment"], job_ids=[str(job_id)])[0]["AdminComment"] == "stune-test"


def test_accounting_and_priority_are_configured_for_fair_share(slurm):
    conf = slurm.config()
    assert conf["PriorityType"] == "priority/multifactor"
    assert int(conf["PriorityWeightFairShare"]) > 0
    assert "gres/gpu" in conf["AccountingStorageTRES"]
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    users = {(r.account, r.user) for r in slurm.sshare()}
    assert {("physics", "stune-alice"), ("biology", "stune-bob")} <= users
