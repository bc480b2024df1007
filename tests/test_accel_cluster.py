"""Issue 26's acceptance on the local Slurm cluster: Ascend and AMD nodes behind the same health checks, drain
rules and placement as NVIDIA ones, and doctor's version matrix per vendor.

Ascend nodes are read through the real backend (hw/ascend.py) running the stand-in `npu-smi` and `hccn_tool`
that `stune-devcluster up` put in each node's tools directory (tests/accel_standins: the real 910B formats,
values from the node's state.json); AMD nodes through an amdsmi snapshot replayed as the node's accel section.
`stune-health run` runs as slurmd runs it (the HealthCheckProgram), with real drains, marks and resumes."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import drifttrees
import healthkit as kit
import hwtrees
import pytest
from helpers import wait_for_state
from test_ascend_capture import version_tree
from test_health_cluster import Health

from slurm_tune.hostlist import expand_hostlist
from slurm_tune.nodeenv import ranktable
from slurm_tune.nodestate import DEGRADED_FEATURE
from stune_dev.accel import amd_section, default_npu_state
from stune_dev.devcluster import NODES

pytestmark = pytest.mark.cluster
BIN = Path(sys.executable).parent
NPUS = 4  # the dev nodes' /dev/davinci0-3
PARTITION = {"ascend": "ascend", "amd": "amd"}
EDITS = {  # the shipped examples, shrunk to the dev nodes' four devices
    "ascend.yaml": [("  count: 8\n", "  count: 4\n")],
    "amd.yaml": [("  count: 8\n", "  count: 4\n"), ("rate_gbps: 400", "rate_gbps: 200")],  # the tree's ports
}


class AccelHealth(Health):
    """Health (test_health_cluster) on one vendor's partition: each node's tree has that vendor's devices on the
    PCI bus where its tool reports them, the periodic run judges under that partition's profile."""

    def __init__(self, cluster, slurm, tmp_path, vendor: str):
        self.vendor = vendor
        super().__init__(cluster, slurm, tmp_path)
        self.accel_profiles = kit.profile_dir(self.layout.root / f"accel-profiles-{vendor}", EDITS)
        for n in NODES:
            self.build(n)
        self.write_env(self.accel_profiles)

    def build(self, node: str) -> None:
        base = self.base(node)
        shutil.rmtree(base / "root")
        kw = {"numa_node": 0, "local_cpulist": "0-7"}
        if self.vendor == "ascend":
            root = kit.tree(base / "root", "vpc")  # a tcp node ...
            hwtrees.netdev(root, "eth0")  # ... over eth0, as partitions/ascend.yaml
            for dev in default_npu_state(node)["npus"]:
                address = dev["bus_id"].lower()
                hwtrees.pci_device(root, address, vendor="0x19e5", device="0xd802", cls="0x120000", **kw)
            version_tree(root)
            self.cluster.write_npu_state(node)
        else:
            root = kit.tree(base / "root", "roce")  # ConnectX-7 RoCE, as partitions/amd.yaml
            for dev in amd_section(devices=NPUS)["devices"]:
                hwtrees.pci_device(
                    root, dev["bus_id"], vendor="0x1002", device="0x74a1", cls="0x120000", **kw
                )
            self.replay(node, amd_section(devices=NPUS))
        drifttrees.host(root, fabricmanager=False)

    def all_healthy(self) -> None:
        for n in NODES:
            code, doc = self.run(n)
            assert (code, doc["status"]) == (0, "ok"), (n, doc.get("reason"), doc.get("findings", doc))

    def replay(self, node: str, section: dict) -> None:
        """The node's amdsmi snapshot: its accel section, as hw/amd.capture would have read it."""
        path = self.base(node) / "gpus.json"
        doc = json.loads(path.read_text())
        doc["accel"] = section
        path.write_text(json.dumps(doc))

    def write_env(self, profiles: Path | None = None) -> None:
        super().write_env(profiles)
        extra = {
            "STUNE_HEALTH_PARTITION": PARTITION[getattr(self, "vendor", "ascend")],
            "STUNE_ACCEL_TOOLS": f"{self.layout.root}/nodes/%n/accel-tools",
        }
        # an Ascend node's devices come from its tools, not a replay file (which would replace them)
        drop = (
            ("STUNE_HEALTH_", "STUNE_GPU_SNAPSHOT=")
            if extra["STUNE_HEALTH_PARTITION"] == "ascend"
            else ("STUNE_HEALTH_",)
        )
        text = "".join(
            line + "\n" for line in self.env_file.read_text().splitlines() if not line.startswith(drop)
        )
        if "STUNE_GPU_SNAPSHOT=" not in text:
            self.env.pop("STUNE_GPU_SNAPSHOT", None)
        self.env_file.write_text(text + "".join(f"{k}={v}\n" for k, v in extra.items()))
        self.env.update(extra)


@pytest.fixture
def ascend(cluster, slurm, tmp_path):
    h = AccelHealth(cluster, slurm, tmp_path, "ascend")
    h.install_hooks()
    yield h
    h.remove_hooks()
    for n in NODES:
        cluster.write_npu_state(n)  # the healthy default back


@pytest.fixture
def amd(cluster, slurm, tmp_path):
    h = AccelHealth(cluster, slurm, tmp_path, "amd")
    h.install_hooks()
    yield h
    h.remove_hooks()


def multi_node_job(partition: str, gres: str, out: Path) -> int:
    """A 2-node job through stune-sbatch (which keeps degraded nodes out of multi-node jobs)."""
    proc = subprocess.run(
        [
            str(BIN / "stune-sbatch"),
            "--parsable",
            "-p",
            partition,
            "-N2",
            f"--gres={gres}",
            "-o",
            str(out),
            "--wrap",
            "echo $SLURM_JOB_NODELIST",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def test_an_ascend_node_whose_npu_smi_says_warning_is_degraded_and_kept_out_of_multi_node_jobs(
    ascend, slurm, cluster, shared_tmp
):
    ascend.all_healthy()
    state = default_npu_state("n2")
    state["npus"][1]["health"] = "Warning"
    cluster.write_npu_state("n2", state)
    code, doc = ascend.run("n2")
    assert (code, doc["status"]) == (0, "degraded") and "npu1" in doc["reason"] and "Warning" in doc["reason"]
    n2 = slurm.node("n2")
    assert not n2.drain and DEGRADED_FEATURE in n2.feature_set and n2.comment.startswith("stune: degraded: ")
    job = multi_node_job("ascend", "npu:1", shared_tmp / "multi-%j.txt")
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"multi-{job}.txt").read_text().split() == ["n[1,3]"]
    cluster.write_npu_state("n2")
    code, doc = ascend.run("n2")
    assert doc["status"] == "ok" and DEGRADED_FEATURE not in slurm.node("n2").feature_set


def test_a_down_npu_port_drains_the_node_naming_the_device_and_it_resumes_when_up(ascend, slurm, cluster):
    ascend.all_healthy()
    state = default_npu_state("n1")
    state["ports"]["3"]["link"] = "DOWN"
    cluster.write_npu_state("n1", state)
    code, doc = ascend.run("n1")
    assert (code, doc["status"]) == (0, "fail")
    n1 = slurm.node("n1")
    assert n1.drain and n1.reason.startswith("stune: npu3 ") and "DOWN" in n1.reason, n1.reason
    cluster.write_npu_state("n1")
    code, doc = ascend.run("n1")
    assert (code, doc["status"]) == (0, "ok")
    n1 = slurm.node("n1")
    assert not n1.drain and n1.reason == ""


def test_the_same_on_the_amd_partition_through_amdsmi_snapshots(amd, slurm, shared_tmp):
    amd.all_healthy()
    broken = amd_section(devices=NPUS)
    broken["devices"][2]["links"][0]["up"] = False
    amd.replay("n3", broken)
    code, doc = amd.run("n3")
    assert (code, doc["status"]) == (0, "fail")
    n3 = slurm.node("n3")
    assert n3.drain and n3.reason.startswith("stune: gpu2 ") and "xgmi" in n3.reason.lower(), n3.reason
    amd.replay("n3", amd_section(devices=NPUS))
    code, doc = amd.run("n3")
    assert doc["status"] == "ok" and not slurm.node("n3").drain
    hot = amd_section(devices=NPUS)
    hot["devices"][0]["temperature_c"] = 108.0
    amd.replay("n1", hot)
    code, doc = amd.run("n1")
    assert (code, doc["status"]) == (0, "degraded") and "gpu0" in doc["reason"]
    job = multi_node_job("amd", "gpu:1", shared_tmp / "multi-%j.txt")
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert (shared_tmp / f"multi-{job}.txt").read_text().split() == ["n[2-3]"]
    amd.replay("n1", amd_section(devices=NPUS))
    assert amd.run("n1")[1]["status"] == "ok" and DEGRADED_FEATURE not in slurm.node("n1").feature_set


def test_doctor_flags_a_node_whose_cann_differs_from_its_partitions(ascend, cluster, tmp_path):
    """The admin's path: `stune-health capture -p ascend` on each node into a facts directory, then
    `stune-admin doctor --facts DIR`."""
    toolkit = next((ascend.base("n2") / "root/usr/local/Ascend/ascend-toolkit/latest").glob("*/*.info"))
    text = toolkit.read_text()
    version = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("version="))
    toolkit.write_text(text.replace(f"version={version}", "version=8.0.RC3"))
    facts = tmp_path / "facts"
    facts.mkdir()
    for n in NODES:
        env = dict(os.environ, **ascend.env, SLURMD_NODENAME=n)
        argv = ["capture", "-p", "ascend", "--sysfs-root", ascend.base(n) / "root", "--node", n]
        proc = subprocess.run(
            [BIN / "stune-health", *argv, "-o", facts / f"{n}.json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads((facts / f"{n}.json").read_text())["accel"]["answered"] is True
    proc = subprocess.run(
        [
            str(BIN / "stune-admin"),
            "doctor",
            "--facts",
            str(facts),
            "--env-file",
            str(ascend.env_file),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, SLURM_CONF=str(cluster.layout.slurm_conf)),
    )
    findings = json.loads(proc.stdout)["findings"]
    cann = [f for f in findings if "CANN" in f["message"]]
    assert cann and cann[0]["severity"] == "error", findings
    assert f"8.0.RC3 on n2, {version} on n[1,3]" in cann[0]["message"] or (
        f"{version} on n[1,3], 8.0.RC3 on n2" in cann[0]["message"]
    ), cann[0]["message"]


def test_state_json_is_what_the_standins_read(cluster):
    """The dev cluster's default state and the stand-ins agree on the format (the tools print it)."""
    tools = cluster.layout.accel_tools("n1")
    out = subprocess.run([str(tools / "npu-smi"), "info"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "910B3" in out.stdout and "OK" in out.stdout
    state = copy.deepcopy(default_npu_state("n1"))
    assert cluster.npu_state("n1") == state


def test_a_two_node_job_on_the_ascend_partition_gets_the_hccl_variables_and_a_valid_rank_table(
    ascend, slurm, cluster, shared_tmp
):
    """The periodic run publishes each node's NPU port addresses into the shared spool; the TaskProlog (the
    site's, as install placed it) gives every task of a 2-node job HCCL's variables, its NPUs and the same rank
    table, built from the allocation Slurm reports and the published maps."""
    site = dict(line.split("=", 1) for line in cluster.env_file.read_text().splitlines() if "=" in line[:40])
    spool = Path(site["STUNE_USAGE_SPOOL"])
    ascend.env_file.write_text(ascend.env_file.read_text() + f"STUNE_USAGE_SPOOL={spool}\n")
    ascend.env["STUNE_USAGE_SPOOL"] = str(spool)
    shutil.rmtree(spool / ranktable.DEVICES_DIR, ignore_errors=True)
    task_prolog = cluster.site_root / "etc" / "slurm" / "stune-task-prolog"
    cluster.set_fragment("accel-taskprolog", f"TaskProlog={task_prolog}")  # the slurmds take it meanwhile
    try:
        ascend.all_healthy()  # each node's run publishes its map
        published = sorted(p.name for p in (spool / ranktable.DEVICES_DIR).iterdir())
        assert published == [f"{n}.json" for n in NODES]
        out = shared_tmp / "hccl-%j.txt"
        # The allocation as the controller reports it, from inside the job: Slurm 22.05's accounting record of
        # a job this short can be wrong (a CI run: NodeList n1, no partition, for a job on n[1-2]).
        script = (
            "echo alloc $(squeue -h -j $SLURM_JOB_ID -o %N); "
            "srun -N2 --ntasks-per-node=1 -l sh -c "
            "'echo vars $HCCL_SOCKET_IFNAME $HCCL_CONNECT_TIMEOUT $ASCEND_RT_VISIBLE_DEVICES $RANK_TABLE_FILE "
            'NCCL=${NCCL_IB_DISABLE:-none}; cat $RANK_TABLE_FILE | tr -d "\\n "; echo\''
        )
        proc = subprocess.run(
            [
                BIN / "stune-sbatch",
                "--parsable",
                "-p",
                "ascend",
                "-N2",
                "--gres=npu:2",
                "-o",
                out,
                "--wrap",
                script,
            ],
            capture_output=True,
            text=True,
            # the test process's hermetic env file must not reach the job: the site's is read (install's)
            env={k: v for k, v in os.environ.items() if k != "STUNE_ENV_FILE"},
        )
        assert proc.returncode == 0, proc.stderr
        job = int(proc.stdout.strip().split(";")[0])
        assert wait_for_state(slurm, job, ("COMPLETED", "FAILED")) == "COMPLETED"
    finally:
        cluster.set_fragment("accel-taskprolog", None)
    lines = (shared_tmp / f"hccl-{job}.txt").read_text().splitlines()
    varlines = sorted(line for line in lines if " vars " in line)
    assert len(varlines) == 2, lines
    tables = set()
    for line in varlines:
        words = line.split()
        assert words[2:5] == ["eth0", "600", "0,1"] and words[6] == "NCCL=none", line
        assert words[5].endswith(f"/run/{job}/rank_table.json")
    for line in lines:
        if '"server_list"' in line:
            tables.add(line.split(":", 1)[1].strip())
    assert len(tables) == 1, tables  # every node built the same table
    table = json.loads(tables.pop())
    assert ranktable.problems(table) == []
    (alloc,) = [line.split()[1] for line in lines if line.startswith("alloc ")]
    assert [s["server_id"] for s in table["server_list"]] == expand_hostlist(alloc)
    for server in table["server_list"]:
        host = NODES.index(server["server_id"]) + 1
        assert [d["device_ip"] for d in server["device"]] == [f"192.168.{host}.10", f"192.168.{host}.11"]
    assert [d["rank_id"] for s in table["server_list"] for d in s["device"]] == ["0", "1", "2", "3"]
