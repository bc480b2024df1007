"""The dev cluster's AMD and Ascend devices, hardware-less like its NVIDIA ones.

Ascend: every node has gres/npu over fake /dev/davinci0-3 (conffiles.py) and its own tools directory,
`nodes/<node>/accel-tools` ($STUNE_ACCEL_TOOLS=<cluster>/nodes/%n/accel-tools in the site's env file), holding
the stand-in `npu-smi` and `hccn_tool` of tests/accel_standins/ (copied there by `up`) and `state.json`, the
values they print: each NPU's name, health, AICore %, HBM, power, temperature and processes, and each NPU's
on-card RoCE port (link, net_health, IP). `up` writes the healthy default (default_npu_state); a test injects a
Warning or a DOWN port with write_npu_state() and puts the default back afterwards.

AMD: a node's replay file `nodes/<node>/gpus.json` ($STUNE_GPU_SNAPSHOT) gets an `accel` section (hw/accel.py's
format, vendor amd, 4 MI300X) beside its NVIDIA `gpus` section: set_accel_replay(). Nothing writes that file
by default, so the NVIDIA partitions behave as before: with no `accel` section it is exactly what the test
wrote; without a file there is no replay.

A part of DevCluster (devcluster.py), which supplies `layout`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
from pathlib import Path

from slurm_tune.safeio import write_atomic

from .layout import DAVINCI_MAJOR, NODES, NPUS_PER_NODE, REPO, Layout

STANDINS = REPO / "tests" / "accel_standins"
TOOLS = ("npu-smi", "hccn_tool")
STATE_FILE = "state.json"


def npu_entry(i: int, **values) -> dict:
    """One idle, healthy 910B3 NPU of a state.json (id and davinci number `i`), with `values` changed."""
    return {
        "id": i,
        "chip": 0,
        "name": "910B3",
        "health": "OK",
        "power_w": 92.5,
        "temp_c": 45,
        "aicore_pct": 0,
        "memory_used_mb": 0,
        "memory_total_mb": 0,
        "hbm_used_mb": 3400,
        "hbm_total_mb": 65536,
        "bus_id": f"0000:{0xC1 + i:02X}:00.0",
        "processes": [],
        **values,
    }


def default_npu_state(node: str, npus: int = NPUS_PER_NODE) -> dict:
    """A healthy Atlas 800T A2 node with `npus` idle 910B3 NPUs: OK, AICore 0 %, no process, every port UP
    with net_health Success and its own address (192.168.<node>.<npu>: the nodes' device IPs differ, as a
    rank table needs). A stand-in's own default (tests/accel_standins/state.json) wins where it ships one."""
    shipped = STANDINS / STATE_FILE
    if shipped.is_file():
        return json.loads(shipped.read_text())
    host = NODES.index(node) + 1 if node in NODES else 9
    return {
        "npu_smi_version": "24.1.rc2",
        "npus": [npu_entry(i) for i in range(npus)],
        "ports": {
            str(i): {
                "link": "UP",
                "net_health": "Success",
                "ip": f"192.168.{host}.{10 + i}",
                "netmask": "255.255.255.0",
            }
            for i in range(npus)
        },
    }


def amd_section(
    util: float | None = 0.0, procs: int | None = 0, devices: int = 4, power: float = 150.0
) -> dict:
    """An `accel` section (hw/accel.py) of `devices` MI300X reading `util` % GFX activity with `procs` processes
    each (None: unmeasured / the tool cannot tell), numbered by render node (minor 0 is renderD128)."""
    return {
        "answered": True,
        "vendor": "amd",
        "source": "replay",
        "elapsed_s": 0.05,
        "system": {
            "driver_version": "6.8.5",
            "firmware_version": None,
            "cann_version": None,
            "rocm_version": "6.2.0",
            "tool_version": "24.6.3",
            "errors": {},
        },
        "devices": [
            {
                "index": i,
                "chip": 0,
                "minor": i,
                "name": "AMD Instinct MI300X",
                "health": None,
                "bus_id": f"0000:{0x0C + 0x10 * i:02x}:00.0",
                "serial": f"PV-MI300X-{i:04d}",
                "power_w": power,
                "power_limit_w": 750.0,
                "temperature_c": 48.0,
                "util_pct": util,
                "mem_util_pct": None if util is None else util / 2,
                "mem_used_mb": 4096.0,
                "mem_total_mb": 196592.0,
                "ecc": {"uncorrected": 0, "corrected": 0},
                "pcie": {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5},
                "links": [{"link": k, "kind": "xgmi", "up": True} for k in range(devices) if k != i],
                "processes": None
                if procs is None
                else [{"pid": 4000 + p, "mem_mb": 2048.0} for p in range(procs)],
                "errors": {},
            }
            for i in range(devices)
        ],
        "ports": {},
    }


def ascend_section(aicore: float | None = 0.0, procs: int | None = 0, npus: int = NPUS_PER_NODE) -> dict:
    """An `accel` section (hw/accel.py, vendor ascend) of `npus` 910B3 chips at `aicore` % AICore with `procs`
    processes each, as a replay of npu-smi: numbered by /dev/davinciN."""
    return {
        "answered": True,
        "vendor": "ascend",
        "source": "replay",
        "elapsed_s": 0.2,
        "system": {
            "driver_version": "24.1.rc2",
            "firmware_version": "7.5.0.1.129",
            "cann_version": "8.0.RC2",
            "rocm_version": None,
            "tool_version": "24.1.rc2",
            "errors": {},
        },
        "devices": [
            {
                "index": i,
                "chip": 0,
                "minor": i,
                "name": "910B3",
                "health": "OK",
                "bus_id": f"0000:{0xC1 + i:02x}:00.0",
                "serial": None,
                "power_w": 92.5 if not aicore else 300.0,
                "power_limit_w": None,
                "temperature_c": 45.0,
                "util_pct": aicore,
                "mem_util_pct": 5.2,
                "mem_used_mb": 3400.0,
                "mem_total_mb": 65536.0,
                "ecc": {"uncorrected": None, "corrected": None},
                "pcie": {"width": None, "max_width": None, "gen": None, "max_gen": None},
                "links": [],
                "processes": None
                if procs is None
                else [{"pid": 5000 + p, "mem_mb": 1024.0} for p in range(procs)],
                "errors": {},
            }
            for i in range(npus)
        ],
        "ports": {
            str(i): {
                "link": "UP",
                "net_health": "Success",
                "ip": f"192.168.1.{10 + i}",
                "netmask": "255.255.255.0",
                "errors": {},
            }
            for i in range(npus)
        },
    }


class AccelNodes:
    layout: Layout

    def make_npu_devices(self) -> None:
        """The fake /dev/davinciN character devices gres.conf lists (Slurm stats each File=)."""
        for i in range(NPUS_PER_NODE):
            path = self.layout.dev / f"davinci{i}"
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(DAVINCI_MAJOR, i))

    def install_accel_tools(self) -> list[str]:
        """Copy the Ascend stand-ins into every node's tools directory and write its healthy default state
        (a session starts on healthy NPUs, whatever an interrupted run injected). Returns the tools copied:
        none where tests/accel_standins/ does not ship them (the ascend partition's live reads then fail as a
        node without npu-smi does)."""
        copied = [t for t in TOOLS if (STANDINS / t).is_file()]
        for node in NODES:
            tools = self.layout.accel_tools(node)
            tools.mkdir(parents=True, exist_ok=True)
            for name in copied:
                shutil.copyfile(STANDINS / name, tools / name)
                (tools / name).chmod(0o755)
            self.write_npu_state(node)
        return copied

    def npu_state(self, node: str) -> dict:
        """The values the node's stand-in tools print now."""
        return json.loads((self.layout.accel_tools(node) / STATE_FILE).read_text())

    def write_npu_state(self, node: str, state: dict | None = None) -> Path:
        """Set what the node's `npu-smi` and `hccn_tool` print (None: the healthy default). Atomic: a tool
        running now reads the old state or the new one, never half of it."""
        path = self.layout.accel_tools(node) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(default_npu_state(node) if state is None else state, indent=1)
        write_atomic(str(path), text + "\n", mode=0o644)
        return path

    def set_accel_replay(self, node: str, section: dict | None) -> Path:
        """Put an `accel` section into the node's replay file (None: take it out), leaving its `gpus` section
        as it is; a file left with nothing in it is removed."""
        path = self.layout.gpu_replay(node)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        if section is None:
            doc.pop("accel", None)
        else:
            doc["accel"] = copy.deepcopy(section)
        if doc:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(path), json.dumps(doc), mode=0o644)
        else:
            path.unlink(missing_ok=True)
        return path
