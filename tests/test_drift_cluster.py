"""Tuning drift on the local Slurm cluster: a node without nvidia-peermem on a GPUDirect RDMA partition (hdr:
IB, nccl.net_gdr_level PHB) is marked degraded by `stune-health run`, with the fix in its comment, keeps its
single-node jobs while multi-node jobs avoid it, shows in `stune-admin doctor`'s drift table, and is cleared
once the module is loaded. Each node's hardware is its own tree under nodes/<node>/sysfs, where the site's
env file (stune-admin install, hardware-less mode) points doctor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import drifttrees as dt
import healthkit as kit
import pytest
from helpers import wait_for_state

from slurm_tune.nodestate import DEGRADED_FEATURE
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster
BIN = Path(sys.executable).parent
REASON = "nvidia-peermem not loaded: modprobe nvidia-peermem"


class Nodes:
    """Per-node trees at nodes/<node>/sysfs (and gpus.json), their own state directories, one env file."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.nodes = cluster.layout.root / "nodes"
        self.kept: dict[Path, Path] = {}
        for n in NODES:
            # "health" is the site's STUNE_STATE_DIR: the hooks' runs here record this policy as trusted
            # on these trees, which must not outlive them (a later module's trees-less prolog would fail)
            for name in ("sysfs", "gpus.json", "drift-state", "health"):
                path = self.nodes / n / name
                if path.exists():  # another test's: set aside, put back at the end
                    self.kept[path] = path.with_name(f"{name}.kept-by-drift-test")
                    path.rename(self.kept[path])
            kit.tree(self.root(n), "hdr")
            kit.gpu_file(self.nodes / n / "gpus.json")
        self.env_file = cluster.layout.root / "stune-drift.env"
        values = {
            "STUNE_BIN": BIN,
            "STUNE_PARTITIONS": os.environ["STUNE_PARTITIONS"],
            "STUNE_CACHE_DIR": cluster.layout.root / "drift-cache",
            "STUNE_HEALTH_PARTITION": "hdr",
            "STUNE_SYSFS_ROOT": f"{self.nodes}/%n/sysfs",
            "STUNE_GPU_SNAPSHOT": f"{self.nodes}/%n/gpus.json",
            "STUNE_STATE_DIR": f"{self.nodes}/%n/drift-state",
            **cluster.slurm_env(),
        }
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        self.env = {k: str(v) for k, v in values.items()}

    def root(self, node: str) -> Path:
        return self.nodes / node / "sysfs"

    def run(self, node: str) -> tuple[int, dict]:
        """`stune-health run` as slurmd runs it on `node` (the HealthCheckProgram)."""
        env = dict(os.environ, **self.env, SLURMD_NODENAME=node)
        proc = subprocess.run(
            [str(BIN / "stune-health"), "run", "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode, json.loads(proc.stdout)

    def doctor(self) -> dict:
        """`stune-admin doctor --json` with the site's env file (its STUNE_SYSFS_ROOT is nodes/%n/sysfs)."""
        proc = subprocess.run(
            [
                str(BIN / "stune-admin"),
                "doctor",
                "--prefix",
                str(self.cluster.site_root),
                "--env-file",
                str(self.cluster.env_file),
                "--role",
                "all",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env=dict(os.environ, SLURM_CONF=str(self.cluster.layout.slurm_conf)),
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return json.loads(proc.stdout)

    def close(self) -> None:
        for n in NODES:
            for name in ("sysfs", "drift-state", "health"):
                shutil.rmtree(self.nodes / n / name, ignore_errors=True)
            (self.nodes / n / "gpus.json").unlink(missing_ok=True)
        for path, kept in self.kept.items():
            kept.rename(path)
        self.env_file.unlink(missing_ok=True)


@pytest.fixture
def nodes(cluster, slurm):
    site = Nodes(cluster)
    yield site
    site.close()


def test_a_node_without_nvidia_peermem_on_a_gdr_partition_is_degraded_with_the_fix(nodes, slurm, shared_tmp):
    for n in NODES:
        code, doc = nodes.run(n)
        assert (code, doc["status"]) == (0, "ok"), doc
        assert any(r["check"] == "drift.gdr_module" and r["status"] == "ok" for r in doc["results"])
    dt.host(nodes.root("n1"), gdr_module=False)  # reimaged without the module
    code, doc = nodes.run("n1")
    assert (code, doc["status"], doc["action"], doc["reason"]) == (0, "degraded", "degraded", REASON)
    n1 = slurm.node("n1")
    assert not n1.drain and DEGRADED_FEATURE in n1.feature_set
    assert n1.comment == f"stune: degraded: {REASON}"

    # still in service for a single-node job; a multi-node job through stune-sbatch avoids it
    single = slurm.submit(["-p", "hdr", "-w", "n1", "-o", str(shared_tmp / "one-%j.txt"), "--wrap", "true"])
    assert wait_for_state(slurm, single, ("COMPLETED", "FAILED")) == "COMPLETED"
    proc = subprocess.run(
        [
            str(BIN / "stune-sbatch"),
            "--parsable",
            "-p",
            "hdr",
            "-N2",
            "-o",
            str(shared_tmp / "two-%j.txt"),
            "--wrap",
            "echo $SLURM_JOB_NODELIST",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    multi = int(proc.stdout.strip().split(";")[0])
    assert wait_for_state(slurm, multi, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"two-{multi}.txt").read_text().split() == ["n[2-3]"]

    # doctor's drift table: one row per setting, n1 the node that differs
    report = nodes.doctor()
    rows = {r["setting"]: r for r in report["drift"]["hdr"]["rows"]}
    assert rows["gdr_module"]["differs"] == ["n1"] and rows["gdr_module"]["have"] == "n1: not loaded"
    assert not any(r["differs"] for s, r in rows.items() if s != "gdr_module"), rows
    assert any(
        f["subject"] == "drift hdr"
        and f["message"].startswith("gdr_module differs on 1 node(s): n1: not loaded")
        and f["fix"] == "on n1: modprobe nvidia-peermem"
        for f in report["findings"]
    ), report["findings"]

    dt.host(nodes.root("n1"))  # modprobe nvidia-peermem
    code, doc = nodes.run("n1")
    assert (code, doc["status"]) == (0, "ok"), doc
    n1 = slurm.node("n1")
    assert DEGRADED_FEATURE not in n1.feature_set and n1.comment == "" and not n1.drain
