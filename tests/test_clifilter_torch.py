"""docs/sbatch.md's srun template, submitted with plain `sbatch` on a site that enabled the cli_filter: a real
2-node PyTorch DDP job (gloo on CPU) rendezvous on stune's MASTER_ADDR/MASTER_PORT, gets the recovery
defaults (--requeue; the checkpoint signal on request), checkpoints on USR1 and is requeued, as under
stune-sbatch (tests/test_sbatch_torch.py, whose fixture and checks this reuses).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_sbatch_torch import real_nodes, stop_with_usr1, templates  # noqa: F401 (real_nodes: a fixture)

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def filter_on(cluster, real_nodes):  # noqa: F811 (the fixture imported above)
    out = subprocess.run(
        [
            os.path.join(BIN, "stune-admin"),
            "install",
            "--prefix",
            str(cluster.site_root),
            "--slurm-conf",
            str(cluster.layout.slurm_conf),
            "--role",
            "all",
            "--force",
            f"--set=STUNE_PARTITIONS={real_nodes}",
            "--cli-filter",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    cluster.set_fragment("clifilter", "CliFilterPlugins=cli_filter/lua")
    try:
        yield real_nodes
    finally:
        cluster.set_fragment("clifilter", None)


def test_the_srun_template_trains_on_two_nodes_under_plain_sbatch(filter_on, slurm, shared_tmp):
    for name, body in templates().items():
        (shared_tmp / name).write_text(body)
    env = dict(os.environ, STUNE_PARTITIONS=str(filter_on), STUNE_CHECKPOINT_SIGNAL="1", STUNE_EXPLAIN="1")
    for name in [n for n in env if n.startswith(("NCCL_", "GLOO_", "MASTER_", "SBATCH_", "STUNE_MANAGED"))]:
        del env[name]
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "vpc",
            "train-srun.sbatch",
            "--epochs",
            "40",
            "--epoch-seconds",
            "0.25",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=shared_tmp,
    )
    assert out.returncode == 0, out.stderr
    # the checkpoint signal on request (stune-sbatch adds it for a script that traps it), and nothing to warn of
    assert "option --signal=B:USR1@300" in out.stderr and "warning" not in out.stderr, out.stderr
    job = int(out.stdout)
    try:
        show = slurm.run(["scontrol", "show", "job", str(job)])
        assert "Requeue=1" in show
        stop_with_usr1(slurm, job, shared_tmp / f"train-{job}.out")
        text = (shared_tmp / f"train-{job}.out").read_text()
        assert "world 2" in text
    finally:
        slurm.run(["scancel", str(job)], check=False)
