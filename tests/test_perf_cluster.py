"""The node counters on the live dev cluster: a real job, the real prolog and epilog hooks as `stune-admin
install` placed them, one `stune-gpu-sampler` per node reading a DGX A100 IB node tree (test_counters) that a
stand-in advances while the job runs. The dev cluster runs proctrack/linuxproc and task/none: no job cgroup,
so the CPU time is unmeasured, and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import wait_for_state, wait_until
from test_counters import Counters, ib_node, storage_node
from test_perf import HDR, perf_snapshot
from usage_helpers import hermetic_env

from slurm_tune.usage import perf, perfrec
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster
VENV_BIN = os.path.dirname(sys.executable)
PATHS = ("--cache", "/local/nvme/stune-cache", "--source", "/datasets/imagenet", "--source", "/lustre/proj")


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("perf")
    spool = root / "spool"
    spool.mkdir()
    spool.chmod(0o2775)
    cluster.install_stune(STUNE_USAGE_SPOOL=str(spool))
    trees = {n: storage_node(ib_node(root / f"tree-{n}")) for n in NODES}
    env = hermetic_env(root)
    samplers = {}
    for n in NODES:
        snap = perf_snapshot(root / f"gpus-{n}.json", 30, gpus=4)
        samplers[n] = subprocess.Popen(
            [
                f"{VENV_BIN}/stune-gpu-sampler",
                "run",
                "--gpu-snapshot",
                snap,
                "--local-dir",
                str(cluster.layout.node_dir(n) / "usage"),
                "--interval",
                "0.2",
                "--sysfs-root",
                str(trees[n]),
                *PATHS,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / f"sampler-{n}.log", "w"),  # noqa: SIM115 (handed to the sampler)
        )
    try:
        yield {"spool": spool, "trees": trees, "root": root}
    finally:
        for proc in samplers.values():
            proc.terminate()
        for proc in samplers.values():
            proc.wait(timeout=30)
        cluster.install_stune()  # the site's own env file back


def test_a_real_job_gets_the_counters_of_its_node(world, cluster, slurm, shared_tmp):
    stand_in = Counters(world["trees"]["n1"])
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            stand_in.ib("mlx5_0", int(0.6 * HDR * 0.05), int(0.6 * HDR * 0.05))  # 60 % of line rate
            stand_in.disk("9:127", 10**8, 45)  # 2 GB/s, 90 % busy
            stand_in.nfs(5 * 10**6)
            time.sleep(0.05)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
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
                "-w",
                "n1",
                "--gres=gpu:2",
                f"--chdir={shared_tmp}",
                "--wrap",
                "sleep 8",
            ]
        )
        assert rc == 0, err
        job = out.strip().split(";")[0]
        assert wait_for_state(slurm, int(job), ("COMPLETED", "FAILED"), timeout=120) == "COMPLETED"
    finally:
        stop.set()
        thread.join()
    summary_file = world["spool"] / job / "n1.json"
    wait_until(f"job {job}'s node summary", summary_file.exists, timeout=60)
    doc = json.loads(summary_file.read_text())
    p = doc["perf"]
    assert p["sampled_s"] > 3 and p["shared_s"] == 0.0
    port = next(x for x in p["net"]["ports"] if x["name"] == "mlx5_0/1")
    assert 0.2 < port["tx"] / port["cap"] < 1.0  # ~60 %; the stand-in's timing on a loaded machine
    md = next(d for d in p["storage"]["devices"] if d["name"] == "md127")
    assert md["roles"] == ["cache"] and md["read"] > 0 and 0.3 < md["busy"] / md["busy_s"] <= 1.0
    assert p["cpu"]["why"] == "no-cgroup" and p["cpu"]["over_s"] == 0.0  # proctrack/linuxproc, task/none
    job_perf = perf.merge([doc])
    tokens = job_perf.tokens()
    assert "cpu_why=no-cgroup" in tokens and "sto_un=source:lustre-not-read" in tokens
    assert perf.parse_tokens(dict(t.split("=", 1) for t in tokens.split(" "))).tokens() == tokens
    record = cluster.layout.node_dir("n1") / "usage" / perfrec.PERF_DIR / job
    wait_until("the sampler to drop the ended job's record", lambda: not record.exists(), timeout=30)
