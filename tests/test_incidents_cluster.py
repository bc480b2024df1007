"""Issue 25's acceptance on the local Slurm cluster: Xid incidents, the remediation ladder and hung reads, with
`stune-health run` as slurmd runs it (the HealthCheckProgram) on the fixture nodes, real drains, a real
`scontrol reboot` through a stand-in RebootProgram that records its calls and restarts the node's slurmd as
booted (stune_dev/rebootstandin.py), and a stand-in GPU reset command that records its calls."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import healthkit as kit
import pytest
from helpers import wait_for_state, wait_until
from test_health_cluster import Health

from slurm_tune.health import node as health_node
from slurm_tune.nodestate import DEGRADED_FEATURE
from slurm_tune.slurm import Slurm
from stune_dev import rebootstandin

pytestmark = pytest.mark.cluster
BIN = Path(sys.executable).parent
PCI = "0000:47:00"  # gpu2 of the fixture DGX-A100


@pytest.fixture
def health(cluster, slurm, tmp_path):
    h = Health(cluster, slurm, tmp_path)
    for n in ("n1", "n2", "n3"):
        kmsg = h.base(n) / "root/dev/kmsg"
        kmsg.parent.mkdir(parents=True, exist_ok=True)
        kmsg.write_text("6,1201,350123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05\n")
        (h.base(n) / "root/proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (h.base(n) / "root/proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    h.install_hooks()
    yield h
    h.remove_hooks()
    cluster.set_fragment("reboot", None)


def xid_lines(health, node: str, code: int, n: int = 1, text: str = "GPU has fallen off the bus.") -> None:
    """What the driver writes to the node's kernel log (its /dev/kmsg copy in the fixture tree)."""
    kmsg = health.base(node) / "root/dev/kmsg"
    seq = 1300 + len(kmsg.read_text().splitlines())
    with open(kmsg, "a") as fh:
        for i in range(n):
            fh.write(
                f"4,{seq + i},{(seq + i) * 1000},-;NVRM: Xid (PCI:{PCI}): {code}, pid=2231, name=python, {text}\n"
            )


def run_counting(health, node: str):
    """`stune-health run` in this process, with an adapter of its own: (code, doc, the Slurm calls made)."""
    env = dict(os.environ, **health.env, SLURMD_NODENAME=node)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        slurm = Slurm(conf=str(health.layout.slurm_conf), bin_dir=health.cluster.install.bin_dir)
        code, doc = health_node.run(health_node.settings({}, env), slurm, environ=env)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, doc, slurm.calls


def profiles(health, name: str, hdr_edits: list) -> None:
    """Root-owned profiles for this test (root loads profiles only from where root alone can write)."""
    health.write_env(kit.profile_dir(health.layout.root / name, {"hdr.yaml": hdr_edits}))


def test_three_xid_79_lines_drain_a_node_once_with_the_code_in_the_reason(health, slurm):
    health.all_healthy()
    xid_lines(health, "n1", 79, 3)
    code, doc, calls = run_counting(health, "n1")
    assert (code, doc["status"], doc["reason"]) == (0, "fail", "gpu2 Xid 79")
    updates = [c for c in calls if c[:2] == ["scontrol", "update"]]
    assert len(updates) == 1 and "State=DRAIN" in updates[0] and "Reason=stune: gpu2 Xid 79" in updates[0]
    n1 = slurm.node("n1")
    assert n1.drain and n1.reason == "stune: gpu2 Xid 79"
    drained_at = n1.reason_time
    for _ in range(2):  # held, and nothing more to tell Slurm
        code, doc, calls = run_counting(health, "n1")
        assert doc["reason"] == "gpu2 Xid 79" and calls == []
    assert slurm.node("n1").reason_time == drained_at
    assert doc["incidents"] == {"by_code": {"79": 3}, "held": {"79": 3}}


def test_an_xid_13_storm_drains_nothing(health, slurm, shared_tmp):
    health.all_healthy()
    kmsg = health.base("n2") / "root/dev/kmsg"
    line = f"NVRM: Xid (PCI:{PCI}): 13, pid=2231, name=python, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)"
    script = f'for i in $(seq 2000 2499); do echo "4,$i,$((i*1000)),-;{line}" >> {kmsg}; done'
    job = slurm.submit(["-p", "hdr", "-w", "n2", "-o", str(shared_tmp / "storm-%j.txt"), "--wrap", script])
    assert wait_for_state(slurm, job, ("COMPLETED", "FAILED")) == "COMPLETED"  # its epilog passed
    for _ in range(3):
        code, doc = health.run("n2")
        assert (code, doc["status"]) == (0, "ok")
    n2 = slurm.node("n2")
    assert not n2.drain and DEGRADED_FEATURE not in n2.feature_set
    assert doc["incidents"]["by_code"] == {"13": 500} and doc["incidents"]["held"] == {}
    follow = slurm.submit(["-p", "hdr", "-w", "n2", "-o", str(shared_tmp / "next-%j.txt"), "--wrap", "true"])
    assert wait_for_state(slurm, follow, ("COMPLETED", "FAILED")) == "COMPLETED"


def test_a_reset_that_does_not_clear_a_recurring_xid_leads_to_one_reboot_then_a_drain(health, slurm, cluster):
    resets = health.layout.root / "gpu-resets.log"
    resets.unlink(missing_ok=True)
    standin = health.layout.root / "gpu-reset-standin"
    standin.write_text(
        f"#!/bin/sh\necho \"$@\" >> {resets}\necho 'GPU 00000000:47:00.0 was successfully reset.'\n"
    )
    standin.chmod(0o755)
    profiles(
        health,
        "ladder-profiles",
        [
            (
                "placement:\n",
                f'remediation:\n  enabled: true\n  reset_command: ["{standin}", "-i", "{{pci}}"]\nplacement:\n',
            )
        ],
    )
    cluster.set_fragment("reboot", f"RebootProgram={rebootstandin.install(cluster.layout)}\nResumeTimeout=60")
    health.all_healthy()
    xid_lines(health, "n3", 48, text="DBE (double bit error) ECC error")
    code, doc = health.run("n3")
    assert (doc["status"], doc["reason"]) == ("fail", "gpu2 Xid 48")
    assert doc["remediation"]["note"].startswith("remediation: GPU reset done")
    assert resets.read_text() == f"-i {PCI}.0\n"  # drained by stune and idle: reset at once
    code, doc = health.run("n3")
    assert doc["status"] == "ok" and not slurm.node("n3").drain  # judged again after the reset: healthy
    xid_lines(health, "n3", 48, text="DBE (double bit error) ECC error")  # the reset did not clear it
    code, doc = health.run("n3")
    assert doc["reason"] == "gpu2 Xid 48" and doc["remediation"]["note"].startswith(
        "remediation: reboot request done"
    )
    wait_until("the stand-in RebootProgram's call", lambda: rebootstandin.calls(cluster.layout), timeout=60)
    wait_until(
        "n3 back from its reboot (nextstate=RESUME)",
        lambda: (lambda n: not n.drain and n.state == "idle")(slurm.node("n3")),
        timeout=90,
        interval=1,
    )
    assert [c["node"] for c in rebootstandin.calls(cluster.layout)] == ["n3"]
    code, doc, calls = run_counting(health, "n3")  # boot id unchanged: still waiting, Slurm left alone
    assert doc["action"] == "hold" and calls == []
    # what the boot did to the node: a new boot id and a new kernel log
    (health.base("n3") / "root/proc/sys/kernel/random/boot_id").write_text("boot-2\n")
    (health.base("n3") / "root/dev/kmsg").write_text(
        "6,3,100,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
    )
    code, doc = health.run("n3")
    assert doc["status"] == "ok" and not slurm.node("n3").drain
    xid_lines(health, "n3", 48, text="DBE (double bit error) ECC error")  # and still
    code, doc = health.run("n3")
    n3 = slurm.node("n3")
    assert (
        code == 0
        and n3.drain
        and n3.reason.startswith("stune: repair: gpu2 Xid 48 x3 after reset ")
        and ", reboot " in n3.reason
    )
    for _ in range(2):
        _code, doc, calls = run_counting(health, "n3")
        assert doc["reason"] == n3.reason.removeprefix("stune: ") and not [c for c in calls if "reboot" in c]
    assert len(rebootstandin.calls(cluster.layout)) == 1 and resets.read_text().count("\n") == 1
    env = dict(os.environ, **health.env, SLURMD_NODENAME="n3")
    shown = subprocess.run([f"{BIN}/stune-health", "incidents"], env=env, capture_output=True, text=True)
    assert "remediation: reset " in shown.stdout and "drained for repair" in shown.stdout


def test_a_read_that_hangs_on_three_consecutive_runs_drains_the_node(health, slurm):
    profiles(health, "hang-profiles", [("health:\n", "health:\n  probe_timeout_s: 0.5\n")])
    health.all_healthy()
    state = health.base("n2") / "root/sys/class/infiniband/mlx5_2/ports/1/state"
    state.unlink()
    os.mkfifo(state)  # opening it blocks, as a wedged HCA driver blocks the read
    try:
        code, doc = health.run("n2")
        assert (code, doc["status"], slurm.node("n2").drain) == (0, "unknown", False)
        code, doc = health.run("n2")
        assert (doc["status"], doc["reason"]) == ("degraded", "sysfs read of mlx5_2 hung")
        assert DEGRADED_FEATURE in slurm.node("n2").feature_set and not slurm.node("n2").drain
        code, doc = health.run("n2")
        n2 = slurm.node("n2")
        assert (doc["status"], n2.drain, n2.reason) == (
            "fail",
            True,
            "stune: sysfs read of mlx5_2 hung for 3 runs",
        )
        assert DEGRADED_FEATURE not in n2.feature_set
    finally:
        try:  # a reader still blocked on it (none should be: each run exits) is let go
            os.close(os.open(state, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        state.unlink()
        state.write_text("4: ACTIVE\n")
    time.sleep(0.2)
    code, doc = health.run("n2")
    assert doc["status"] == "ok" and not slurm.node("n2").drain
