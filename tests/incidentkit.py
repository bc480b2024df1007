"""Helpers for the incident, ladder and hang tests on one node without a cluster: the node's world (a
DGX-A100 sysfs tree with a kernel log and a boot id, a GPU snapshot, a state dir, a profile directory) and a
stand-in for the Slurm adapter that keeps the node's state as slurmctld would (the dev cluster tests do
the same against real Slurm)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import healthkit as kit
import hwtrees

from slurm_tune.health import node as health_node
from slurm_tune.slurm import Node

T0 = 1_750_000_000.0


class StandInSlurm:
    """The adapter calls the periodic run makes (nodes, node, update_node, reboot_node), on three nodes of
    partition hdr; `calls` records each, as the real adapter does."""

    def __init__(self, names=("n1", "n2", "n3")):
        self.calls: list[tuple] = []
        self.state = {n: {"base": "idle", "flags": set(), "reason": "", "reason_time": 0} for n in names}

    def _node(self, name: str) -> Node:
        s = self.state[name]
        return Node(
            name=name,
            state=s["base"],
            flags=tuple(sorted(s["flags"])),
            reason=s["reason"],
            reason_user="root",
            reason_time=s["reason_time"],
            features="",
            active_features="",
            comment=s.get("comment", ""),
            partitions=("hdr",),
            gres="gpu:4",
            gres_used="",
            tres="",
        )

    def nodes(self, names=None):
        self.calls.append(("nodes",))
        return [self._node(n) for n in (names or self.state)]

    def node(self, name: str) -> Node:
        self.calls.append(("node", name))
        return self._node(name)

    def update_node(self, node, *, state=None, reason=None, features=None, comment=None):
        self.calls.append(("update_node", node, state, reason))
        s = self.state[node]
        if state == "DRAIN":
            s["flags"].add("DRAIN")
            s["reason"], s["reason_time"] = reason or s["reason"], int(time.time())
        elif state == "RESUME":
            s["flags"].discard("DRAIN")
            s["reason"], s["reason_time"] = "", 0
        elif reason is not None:
            s["reason"] = reason
        if comment is not None:
            s["comment"] = comment

    def reboot_node(self, node, reason, *, asap=True, next_state="RESUME"):
        self.calls.append(("reboot_node", node, reason, asap, next_state))
        s = self.state[node]
        s["flags"] |= {"DRAIN", "REBOOT_REQUESTED"}
        s["reason"], s["reason_time"] = reason, int(time.time())

    def rebooted(self, node) -> None:
        """What slurmctld does when the node registers after the boot, with nextstate=RESUME."""
        s = self.state[node]
        s["flags"] -= {"DRAIN", "REBOOT_REQUESTED"}
        s["reason"], s["reason_time"] = "", 0


class World:
    """One node (n1) of partition hdr, judged by `stune-health run` (health_node.run) in-process."""

    def __init__(self, tmp: Path, monkeypatch, profile_yaml: str = "", health_yaml: str = ""):
        self.tmp = tmp
        self.root = kit.tree(tmp / "root", "hdr")
        self.kmsg = hwtrees.kmsg(
            self.root, ["6,1201,350123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module"]
        )
        hwtrees.boot_id(self.root, "boot-1")
        self.gpus = kit.gpu_file(tmp / "gpus.json")
        edits = []
        if profile_yaml:
            edits.append(("placement:\n", profile_yaml + "placement:\n"))
        if health_yaml:
            edits.append(("health:\n", "health:\n" + health_yaml))
        self.profiles = kit.profile_dir(tmp / "profiles", {"hdr.yaml": edits} if edits else None)
        self.env = {
            "STUNE_SYSFS_ROOT": str(self.root),
            "STUNE_GPU_SNAPSHOT": str(self.gpus),
            "STUNE_STATE_DIR": str(tmp / "state"),
            "STUNE_HEALTH_PARTITION": "hdr",
            "SLURMD_NODENAME": "n1",
            "STUNE_PARTITIONS": str(self.profiles),
            "STUNE_CACHE_DIR": str(tmp / "cache"),
        }
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)
        from slurm_tune.health import apply

        monkeypatch.setattr(apply, "BREAKER_SETTLE_S", 0.0)
        self.slurm = StandInSlurm()
        self.seq = 1288

    def xid(
        self, code: int, n: int = 1, pci: str = "0000:47:00", text: str = "GPU has fallen off the bus."
    ) -> None:
        with open(self.kmsg, "a") as fh:
            for _ in range(n):
                self.seq += 1
                fh.write(
                    f"\n4,{self.seq},{self.seq * 1000},-;NVRM: Xid (PCI:{pci}): {code}, pid=2231, name=python, {text}"
                )

    def reboot(self, boot: str) -> None:
        """The node came back from a reboot: a new boot id, a new kernel log, Slurm resumed it."""
        hwtrees.boot_id(self.root, boot)
        self.kmsg.write_text("6,3,100,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
        self.slurm.rebooted("n1")

    def run(self) -> tuple[int, dict]:
        before = len(self.slurm.calls)
        code, doc = health_node.run(health_node.settings({}), self.slurm)
        self.new_calls = self.slurm.calls[before:]
        return code, doc


def reset_recorder(tmp: Path, name: str = "resets", exit_code: int = 0, sleep: float = 0) -> tuple[str, Path]:
    """A stand-in GPU reset command that records its argument: (profile YAML for remediation.reset_command,
    the log it writes)."""
    log = tmp / f"{name}.log"
    script = tmp / f"{name}.py"
    script.write_text(
        "import sys, time\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"time.sleep({sleep})\n"
        f"print('GPU reset stand-in: exit {exit_code}')\n"
        f"sys.exit({exit_code})\n"
    )
    return f'  reset_command: ["{sys.executable}", "{script}", "{{pci}}"]\n', log
