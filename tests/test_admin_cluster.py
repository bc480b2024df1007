"""stune-admin doctor on the local cluster, installed by `up` through `stune-admin install` (the site's way).

The site's slurm.conf is the cluster's own with the lines `stune-admin install` asks for applied (a copy:
the live cluster keeps HealthCheckInterval=0, so no periodic health run drains the shared test nodes), a
profile set that matches the cluster (4 GPUs, vpc), and a GPU snapshot per node (hardware-less mode, %n).
Then the configuration is broken four ways, and doctor must name each one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.admin.slurmconf import SlurmConf, requirements
from stune_dev.devcluster import NODES

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cluster


@pytest.fixture
def site(cluster, tmp_path):
    cluster.install_stune()  # restores hooks another test may have replaced through install_hook()
    root = cluster.layout.root
    etc = tmp_path / "etc"
    etc.mkdir()
    profiles = tmp_path / "partitions"
    profiles.mkdir()
    shutil.copy(REPO / "partitions/vpc.yaml", profiles / "vpc.yaml")
    # gpu.count 0 skips GPU checks (the schema): not an error on roce's 4-GPU nodes
    roce = (REPO / "partitions/roce.yaml").read_text()
    assert "  count: 8\n  model: H100 80GB HBM3\n" in roce
    (profiles / "roce.yaml").write_text(roce.replace("  count: 8\n  model: H100 80GB HBM3\n", "  count: 0\n"))
    env_text = cluster.env_file.read_text().replace(
        f"STUNE_PARTITIONS={cluster.profiles_dir}", f"STUNE_PARTITIONS={profiles}"
    )
    env_file = tmp_path / "stune.env"
    env_file.write_text(env_text)
    live = SlurmConf(str(cluster.layout.slurm_conf))
    paths = {
        "prolog_dir": str(cluster.layout.prolog_d),
        "epilog_dir": str(cluster.layout.epilog_d),
        **{
            k: str(cluster.site_root / "etc/slurm" / n)
            for k, n in (
                ("health_run", "stune-health-run"),
                ("task_prolog", "stune-task-prolog"),
                ("epilog_slurmctld", "stune-usage-slurmctld"),
            )
        },
    }
    text = live.text.replace("HealthCheckInterval=0\n", "")
    for part, _ in cluster.partitions():  # every node has GPUs (and NPUs, for the ascend partition)
        text = text.replace(
            f"PartitionName={part} ",
            f'PartitionName={part} TRESBillingWeights="CPU=1.0,GRES/gpu=8.0,GRES/npu=8.0" ',
        )
    text += "".join(
        n.line + "\n" for n in requirements(live, paths) if not n.ok and n.key != "HealthCheckInterval"
    )
    text += "HealthCheckInterval=300\nHealthCheckNodeState=ANY,CYCLE\n"
    (etc / "slurm.conf").write_text(text)
    (etc / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    snapshot = json.loads((REPO / "tests/fixtures/snapshots/vpc-a10g.json").read_text())
    for node in NODES:
        d = root / "nodes" / node
        d.mkdir(parents=True, exist_ok=True)
        (d / "gpus.json").write_text(json.dumps(snapshot))
    yield {"env": env_file, "conf": etc / "slurm.conf", "profiles": profiles, "cluster": cluster}
    for hook in (cluster.layout.prolog_d / "10-stune-health", cluster.layout.epilog_d / "00-devcluster"):
        if hook.exists():
            hook.chmod(0o755)
    for node in NODES:
        (root / "nodes" / node / "gpus.json").unlink(missing_ok=True)


def doctor(site) -> tuple[int, list[dict], str]:
    cluster = site["cluster"]
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "stune-admin"),
            "doctor",
            "--prefix",
            str(cluster.site_root),
            "--slurm-conf",
            str(site["conf"]),
            "--env-file",
            str(site["env"]),
            "--role",
            "all",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, SLURM_CONF=str(cluster.layout.slurm_conf)),
    )
    doc = json.loads(proc.stdout)
    return proc.returncode, doc["findings"], proc.stderr


def errors(findings) -> list[str]:
    return [f"{f['subject']}: {f['message']}" for f in findings if f["severity"] == "error"]


def test_up_installed_stune_the_admin_way(cluster):
    assert (cluster.layout.prolog_d / "10-stune-health").exists()
    assert (cluster.site_root / "etc/slurm/stune-task-prolog").exists()
    assert (cluster.site_root / "var/lib/stune/install-manifest.json").exists()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "stune-admin"),
            "install",
            "--prefix",
            str(cluster.site_root),
            "--slurm-conf",
            str(cluster.layout.slurm_conf),
            "--role",
            "all",
            *(f"--set={k}={v}" for k, v in cluster.site_settings().items()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "nothing changed" in proc.stdout, proc.stdout + proc.stderr


def test_doctor_runs_clean_then_names_each_break(site):
    rc, findings, err = doctor(site)
    assert rc == 0 and errors(findings) == [], errors(findings) or err
    assert any(f["subject"] == "partition vpc" and f["severity"] == "ok" for f in findings)
    assert any(
        f["subject"] == "profile roce" and f["severity"] == "ok" and "GPU checks skipped" in f["message"]
        for f in findings
    ), findings

    conf = site["conf"]
    good = conf.read_text()
    conf.write_text(good.replace("PrologFlags=Alloc\n", ""))
    hook = site["cluster"].layout.prolog_d / "10-stune-health"
    hook.chmod(0o757)
    site_hook = site["cluster"].layout.epilog_d / "00-devcluster"  # not stune's: root runs it all the same
    site_hook.chmod(0o775)
    odd = site["cluster"].layout.root / "nodes" / "n2" / "gpus.json"
    snap = json.loads(odd.read_text())
    snap["gpus"]["driver_version"] = "550.54.14"
    odd.write_text(json.dumps(snap))
    profile = site["profiles"] / "vpc.yaml"
    profile.write_text(profile.read_text().replace("count: 4", "count: 8"))

    rc, findings, _ = doctor(site)
    found = errors(findings)
    assert rc == 1
    assert any(e.startswith("PrologFlags:") for e in found), found
    assert any(str(hook) in e and "writable by others" in e for e in found), found
    assert any(
        e.startswith("Epilog script:") and str(site_hook) in e and "writable by group" in e for e in found
    ), found
    assert any(e.startswith("partition vpc: mixed driver") and "n2 (550.54.14)" in e for e in found), found
    assert any(e.startswith("profile vpc: gpu.count is 8") for e in found), found
