"""Accounting for AMD and Ascend devices on the live local cluster (issue 26 §4): an idle NPU is charged like an
idle GPU, a busy one is not, and the same on the AMD partition.

Like test_fairshare_cluster.py: the real hooks as `stune-admin install` placed them (prolog 20-stune-jobgpus,
epilog 20-stune-usage, EpilogSlurmctld stune-usage-slurmctld), `PrologFlags=Alloc`, and one `stune-gpu-sampler`
per node, here each told its node's partition as a real node is (`--partition`): n1 NVIDIA (hdr), n2 Ascend,
n3 AMD, or two Ascend nodes for a 2-node job. The devices are replay files with an `accel` section (hw/accel.py:
amdsmi's and npu-smi's readings), or for Ascend the stand-in npu-smi of the node's tools directory
(STUNE_ACCEL_TOOLS, its state.json) where this stune has hw/ascend.py and the stand-ins. The replay files are
this module's own, not the nodes' gpus.json, which the health hooks judge.

Slurm names an npu job's devices in no Prolog environment (tests/fixtures/slurm-gres/README.md), so the prolog
records `?` and each Ascend node's sampler asks `scontrol show job -d` once per job. The charge is read as a
user reads it, `stune-job JOBID --json` (charged_x: Slurm's usage times 1 + alpha (1 - eta), alpha 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for_state, wait_until
from usage_helpers import accounting_hooks, start_sampler, stop_samplers, write_snapshot

from slurm_tune import safeio
from slurm_tune.usage import summary
from stune_dev.accel import amd_section, ascend_section
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = os.path.dirname(sys.executable)
FRAGMENT = "stune-accel-usage-test"


class Rig:
    def __init__(self, cluster, root: Path):
        self.cluster, self.root = cluster, root
        self.spool, self.config, self.store_log = root / "spool", root / "fairshare.yaml", root / "store.log"
        self.replay = {n: root / f"replay-{n}.json" for n in NODES}
        self.local = {n: cluster.layout.node_dir(n) / "usage" for n in NODES}
        self.samplers: dict[str, subprocess.Popen] = {}

    def env(self) -> dict:
        return {
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": str(REPO),  # this checkout's stune, for the samplers and the commands
            "STUNE_FAIRSHARE_CONFIG": str(self.config),
            "STUNE_ACCEL_TOOLS": self.cluster.site_settings()["STUNE_ACCEL_TOOLS"],
            "SLURM_CONF": os.environ["SLURM_CONF"],
        }

    def start(self, partitions: dict[str, str], live: bool = False) -> None:
        """One sampler per node of `partitions` (node -> the partition whose profile it has), reading its replay
        file, or on Ascend nodes with `live` the stand-in npu-smi."""
        stop_samplers(self.samplers.values())
        self.samplers = {}
        for node, partition in partitions.items():
            self.samplers[node] = start_sampler(
                None if live else self.replay[node],
                self.local[node],
                self.env(),
                self.root / f"sampler-{node}-{partition}.log",
                *("--partition", partition, "--node", node, "--no-perf"),
            )

    def set_replay(self, node: str, *, gpus: dict | None = None, accel: dict | None = None) -> None:
        """The node's replay file: an NVIDIA `gpus` section ({"sm": %, "procs": n}) or an `accel` section."""
        path = self.replay[node]
        if gpus is not None:
            write_snapshot(path, gpus["sm"], gpus=4, procs=gpus["procs"], power=300.0 if gpus["sm"] else 60.0)
            return
        safeio.write_atomic(str(path), json.dumps({"accel": accel}), mode=0o644)

    def charge(self, job: int) -> dict:
        proc = subprocess.run(
            [f"{VENV_BIN}/stune-job", str(job), "--json"],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def log(self, node: str) -> str:
        return "".join(p.read_text() for p in self.root.glob(f"sampler-{node}-*.log"))


@pytest.fixture(scope="module")
def rig(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("accel-usage")
    r = Rig(cluster, root)
    r.spool.mkdir()
    r.spool.chmod(0o2775)
    r.config.write_text(
        f"accountant:\n  state_dir: {root / 'state'}\n  settle_delay: 0\n"
        f"usage:\n  spool_dir: {r.spool}\n  interval: 0.2\n  collect_wait: 20\n"
    )
    # the hooks' `stune-gpu-sampler epilog` and the store run this checkout's stune (the env file is their
    # environment), whichever checkout the venv's editable install names
    this = {"PYTHONPATH": str(REPO)}
    with accounting_hooks(
        cluster,
        root,
        FRAGMENT,
        spool=r.spool,
        config=r.config,
        store_log=r.store_log,
        settings=this,
        ctld_env=this,
    ):
        try:
            yield r
        finally:
            stop_samplers(r.samplers.values())
            for node in NODES:
                cluster.write_npu_state(node)  # healthy and idle again


def submit(slurm, shared_tmp, args: list[str], seconds: int = 8) -> int:
    return slurm.submit([*args, "-c", "1", f"--chdir={shared_tmp}", "--wrap", f"sleep {seconds}"])


def stored(slurm, job: int) -> summary.JobSummary:
    def comment():
        rows = slurm.sacct(["JobIDRaw", "AdminComment"], job_ids=[str(job)])
        text = rows[0]["AdminComment"] if rows else ""
        return text if text.startswith(summary.PREFIX) else None

    parsed = summary.parse(wait_until(f"job {job}'s usage summary in AdminComment", comment, timeout=60))
    assert parsed is not None
    return parsed


def finish(slurm, jobs: list[int]) -> None:
    for job in jobs:
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED"), timeout=120) == "COMPLETED"


def test_an_idle_npu_and_an_idle_amd_gpu_are_charged_like_an_idle_gpu_and_busy_ones_are_not(
    rig, slurm, shared_tmp
):
    rig.start({"n1": "hdr", "n2": "ascend", "n3": "amd"})
    for busy in (False, True):
        util, procs = (90.0, 1) if busy else (0.0, 0)
        rig.set_replay("n1", gpus={"sm": util, "procs": procs})
        # idle: AICore 0 % and no process; a stale reading with no process would be idle all the same
        rig.set_replay("n2", accel=ascend_section(aicore=util, procs=procs))
        rig.set_replay("n3", accel=amd_section(util=util, procs=procs))
        jobs = {
            "gpu": submit(slurm, shared_tmp, ["-p", "hdr", "-w", "n1", "--gres=gpu:2"]),
            "npu": submit(slurm, shared_tmp, ["-p", "ascend", "-w", "n2", "--gres=npu:2"]),
            "amd": submit(slurm, shared_tmp, ["-p", "amd", "-w", "n3", "--gres=gpu:2"]),
        }
        finish(slurm, list(jobs.values()))
        for kind, job in jobs.items():
            s = stored(slurm, job)
            assert (s.gpus, s.nodes_reported) == (2, 1), kind
            assert s.coverage > 0.8 and s.eta == pytest.approx(util / 100, abs=0.01), kind
        views = {kind: rig.charge(job) for kind, job in jobs.items()}
        for kind, view in views.items():
            assert view["gpus"] == 2 and view["trusted"], (kind, view["why"])
            assert view["charged_x"] == pytest.approx(1.1 if busy else 2.0, abs=0.01), (kind, view["why"])
        # the NPUs are Slurm's gres/npu ids, read through scontrol by n2's sampler (the prolog had none)
        assert {g["node"] for g in views["npu"]["per_gpu"]} == {"n2"}
        assert {g["gpu"] for g in views["npu"]["per_gpu"]} == {"0", "1"}
    assert "gres/npu ids from Slurm per job" in rig.log("n2")


def test_a_two_node_npu_job_is_measured_on_both_nodes(rig, slurm, shared_tmp):
    rig.start({"n2": "ascend", "n3": "ascend"})
    rig.set_replay("n2", accel=ascend_section(aicore=80.0, procs=1))
    rig.set_replay("n3", accel=ascend_section(aicore=20.0, procs=1))
    cpu = submit(slurm, shared_tmp, ["-p", "ascend", "-w", "n2"], seconds=2)  # no NPUs: nothing to store
    job = submit(slurm, shared_tmp, ["-p", "ascend", "-N2", "-w", "n[2-3]", "--gres=npu:1"])
    finish(slurm, [cpu, job])
    merged = stored(slurm, job)
    assert (merged.gpus, merged.nodes_reported, merged.nodes_expected) == (2, 2, 2)
    assert {g.node: round(g.sm) for g in merged.per_gpu} == {"n2": 80, "n3": 20}
    assert merged.eta == pytest.approx(0.5, abs=0.02)
    wait_until(
        "EpilogSlurmctld's verdict", lambda: f"job {cpu}: no GPUs" in rig.store_log.read_text(), timeout=30
    )


def test_live_npu_smi_idle_and_busy(rig, slurm, shared_tmp):
    """The live path: n2's sampler runs the stand-in npu-smi (its state.json) through hw/ascend.py."""
    pytest.importorskip("slurm_tune.hw.ascend", reason="hw/ascend.py is not in this stune yet")
    tools = rig.cluster.layout.accel_tools("n2")
    if not (tools / "npu-smi").exists():
        pytest.skip("no stand-in npu-smi in tests/accel_standins/")
    rig.start({"n2": "ascend"}, live=True)
    charged = {}
    for busy in (False, True):
        state = rig.cluster.npu_state("n2")
        for npu in state["npus"]:
            npu["aicore_pct"] = 90 if busy else 0
            npu["processes"] = [{"pid": 4242, "name": "python3", "mem_mb": 4096}] if busy else []
        rig.cluster.write_npu_state("n2", state)
        job = submit(slurm, shared_tmp, ["-p", "ascend", "-w", "n2", "--gres=npu:2"])
        finish(slurm, [job])
        assert stored(slurm, job).eta == pytest.approx(0.9 if busy else 0.0, abs=0.01)
        charged[busy] = rig.charge(job)["charged_x"]
    assert charged == {False: pytest.approx(2.0, abs=0.01), True: pytest.approx(1.1, abs=0.01)}
    rig.cluster.write_npu_state("n2")  # healthy and idle again
