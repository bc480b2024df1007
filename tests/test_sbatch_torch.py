"""The two template job scripts of docs/sbatch.md run a real 2-node PyTorch DDP job (gloo on CPU) on the dev
cluster through stune-sbatch: rendezvous on stune's MASTER_ADDR/MASTER_PORT (srun) or a c10d rendezvous on
them (torchrun), then USR1 to the batch shell, a checkpoint, `scontrol requeue`, and the requeued run
resumes from the checkpoint and appends to the same log.

The nodes use their real network interfaces here (no sysfs fixture): a test profile names the interface of
this machine's default route as the socket interface.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_until

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)
REPO = Path(__file__).resolve().parent.parent
TORCH = "2.13.0+cpu"


def require_torch() -> None:
    """Fail (not skip) with the reason when torch is missing: scripts/setup.sh installs it."""
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.fail(
            f"torch {TORCH} is not installed in {sys.prefix}: scripts/setup.sh installs it from a local "
            f"wheel (pip install 'torch=={TORCH}'); it said why it could not"
        )


def templates() -> dict[str, str]:
    """The blocks of docs/sbatch.md marked `<!-- template: NAME -->`."""
    text = (REPO / "docs" / "sbatch.md").read_text()
    found = dict(re.findall(r"<!-- template: (\S+) -->\n```\w*\n(.*?)```", text, re.S))
    assert set(found) == {"train-srun.sbatch", "train-torchrun.sbatch", "train_ddp.py"}
    return found


def default_interface() -> str:
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    pytest.fail("this machine has no default route: no interface for gloo to use")


@pytest.fixture(scope="module")
def real_nodes(cluster, tmp_path_factory):
    """A vpc profile whose socket interface is this machine's, and the TaskProlog on real sysfs."""
    require_torch()
    profiles = tmp_path_factory.mktemp("torch-profiles")
    profiles.chmod(0o755)
    (profiles / "site.yaml").write_text((REPO / "partitions" / "site.yaml").read_text())
    (profiles / "vpc.yaml").write_text(
        f"partition: vpc\nfabric:\n  type: tcp\n  socket_ifname: {default_interface()}\n"
    )
    wrapper = cluster.layout.root / "stune-task-prolog-torch.sh"
    wrapper.write_text(
        f"#!/bin/sh\nPATH={BIN}:/usr/bin:/bin; export PATH\n"
        f"STUNE_PARTITIONS={profiles}; export STUNE_PARTITIONS\nexec stune-task-prolog\n"
    )
    wrapper.chmod(0o755)
    cluster.set_fragment("sbatch", f"TaskProlog={wrapper}")
    yield profiles
    cluster.set_fragment("sbatch", None)


def job_state(slurm, job: int) -> str:
    out = slurm.run(["scontrol", "show", "job", "-o", str(job)], check=False)
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else "?"


def submit_template(template: str, profiles: Path, shared_tmp: Path, slurm, *args: str) -> int:
    for name, body in templates().items():
        (shared_tmp / name).write_text(body)
    env = dict(os.environ, STUNE_PARTITIONS=str(profiles), STUNE_HISTORY=str(shared_tmp / "history.jsonl"))
    for name in [n for n in env if n.startswith(("NCCL_", "GLOO_", "MASTER_", "SBATCH_", "STUNE_MANAGED"))]:
        del env[name]
    out = subprocess.run(
        [os.path.join(BIN, "stune-sbatch"), "--parsable", "-p", "vpc", template, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=shared_tmp,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    job = int(out.stdout)
    assert "Requeue=1" in slurm.run(["scontrol", "show", "job", str(job)])  # stune's --requeue
    return job


def stop_with_usr1(slurm, job: int, log: Path) -> int:
    """Once training runs, USR1 to the batch shell (what Slurm sends signal_seconds before the time limit);
    returns the epoch rank 0 checkpointed at, once the job is requeued."""
    wait_until("training under way", lambda: log.exists() and "epoch 4 " in log.read_text(), timeout=120)
    slurm.run(["scancel", "--batch", "--signal=USR1", str(job)])
    wait_until(
        "the requeue", lambda: "Restarts=1" in slurm.run(["scontrol", "show", "job", str(job)]), timeout=60
    )
    text = log.read_text()
    first = re.search(r"run 0 of job \d+ on n\[1-2\], master (\S+):(\d+)", text)
    assert first, text
    assert first.group(2) == str(12000 + job % 8000)
    from slurm_tune.nodeenv.detect import ipv4_address

    assert first.group(1) == (
        ipv4_address(default_interface()) or "n1"
    )  # the first node, on the profile's NIC
    assert "world 2" in text and "checkpoint written: requeueing" in text
    stopped = int(re.search(r"checkpoint at epoch (\d+)\n", text).group(1))
    assert 4 <= stopped < 59
    return stopped


def test_srun_template_trains_on_two_nodes_checkpoints_on_usr1_requeues_and_resumes(
    real_nodes, slurm, shared_tmp
):
    """The whole cycle. Slurm starts a requeued job again only after the job credential's lifetime
    (AuthInfo cred_expire, 120 s by default: an earlier start is killed with "Job credential revoked"), so
    this test waits about two minutes for the second run."""
    job = submit_template(
        "train-srun.sbatch", real_nodes, shared_tmp, slurm, "--epochs", "40", "--epoch-seconds", "0.25"
    )
    log = shared_tmp / f"train-{job}.out"
    try:
        stopped = stop_with_usr1(slurm, job, log)
        deadline = time.monotonic() + 240
        while job_state(slurm, job) != "COMPLETED":
            state = job_state(slurm, job)
            assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), (state, log.read_text())
            assert time.monotonic() < deadline, (state, log.read_text())
            time.sleep(1)
    finally:
        slurm.run(["scancel", str(job)], check=False)
    text = log.read_text()
    assert "run 1 of job" in text  # the requeued run appended to the same log (--open-mode=append)
    assert f"resumed from {shared_tmp}/ckpt-{job}.pt at epoch {stopped + 1}" in text
    assert "epoch 39 loss" in text and "checkpoint at epoch 39" in text


def test_torchrun_template_trains_on_two_nodes_and_checkpoints_and_requeues_on_usr1(
    real_nodes, slurm, shared_tmp
):
    """c10d rendezvous on stune's MASTER_ADDR:MASTER_PORT, two agents, USR1, checkpoint, requeue. (The resume
    is the same program as the srun test's; not waiting two more minutes for it here.)"""
    job = submit_template(
        "train-torchrun.sbatch", real_nodes, shared_tmp, slurm, "--epochs", "60", "--epoch-seconds", "0.25"
    )
    try:
        stop_with_usr1(slurm, job, shared_tmp / f"train-{job}.out")
        assert (shared_tmp / f"ckpt-{job}.pt").stat().st_size > 0
    finally:
        slurm.run(["scancel", str(job)], check=False)


def test_the_templates_get_the_signal_and_no_warning(real_nodes, shared_tmp):
    for name, body in templates().items():
        (shared_tmp / name).write_text(body)
    env = dict(os.environ, STUNE_PARTITIONS=str(real_nodes))
    for template in ("train-srun.sbatch", "train-torchrun.sbatch"):
        dry = subprocess.run(
            [os.path.join(BIN, "stune-sbatch"), "--dry-run", "-p", "vpc", template],
            capture_output=True,
            text=True,
            env=env,
            cwd=shared_tmp,
        )
        assert dry.returncode == 0, dry.stderr
        assert f"--signal=B:USR1@300 {template}" in dry.stdout
        trap_line = next(
            i for i, line in enumerate(templates()[template].splitlines(), 1) if line.startswith("trap ")
        )
        assert f"your script traps it (line {trap_line})" in dry.stdout and "warnings" not in dry.stdout
