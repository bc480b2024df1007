"""Issue 22 §3: under `--export=NONE` or an export list, every rank of a step gets the same MASTER_ADDR.

Before, each step's tasks detected their own (srun steps inherit only the listed variables): rank 0, on the
first node, its address on the socket interface, rank 1 the first node's name. The nodes use this machine's
real interfaces here (no sysfs fixture), so the first node does have an address to find.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import wait_for_state, wait_until

# The torch tests' set-up: a vpc profile on this machine's default interface, the TaskProlog on real sysfs.
from test_sbatch_torch import default_interface, real_nodes  # noqa: F401 (real_nodes: a fixture)

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("export", ["NONE", "FOO=1"])
def test_every_rank_gets_the_batch_steps_master_addr(export, real_nodes, slurm, shared_tmp):  # noqa: F811 (a fixture)
    env = dict(os.environ, STUNE_PARTITIONS=str(real_nodes), STUNE_HISTORY=str(shared_tmp / "h.jsonl"))
    for name in [n for n in env if n.startswith(("NCCL_", "GLOO_", "MASTER_", "SBATCH_", "STUNE_MANAGED"))]:
        del env[name]
    # the suite's own Slurm's srun, by its full path: under --export=NONE the batch script has no PATH
    srun = os.path.join(os.environ.get("STUNE_SLURM_BIN", "/usr/bin"), "srun")
    step = 'echo "rank $SLURM_PROCID $SLURMD_NODENAME MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"'
    out = subprocess.run(
        [
            os.path.join(BIN, "stune-sbatch"),
            "--parsable",
            "-p",
            "vpc",
            "-N2",
            f"--export={export}",
            "-o",
            str(shared_tmp / "out-%j.txt"),
            "--wrap",
            f"{srun} -N2 -n2 /bin/sh -c '{step}'",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    job = int(out.stdout)
    wait_for_state(slurm, job, ("COMPLETED",), timeout=60)
    path = shared_tmp / f"out-{job}.txt"
    text = wait_until(f"{path} written", lambda: path.exists() and path.read_text(), timeout=10)
    ranks = sorted(re.findall(r"rank (\d) (\S+) MASTER_ADDR=(\S*) MASTER_PORT=(\S*)", text))
    assert [(r[0], r[1]) for r in ranks] == [("0", "n1"), ("1", "n2")], text
    assert len({(r[2], r[3]) for r in ranks}) == 1, text  # one value per job, the same on every rank
    from slurm_tune.nodeenv.detect import ipv4_address

    assert ranks[0][2] == (ipv4_address(default_interface()) or "n1")  # the batch step's, on the first node
    assert ranks[0][3] == str(12000 + job % 8000)
