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
from pathlib import Path

import pytest

from helpers import wait_for_state, wait_until

pytestmark = pytest.mark.cluster

BIN = os.path.dirname(sys.executable)


def default_interface() -> str:
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    pytest.fail("this machine has no default route: no interface for the rendezvous")


@pytest.fixture(scope="module")
def tcp_profile(cluster, tmp_path_factory):
    profiles = tmp_path_factory.mktemp("rendezvous-profiles")
    profiles.chmod(0o755)
    (profiles / "vpc.yaml").write_text(f"partition: vpc\nfabric:\n  type: tcp\n  socket_ifname: {default_interface()}\n")
    wrapper = cluster.layout.root / "stune-task-prolog-rendezvous.sh"
    wrapper.write_text(f"#!/bin/sh\nPATH={BIN}:/usr/bin:/bin; export PATH\n"
                       f"STUNE_PARTITIONS={profiles}; export STUNE_PARTITIONS\nexec stune-task-prolog\n")
    wrapper.chmod(0o755)
    cluster.set_fragment("sbatch", f"TaskProlog={wrapper}")
    yield profiles
    cluster.set_fragment("sbatch", None)


@pytest.mark.parametrize("export", ["NONE", "FOO=1"])
def test_every_rank_gets_the_batch_steps_master_addr(export, tcp_profile, slurm, shared_tmp):
    env = dict(os.environ, STUNE_PARTITIONS=str(tcp_profile), STUNE_HISTORY=str(shared_tmp / "h.jsonl"))
    for name in [n for n in env if n.startswith(("NCCL_", "GLOO_", "MASTER_", "SBATCH_", "STUNE_MANAGED"))]:
        del env[name]
    step = 'echo "rank $SLURM_PROCID $SLURMD_NODENAME MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"'
    out = subprocess.run([os.path.join(BIN, "stune-sbatch"), "--parsable", "-p", "vpc", "-N2", f"--export={export}",
                          "-o", str(shared_tmp / "out-%j.txt"), "--wrap",
                          f"/usr/bin/srun -N2 -n2 /bin/sh -c '{step}'"], capture_output=True, text=True, env=env)
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
