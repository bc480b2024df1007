"""The drift section of a snapshot: what the capture keeps (raw, as the node showed it), the round trip through
a snapshot file (`stune-health capture` -> `stune-health check --snapshot`), the periodic run judging it,
the hooks never reading it, and a capture that hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import drifttrees as dt
import healthkit as kit
import hwtrees
import pytest

from slurm_tune.health import collect
from slurm_tune.health import judge as health_judge
from slurm_tune.hw import drift as hw_drift
from slurm_tune.hw import pciconfig, snapshot

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GPU0, HCA0 = hwtrees.DGX_GPU_PCI[0], hwtrees.DGX_HCA_PCI[0]


@pytest.fixture
def box(tmp_path):
    root = kit.tree(tmp_path / "root", "hdr")
    env = dict(
        os.environ,
        STUNE_SYSFS_ROOT=str(root),
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
        STUNE_STATE_DIR=str(tmp_path / "state"),
        STUNE_HEALTH_PARTITION="hdr",
        SLURMD_NODENAME="n7",
        STUNE_PARTITIONS=str(REPO / "partitions"),
        SLURM_CONF="/nonexistent/slurm.conf",
    )
    return {"root": root, "env": env, "tmp": tmp_path}


def health(box, *args):
    proc = subprocess.run([str(BIN / "stune-health"), *args], capture_output=True, text=True, env=box["env"])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_the_section_keeps_what_the_node_showed(box):
    snap = collect.full(
        str(box["root"]), kit.profile("hdr"), "n7", box["env"]["STUNE_GPU_SNAPSHOT"], drift=True
    )
    section = snap["drift"]
    assert section["answered"] is True and section["problems"] == []
    host = section["host"]
    assert host["modules"].startswith("nvidia_peermem 16384 0 - Live 0xffffffffc0000000 (POE)\n")
    assert host["thp"] == "always [madvise] never" and host["numa_balancing"] == "0"
    assert host["governors"] == {f"policy{i}": "performance" for i in range(8)}
    assert host["sysctls"]["net.ipv4.tcp_rmem"] == "4096\t131072\t6291456"
    assert set(hw_drift.DEFAULT_SYSCTLS) <= set(host["sysctls"])
    assert host["processes"]["slurmd"][0]["pid"] == str(dt.SLURMD_PID)
    assert (
        "Max locked memory         unlimited            unlimited            bytes"
        in (host["processes"]["slurmd"][0]["limits"])
    )
    assert host["processes"]["fabricmanager"] == [str(dt.FABRICMANAGER_PID)]
    assert host["nvswitches"] == hwtrees.DGX_NVSWITCH_PCI
    gpu0 = section["pci"]["endpoints"][GPU0]
    assert gpu0["path"] == ["pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:00.0", GPU0]
    assert (gpu0["iommu_group"], gpu0["iommu_type"]) == (None, None)
    assert set(section["pci"]["endpoints"]) == {
        *hwtrees.DGX_GPU_PCI,
        *hwtrees.DGX_HCA_PCI,
        hwtrees.STORAGE_HCA_PCI,
    }
    config = section["pci"]["config"]
    assert config["0000:02:00.0"] == {
        "size": 4096,
        "acs": {"offset": 0x148, "cap": 0x5F, "ctrl": 0},
        "problem": None,
    }
    assert config["0000:01:00.0"]["acs"] is None and config[GPU0]["acs"] is None  # no ACS capability there


def test_a_snapshot_replays_to_the_same_verdict(box):
    dt.host(box["root"], gdr_module=False, governor="schedutil")
    dt.set_acs(box["root"], "0000:42:01.0", dt.ACS_LINUX)
    dt.iommu_group(box["root"], GPU0, 3, "DMA")
    profile = kit.profile("hdr")
    snap = collect.full(str(box["root"]), profile, "n7", box["env"]["STUNE_GPU_SNAPSHOT"], drift=True)
    path = box["tmp"] / "n7.json"
    snapshot.save(snap, str(path))
    again = snapshot.load(str(path))
    assert again["drift"] == json.loads(json.dumps(snap["drift"]))
    live, _ = health_judge.judge(snap, profile, {})
    replayed, _ = health_judge.judge(again, profile, {})
    assert [r.as_dict() for r in replayed.results] == [r.as_dict() for r in live.results]
    drifted = {r.check for r in replayed.results if r.status == "degraded"}
    assert drifted == {"drift.gdr_module", "drift.cpu_governor", "drift.pcie_acs", "drift.iommu"}


def test_capture_then_check_offline_names_the_drift_and_its_fix(box):
    dt.host(box["root"], gdr_module=False)
    snap = box["tmp"] / "n7.json"
    assert health(box, "capture", "-o", str(snap)).returncode == 0
    out = health(box, "check", "--snapshot", str(snap))
    assert out.returncode == 5, out.stdout + out.stderr  # degraded
    first = out.stdout.splitlines()[0]
    assert first.endswith("DEGRADED - nvidia-peermem not loaded: modprobe nvidia-peermem"), first
    assert "degraded drift.gdr_module       node: nvidia-peermem not loaded;" in out.stdout


def test_capture_reads_the_sysctls_of_the_partition_it_is_given(box):
    profiles = kit.profile_dir(
        box["tmp"] / "p",
        {"hdr.yaml": [("cache:\n", "drift:\n  sysctls: {kernel.pid_max: 4194304}\ncache:\n")]},
    )
    dt.put(box["root"], "proc/sys/kernel/pid_max", "4194304")
    box["env"]["STUNE_PARTITIONS"] = str(profiles)
    doc = json.loads(health(box, "capture").stdout)
    assert doc["drift"]["host"]["sysctls"]["kernel.pid_max"] == "4194304"
    del box["env"]["STUNE_HEALTH_PARTITION"]
    assert "kernel.pid_max" not in json.loads(health(box, "capture").stdout)["drift"]["host"]["sysctls"]


def test_the_periodic_run_judges_drift_and_the_hooks_do_not(box):
    dt.host(box["root"], gdr_module=False)
    dry = health(box, "run", "--dry-run", "--json")
    doc = json.loads(dry.stdout)
    assert (
        doc["status"] == "degraded" and doc["reason"] == "nvidia-peermem not loaded: modprobe nvidia-peermem"
    )
    assert doc["action"] == "degraded"
    for hook in ("prolog", "epilog"):
        assert health(box, hook).returncode == 0
        last = json.loads(
            subprocess.run(
                [str(BIN / "stune-health"), "status"], capture_output=True, text=True, env=box["env"]
            ).stdout
        )["last"]
        assert (last["mode"], last["status"]) == (hook, "ok")


def test_the_prologs_capture_never_loads_the_drift_reader(box):
    code = (
        "import sys; from slurm_tune.health import collect; from slurm_tune.profilestore import load_profile;"
        f"collect.fast({str(box['root'])!r}, load_profile('hdr'), 'n7');"
        "print(sorted(m for m in sys.modules if 'drift' in m))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=box["env"], check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_drift_read_that_hangs_is_unknown_and_keeps_what_was_read(box, monkeypatch):
    never = threading.Event()
    real = pciconfig.read_config

    def stuck(path):
        if "0000:42:00.0" in path:  # gpu2's switch port: a config read that never returns
            never.wait(30)
        return real(path)

    monkeypatch.setattr(pciconfig, "read_config", stuck)
    profile = kit.profile("hdr")
    snap = collect.full(
        str(box["root"]), profile, "n7", box["env"]["STUNE_GPU_SNAPSHOT"], drift=True, timeout_s=0.5
    )
    never.set()
    section = snap["drift"]
    assert section["answered"] is False and "did not answer within 0.5s" in section["error"]
    assert section["host"]["modules"]  # read before the stall: kept
    verdict, _ = health_judge.judge(snap, profile, {})
    acs = [r for r in verdict.results if r.check == "drift.pcie_acs"]
    assert acs and {r.status for r in acs} == {"unknown"}
    assert verdict.status == "unknown"  # never a drift, never a failure


def test_the_section_reads_under_any_root_and_names_what_it_could_not_read(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    section = hw_drift.capture(
        str(root), 2, pci=["0000:07:00.0", "not-an-address"], sysctls=["vm.swappiness"]
    )
    host = section["host"]
    assert section["answered"] is True
    assert (
        host["modules"] is None
        and host["governors"] is None
        and host["sysctls"] == {**dict.fromkeys(hw_drift.DEFAULT_SYSCTLS)} | {"vm.swappiness": None}
    )
    assert host["processes"]["error"] == "proc: missing"
    assert list(section["pci"]["endpoints"]) == ["0000:07:00.0"]  # garbage addresses are not read at all
    assert section["pci"]["endpoints"]["0000:07:00.0"]["path"] is None
