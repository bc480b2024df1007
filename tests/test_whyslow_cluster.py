""" "Why is my training slow?" on the live dev cluster, end to end (issue 24): the real prolog, TaskProlog and
epilog hooks as `stune-admin install` placed them, EpilogSlurmctld storing the job's record in AdminComment,
one `stune-gpu-sampler` per node reading a node tree (test_counters) that a stand-in advances while jobs
run, and `stune-job` run by the job's user.

- a job whose GPUs go in a sawtooth while the cache tier's device (where its dataset is) reads near its
  node's fio baseline is called storage-bound, with the rate and the baseline;
- a 2-node job's NCCL logs, written where the TaskProlog pointed NCCL_DEBUG_FILE, are judged on each node:
  a socket log on the IB partition is a fallback, named per node, and recorded in the nodes' health state;
- a real 2-node gloo job (torch on CPU), which has no NCCL log, is "not judged";
- two submissions that write steps files through docs/steps.md's snippet: `stune-sbatch history diff`
  shows the throughput change with its cause.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import slurm_exports, slurm_path, wait_for_state, wait_until
from test_counters import Counters, ib_node, storage_node
from test_perf import perf_snapshot
from test_steps_snippet import SETUP, snippet
from usage_helpers import start_sampler, stop_samplers

from slurm_tune.active import store
from slurm_tune.health import state
from slurm_tune.usage import summary
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = os.path.dirname(sys.executable)
FRAGMENT = "stune-whyslow-test"
CACHE, SOURCE = "/local/nvme/stune-cache", "/local/nvme/datasets"  # both on md127 in the node tree
BASELINE_GBPS = 3.05
READ_BPS = 2.9e9


class World:
    def __init__(self, cluster, root: Path):
        self.cluster, self.root = cluster, root
        self.spool, self.active = root / "spool", root / "active"
        self.config = root / "fairshare.yaml"
        self.trees = {n: storage_node(ib_node(root / f"tree-{n}")) for n in NODES}
        self.snapshots = {n: root / f"gpus-{n}.json" for n in NODES}
        self.samplers: dict[str, subprocess.Popen] = {}

    def env(self, **more: str) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "STUNE_FAIRSHARE_CONFIG": str(self.config),
            "STUNE_ACTIVE_DIR": str(self.active),
            "SLURM_CONF": os.environ["SLURM_CONF"],
            **more,
        }

    def stune_job(self, job: int, *args: str, user: str = "stune-alice") -> subprocess.CompletedProcess:
        keep = ("PATH", "STUNE_FAIRSHARE_CONFIG", "STUNE_ACTIVE_DIR", "SLURM_CONF", "STUNE_SLURM_BIN")
        env = [f"{k}={v}" for k, v in self.env().items() if k in keep]
        return subprocess.run(
            ["runuser", "-u", user, "--", "env", *env, f"{VENV_BIN}/stune-job", str(job), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )


def open_up(path: Path) -> None:
    """The test users must read the world's files (config, store) and the captures."""
    for p in [path, *path.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)


@pytest.fixture(scope="module")
def world(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("whyslow")
    w = World(cluster, root)
    w.spool.mkdir()
    w.spool.chmod(0o2775)
    w.config.write_text(
        f"accountant:\n  state_dir: {root / 'state'}\n  settle_delay: 0\n"
        f"usage:\n  spool_dir: {w.spool}\n  interval: 0.2\n  collect_wait: 20\n"
    )
    fp = dict.fromkeys(store.FINGERPRINT_KEYS, "test")
    store.append(
        str(w.active),
        "hdr",
        [
            {
                "at": time.time() - 600,
                "sweep": "t",
                "partition": "hdr",
                "check": "disk_read",
                "subject": n,
                "nodes": [n],
                "status": "ok",
                "value": BASELINE_GBPS,
                "unit": "GB/s",
                "fingerprint": fp,
            }
            for n in NODES
        ],
    )
    open_up(root)
    for n in NODES:
        perf_snapshot(w.snapshots[n], 30, gpus=4)
    cluster.install_stune(
        STUNE_USAGE_SPOOL=str(w.spool), STUNE_FAIRSHARE_CONFIG=str(w.config), STUNE_ACTIVE_DIR=str(w.active)
    )
    ctld = root / "epilog-slurmctld"
    ctld.write_text(
        f"#!/bin/sh\nexport PATH={slurm_path(f'{VENV_BIN}:/usr/bin:/bin')} {slurm_exports()} "
        f"STUNE_BIN={VENV_BIN} STUNE_FAIRSHARE_CONFIG={w.config} STUNE_USAGE_SPOOL={w.spool} "
        f"STUNE_USAGE_DIR=/nonexistent STUNE_USAGE_LOG={root / 'store.log'}\n"
        f"exec {REPO}/epilog/stune-usage-slurmctld\n"
    )
    ctld.chmod(0o755)
    task_prolog = cluster.site_root / "etc" / "slurm" / "stune-task-prolog"  # where install placed it
    cluster.set_fragment(
        FRAGMENT, f"EpilogSlurmctld={ctld}\nPrologFlags=Alloc\nTaskProlog={task_prolog}", reconfigure=False
    )
    cluster.restart_controller()
    for n in NODES:
        w.samplers[n] = start_sampler(
            w.snapshots[n],
            cluster.layout.node_dir(n) / "usage",
            w.env(),
            root / f"sampler-{n}.log",
            *("--sysfs-root", str(w.trees[n]), "--cache", CACHE, "--source", SOURCE),
        )
    try:
        yield w
    finally:
        try:
            stop_samplers(w.samplers.values())
            cluster.install_stune()
        finally:  # the fragment goes even when the above fails: a later run's slurmctld would not start on it
            cluster.set_fragment(FRAGMENT, None, reconfigure=False)
            cluster.restart_controller()


def submit_as(slurm, args: list[str], wrap: str, user: str = "stune-alice") -> int:
    rc, out, err = slurm.run_full(
        [
            "runuser",
            "-u",
            user,
            "--",
            "env",
            "-u",
            "STUNE_ENV_FILE",  # the test process's hermetic one must not reach the job: the site's is read
            "sbatch",
            "--parsable",
            "-A",
            "physics",
            "-p",
            "hdr",
            *args,
            "--wrap",
            wrap,
        ]
    )
    assert rc == 0, err
    return int(out.strip().split(";")[0])


def admin_comment(slurm, job: int) -> str:
    rows = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job)])
    return rows[0]["AdminComment"] if rows else ""


def wait_record(slurm, job: int, key: str) -> str:
    """The job's AdminComment once EpilogSlurmctld stored it with `key` in it."""
    return wait_until(
        f"job {job}'s record with {key} in AdminComment",
        lambda: (
            (text := admin_comment(slurm, job)).startswith(summary.PREFIX) and f" {key}=" in text and text
        ),
        timeout=90,
        interval=0.5,
    )


def test_a_sawtooth_job_reading_its_dataset_near_the_devices_baseline_is_storage_bound(
    world, slurm, shared_tmp
):
    stand_in = Counters(world.trees["n1"])
    stop = threading.Event()

    def loader() -> None:  # the dataset read at READ_BPS while the GPUs go up and down
        last, flip, busy = time.monotonic(), time.monotonic(), True
        while not stop.is_set():
            time.sleep(0.05)
            now = time.monotonic()
            stand_in.disk("9:127", int(READ_BPS * (now - last)), int(900 * (now - last)))
            last = now
            if now - flip >= 0.6:
                flip, busy = now, not busy
                perf_snapshot(world.snapshots["n1"], 92 if busy else 3, gpus=4)

    thread = threading.Thread(target=loader)
    thread.start()
    try:
        job = submit_as(slurm, ["-w", "n1", "--gres=gpu:2", f"--chdir={shared_tmp}"], "sleep 12")
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=120) == "COMPLETED"
    finally:
        stop.set()
        thread.join()
        perf_snapshot(world.snapshots["n1"], 30, gpus=4)
    wait_record(slurm, job, "pf_nodes")
    out = world.stune_job(job)
    assert out.returncode == 0, out.stderr
    why = next(line for line in out.stdout.splitlines() if line.startswith("  why: "))
    m = re.fullmatch(
        r"  why: GPU (\d+) % in a sawtooth while the cache tier and dataset source md127 read at ([\d.]+) GB/s, "
        r"(\d+) % of n1's fio baseline: storage-bound",
        why,
    )
    assert m, out.stdout
    assert 20 <= int(m[1]) <= 75 and 2.0 <= float(m[2]) <= 3.8 and int(m[3]) >= 70
    assert "--stage" in out.stdout
    doc = json.loads(world.stune_job(job, "--json").stdout)
    assert doc["bottleneck"]["bound"] == "storage" and doc["series"]["storage"]
    png = shared_tmp / "timeline.png"
    assert world.stune_job(job, "--png", str(png)).returncode == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_nccl_logs_on_two_nodes_are_judged_and_a_fallback_is_recorded_per_node(world, slurm, shared_tmp):
    capture = shared_tmp / "socket.log"
    capture.write_bytes((REPO / "tests/fixtures/comm/nccl-socket-ncclTests179.txt").read_bytes())
    capture.chmod(0o644)
    # each rank writes the capture where NCCL would, NCCL_DEBUG_FILE's %h and %p filled in
    rank = (
        'echo "$SLURMD_NODENAME NCCL_DEBUG=$NCCL_DEBUG SUBSYS=$NCCL_DEBUG_SUBSYS"; '
        'f=$(printf %s "$NCCL_DEBUG_FILE" | sed "s/%h/$(hostname)/; s/%p/$$/"); cp '
        f"{capture} " + '"$f"'
    )
    job = submit_as(slurm, ["-N", "2", "-w", "n[1-2]", "--gres=gpu:1", f"--chdir={shared_tmp}"],
                    f"srun -N2 -n2 sh -c '{rank}'")  # fmt: skip
    ended = wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=120)
    output = (shared_tmp / f"slurm-{job}.out").read_text()
    assert ended == "COMPLETED", output
    assert output.count("NCCL_DEBUG=INFO SUBSYS=INIT,NET") == 2, output
    wait_record(slurm, job, "comm")
    out = world.stune_job(job)
    assert out.returncode == 0, out.stderr
    assert "transport: IB partition, but ranks on n[1-2] used NET/Socket" in out.stdout, out.stdout
    doc = json.loads(world.stune_job(job, "--json").stdout)
    assert doc["transport"]["status"] == "fallback" and doc["transport"]["judged"] == 2
    for n in ("n1", "n2"):
        held, _ = state.read(str(world.cluster.layout.node_dir(n) / "health"))
        assert [j[0] for j in held.get("comm_jobs", []) if j[2] == "fallback"][-1:] == [str(job)]
        assert not (world.cluster.layout.node_dir(n) / "usage" / "run" / str(job)).exists()


GLOO_RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
t = torch.ones(4)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
print("gloo all_reduce ok on", os.environ["SLURMD_NODENAME"], "NCCL_DEBUG=" + os.environ.get("NCCL_DEBUG", ""))
dist.destroy_process_group()
"""


def test_a_real_two_node_gloo_job_has_no_nccl_log_and_is_not_judged(world, slurm, shared_tmp):
    script = shared_tmp / "gloo_rank.py"
    script.write_text(GLOO_RANK)
    script.chmod(0o644)
    # the dev cluster's nodes share this machine: the rendezvous on loopback, stune's MASTER_PORT
    wrap = f"MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo srun -N2 -n2 {sys.executable} {script}"
    job = submit_as(slurm, ["-N", "2", "-w", "n[2-3]", "--gres=gpu:1", f"--chdir={shared_tmp}"], wrap)
    ended = wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=180)
    output = (shared_tmp / f"slurm-{job}.out").read_text()
    assert ended == "COMPLETED" and output.count("gloo all_reduce ok on n") == 2, output
    assert "NCCL_DEBUG=INFO" in output  # stune asked for NCCL's log; gloo wrote none
    wait_record(slurm, job, "comm")
    doc = json.loads(world.stune_job(job, "--json").stdout)
    assert doc["transport"]["status"] == "not_judged" and doc["transport"]["judged"] == 0
    assert any("not judged" in m for m in doc["transport"]["messages"])


def test_history_diff_shows_the_throughput_change_between_two_real_jobs_with_its_cause(
    world, slurm, shared_tmp
):
    script = shared_tmp / "train.py"
    script.write_text(
        SETUP.format(batches=40, loader_s='float(__import__("os").environ["STUNE_TEST_LOADER_S"])')
        + snippet()
    )
    env = world.env(STUNE_HISTORY=str(shared_tmp / "history.jsonl"))
    for name in [
        n
        for n in env
        if n.startswith(("SBATCH_", "STUNE_STAGE", "STUNE_MANAGED", "STUNE_STEPS", "STUNE_ENV"))
    ]:
        del env[name]
    jobs = []
    for loader_s in ("0", "0.05"):
        env["STUNE_TEST_LOADER_S"] = loader_s
        out = subprocess.run(
            [f"{VENV_BIN}/stune-sbatch", "--parsable", "-p", "hdr", "-w", "n3", "--gres=gpu:1",
             "-o", str(shared_tmp / "out-%j.txt"), "--wrap", f"{sys.executable} {script}"],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        jobs.append(int(out.stdout.strip().split(";")[0]))
    for job in jobs:
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=180) == "COMPLETED"
        wait_record(slurm, job, "sps")
    out = subprocess.run(
        [f"{VENV_BIN}/stune-sbatch", "history", "diff", str(jobs[0]), str(jobs[1])],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    head = out.stdout.splitlines()[1]
    assert re.fullmatch(
        r"samples/s [\d.]+ -> [\d.]+ \(-\d+ %\); data wait \d+ % -> \d+ %; (bound \w+ -> \w+; )?"
        r"STUNE_TEST_LOADER_S changed",
        head,
    ), head
    shown = world.stune_job(jobs[1], user="root").stdout  # submitted by root here
    assert re.search(
        r"throughput: [\d.]+ samples/s \([\d.]+-[\d.]+\), data wait \d+ % over 30 steps", shown
    ), shown
