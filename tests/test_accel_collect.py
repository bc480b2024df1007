"""The `accel` section's wiring (health/collect.py, hw/sysfs.py): the prolog's PCI bus view of an AMD or Ascend
partition's devices (and nothing else new: no vendor tool, no NVML), the full capture through the vendor's
backend (stand-ins in sys.modules for hw.ascend and hw.amd, called by their contract names), its replay from a
GPU snapshot file, and the hooks and the periodic run judging it: the bus addresses a full check remembers and
a later prolog finds gone."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import drifttrees
import hwtrees
import pytest
from test_accel_checks import amd_section, ascend_section, port, profile_dir

from slurm_tune.health import collect, judge
from slurm_tune.health import node as health_node
from slurm_tune.health import state as health_state
from slurm_tune.health.result import FAIL, OK, UNKNOWN
from slurm_tune.hw import snapshot as hw_snapshot
from slurm_tune.hw.sysfs import Sysfs
from slurm_tune.profiles import load_profile

NPU_ADDRS = [f"0000:{0xC1 + i:02x}:00.0" for i in range(8)]
AMD_ADDRS = [f"0000:{0x05 + 0x10 * i:02x}:00.0" for i in range(8)]


def node_tree(root: Path, vendor: str, n: int = 8) -> Path:
    """A node's sysfs tree: eth0, the vendor's `n` devices on the PCI bus, and the neighbours a scan must leave
    out (a Huawei NIC, an NVIDIA GPU, AMD's HDMI audio and an AMD CPU function)."""
    root = Path(root)
    hwtrees.numa(root, {0: "0-47"})
    drifttrees.host(root, fabricmanager=False)
    hwtrees.netdev(root, "eth0")
    kw = {"numa_node": 0, "local_cpulist": "0-47"}
    for i in range(n):
        if vendor == "ascend":
            hwtrees.pci_device(root, NPU_ADDRS[i], vendor="0x19e5", device="0xd802", cls="0x120000", **kw)
        else:
            cls = "0x120000" if i % 2 else "0x038000"  # MI300X, MI250X: both AMD's accelerators
            hwtrees.pci_device(root, AMD_ADDRS[i], vendor="0x1002", device="0x74a1", cls=cls, **kw)
    hwtrees.pci_device(
        root, "0000:3b:00.0", vendor="0x19e5", device="0x1822", cls="0x020000", **kw
    )  # Hi1822 NIC
    hwtrees.pci_device(root, "0000:4e:00.0", vendor="0x10de", device="0x20b0", cls="0x030200", **kw)
    hwtrees.pci_device(
        root, "0000:05:00.1", vendor="0x1002", device="0xab38", cls="0x040300", **kw
    )  # HDMI audio
    hwtrees.pci_device(
        root, "0000:00:18.0", vendor="0x1022", device="0x14f0", cls="0x060000", **kw
    )  # AMD CPU
    return root


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Profiles asc (ascend), mi (amd) and nv (nvidia) in tmp_path, and load(name) for them."""
    directory = profile_dir(tmp_path)
    monkeypatch.setenv("STUNE_PARTITIONS", str(directory))
    monkeypatch.setenv("STUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("STUNE_HEALTH_PARTITION", raising=False)
    monkeypatch.delenv("STUNE_GPU_SNAPSHOT", raising=False)
    return {"tmp": tmp_path, "load": lambda name: load_profile(name, str(directory))}


@pytest.fixture
def no_nvml(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("NVML read on an amd/ascend partition")

    monkeypatch.setattr(hw_snapshot, "_read_gpus", refuse)


class Backend:
    """A stand-in for hw.ascend / hw.amd: records each capture call and returns `section`."""

    def __init__(self, monkeypatch, vendor: str, section=None, error: BaseException | None = None):
        self.calls: list = []
        module = types.ModuleType(f"slurm_tune.hw.{vendor}")

        def capture(*args, **kw):
            self.calls.append((args, kw))
            if error is not None:
                raise error
            return section

        module.capture = capture  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, f"slurm_tune.hw.{vendor}", module)


# ---- the prolog's snapshot --------------------------------------------------------------------------------
def test_the_bus_lists_each_vendors_accelerators_only(tmp_path):
    asc = Sysfs(str(node_tree(tmp_path / "a", "ascend")))
    assert asc.vendor_devices("ascend") == NPU_ADDRS
    mi = Sysfs(str(node_tree(tmp_path / "m", "amd")))
    assert mi.vendor_devices("amd") == AMD_ADDRS
    assert mi.vendor_devices("ascend") == [] and asc.vendor_devices("amd") == []
    assert mi.nvidia_gpus() == ["0000:4e:00.0"]


def test_the_prolog_of_an_ascend_node_reads_the_bus_view_and_no_gpu_section(world, tmp_path, no_nvml):
    root = node_tree(tmp_path / "root", "ascend")
    snap = collect.fast(str(root), world["load"]("asc"), "n1")
    assert set(snap) - {"format", "node", "captured_at", "sysfs_root", "scope", "problems"} == {
        "net",
        "pci_accel",
    }
    section = snap["pci_accel"]
    assert section["answered"] is True and section["vendor"] == "ascend" and section["known"] == []
    assert sorted(section["devices"]) == NPU_ADDRS
    assert section["devices"][NPU_ADDRS[0]]["device"] == "0xd802"
    verdict, _ = judge.judge(snap, world["load"]("asc"), {})
    assert verdict.status == OK, [r.line() for r in verdict.results if r.status != OK]
    assert [r.check for r in verdict.results if r.check.startswith(("accel", "gpu"))] == ["accel.pci"]


def test_the_prolog_reads_the_addresses_a_full_check_listed_and_names_the_one_gone(world, tmp_path):
    root = node_tree(tmp_path / "root", "amd")
    hwtrees.remove_pci(root, AMD_ADDRS[5])
    snap = collect.fast(str(root), world["load"]("mi"), "n1", known_gpus=AMD_ADDRS)
    assert snap["pci_accel"]["devices"][AMD_ADDRS[5]] == {"present": False}
    assert snap["pci_accel"]["known"] == AMD_ADDRS
    verdict, _ = judge.judge(snap, world["load"]("mi"), {})
    assert verdict.status == FAIL and verdict.reason == "0000:55:00.0 gone from PCI"


def test_the_nvidia_prolog_snapshot_is_as_before(world, tmp_path):
    import healthkit as kit

    root = kit.tree(tmp_path / "root", "vpc")
    profile = kit.profile("vpc", kit.REPO / "partitions")
    snap = collect.fast(str(root), profile, "n1")
    assert "pci_accel" not in snap and sorted(snap["pci_gpus"]["devices"]) == [
        f"0000:00:{0x1B + i:02x}.0" for i in range(4)
    ]
    known = [f"0000:00:{0x1B + i:02x}.0" for i in range(4)]
    again = collect.fast(str(root), profile, "n1", known_gpus=known)
    assert sorted(again["pci_gpus"]["devices"]) == known


# ---- the full capture -------------------------------------------------------------------------------------
def test_a_full_capture_of_an_ascend_node_calls_its_backend_by_the_contract(
    world, tmp_path, monkeypatch, no_nvml
):
    root = node_tree(tmp_path / "root", "ascend")
    backend = Backend(monkeypatch, "ascend", ascend_section())
    profile = world["load"]("asc")
    snap = collect.full(str(root), profile, "n1", timeout_s=3.0, known_gpus=NPU_ADDRS[:2])
    ((args, kw),) = backend.calls
    assert args == (str(root), 3.0) and kw == {"tools": profile.accel.tools, "environ": None, "node": "n1"}
    assert snap["accel"] == ascend_section()
    assert snap["gpus"]["answered"] is False and "ascend: NVML is not used" in snap["gpus"]["error"]
    assert sorted(snap["pci_accel"]["devices"]) == NPU_ADDRS and snap["pci_accel"]["known"] == NPU_ADDRS[:2]
    verdict, updates = judge.judge(snap, profile, {})
    assert verdict.status == OK, [r.line() for r in verdict.results if r.status != OK]
    assert updates["gpu_pci"] == NPU_ADDRS


def test_a_full_capture_of_an_amd_node_calls_amd_capture_with_its_deadline(
    world, tmp_path, monkeypatch, no_nvml
):
    root = node_tree(tmp_path / "root", "amd")
    backend = Backend(monkeypatch, "amd", amd_section())
    snap = collect.full(str(root), world["load"]("mi"), "n1", timeout_s=2.5)
    assert backend.calls == [((2.5,), {"root": str(root)})]  # the ROCm version file under the node's root
    assert snap["accel"]["vendor"] == "amd" and len(snap["pci_accel"]["devices"]) == 8


@pytest.mark.parametrize(
    "error, section, message",
    [
        (
            ImportError("No module named 'slurm_tune.hw.ascend'"),
            None,
            "not captured: stune's ascend backend cannot be imported: No module named 'slurm_tune.hw.ascend'",
        ),
        (RuntimeError("bug"), None, "not captured: stune's ascend backend failed: RuntimeError: bug"),
        (None, ["not", "a", "section"], "not captured: stune's ascend backend gave no section"),
    ],
)
def test_a_backend_stune_cannot_use_is_unknown_never_the_nodes_failure(
    world, tmp_path, monkeypatch, error, section, message
):
    Backend(monkeypatch, "ascend", section, error)
    snap = collect.full(
        str(node_tree(tmp_path / "root", "ascend")), world["load"]("asc"), "n1", timeout_s=2.0
    )
    assert snap["accel"] == {
        "answered": False,
        "vendor": "ascend",
        "source": "stune",
        "devices": [],
        "error": message,
    }
    verdict, _ = judge.judge(snap, world["load"]("asc"), {})
    assert verdict.status == UNKNOWN and verdict.reason == f"node: NPUs not judged: {message}"


def test_a_cpu_partition_captures_no_accel_section(world, tmp_path, monkeypatch):
    backend = Backend(monkeypatch, "ascend", ascend_section())
    (Path(world["tmp"]) / "profiles" / "cpu.yaml").write_text(
        "partition: cpu\naccelerator: ascend\nfabric: {type: tcp, socket_ifname: eth0}\ngpu: {count: 0}\n"
    )
    profile = load_profile("cpu", str(Path(world["tmp"]) / "profiles"))
    snap = collect.full(str(node_tree(tmp_path / "root", "ascend")), profile, "n1", timeout_s=2.0)
    assert "accel" not in snap and "pci_accel" not in snap and backend.calls == []


# ---- replay -----------------------------------------------------------------------------------------------
def gpu_file(path: Path, **sections) -> Path:
    path.write_text(json.dumps({"format": hw_snapshot.FORMAT, **sections}))
    return path


def test_an_accel_section_replays_from_the_gpu_snapshot_file(world, tmp_path, monkeypatch, no_nvml):
    backend = Backend(monkeypatch, "amd", amd_section(n=1))
    replay = gpu_file(tmp_path / "gpus.json", accel=amd_section(), gpus={"answered": True, "devices": []})
    root = node_tree(tmp_path / "root", "amd")
    snap = collect.full(str(root), world["load"]("mi"), "n1", gpu_snapshot=str(replay), timeout_s=2.0)
    assert snap["accel"] == amd_section() and backend.calls == []
    none = gpu_file(tmp_path / "plain.json", gpus={"answered": True, "devices": []})
    snap = collect.full(str(root), world["load"]("mi"), "n1", gpu_snapshot=str(none), timeout_s=2.0)
    assert snap["accel"]["error"] == f"not captured: GPU snapshot {none} has no 'accel'"
    missing = tmp_path / "nothing.json"
    snap = collect.full(str(root), world["load"]("mi"), "n1", gpu_snapshot=str(missing), timeout_s=2.0)
    assert snap["accel"]["error"].startswith(f"not captured: GPU snapshot {missing}")
    assert "No such file or directory" in snap["accel"]["error"]
    verdict, _ = judge.judge(snap, world["load"]("mi"), {})
    assert verdict.status == UNKNOWN


def test_replaying_gpus_keeps_its_messages(tmp_path):
    missing = tmp_path / "none.json"
    error = collect.replay_gpus(str(missing))["error"]
    assert error.startswith(f"not captured: GPU snapshot {missing}") and "No such file or directory" in error
    accel_only = gpu_file(tmp_path / "a.json", accel=ascend_section())
    assert (
        collect.replay_gpus(str(accel_only))["error"]
        == f"not captured: GPU snapshot {accel_only} has no 'gpus'"
    )


def test_a_capture_for_triage_keeps_a_replayed_accel_section(world, tmp_path):
    import healthkit as kit

    replay = gpu_file(tmp_path / "gpus.json", accel=ascend_section(), gpus={"answered": True, "devices": []})
    snap = collect.full(
        str(kit.tree(tmp_path / "root", "vpc")), None, "n1", gpu_snapshot=str(replay), timeout_s=2.0
    )
    assert snap["accel"] == ascend_section()


# ---- the hooks and the periodic run -----------------------------------------------------------------------
def settings(world, root: Path, partition: str, replay: Path | None = None):
    options = {
        "partition": partition,
        "sysfs_root": str(root),
        "state_dir": str(world["tmp"] / "state"),
        "node": "n1",
    }
    if replay is not None:
        options["gpu_snapshot"] = str(replay)
    return health_node.settings(options, environ={})


def test_epilog_then_prolog_an_npu_gone_from_the_bus_fails_the_prolog(world, tmp_path, no_nvml):
    root = node_tree(tmp_path / "root", "ascend")
    replay = gpu_file(tmp_path / "gpus.json", accel=ascend_section())
    code, doc = health_node.hook("epilog", settings(world, root, "asc", replay))
    assert (code, doc["status"]) == (0, "ok"), doc["reason"]
    held, _ = health_state.read(str(world["tmp"] / "state"))
    assert held["gpu_pci"] == NPU_ADDRS  # what the prolog checks by address from now on
    code, doc = health_node.hook("prolog", settings(world, root, "asc"))
    assert (code, doc["status"]) == (0, "ok")  # the node has passed this policy: trusted from here on
    hwtrees.remove_pci(root, NPU_ADDRS[6])
    code, doc = health_node.hook("prolog", settings(world, root, "asc"))
    assert doc["status"] == "fail" and doc["reason"] == "0000:c7:00.0 gone from PCI" and code == 1


def test_the_periodic_run_judges_a_port_down_and_says_it_would_drain(world, tmp_path, no_nvml):
    root = node_tree(tmp_path / "root", "ascend")
    ports = {str(i): port(i, link="DOWN" if i == 3 else "UP") for i in range(8)}
    replay = gpu_file(tmp_path / "gpus.json", accel=ascend_section(ports=ports))
    code, doc = health_node.run(settings(world, root, "asc", replay), None, dry_run=True)
    assert code == 0 and doc["status"] == "fail" and doc["reason"] == "npu3 port link DOWN"
    assert doc["action"] == "drain"


def test_a_device_id_stune_does_not_know_is_learned_from_the_full_check(world, tmp_path, monkeypatch):
    root = node_tree(tmp_path / "root", "ascend", n=0)
    kw = {"numa_node": 0, "local_cpulist": "0-47"}
    for address in NPU_ADDRS:  # a later model's id: not in hw/sysfs.ACCEL_PCI
        hwtrees.pci_device(root, address, vendor="0x19e5", device="0xd806", cls="0x120000", **kw)
    profile = world["load"]("asc")
    verdict, _ = judge.judge(collect.fast(str(root), profile, "n1"), profile, {})
    assert verdict.status == UNKNOWN and verdict.reason.startswith(
        "node: no device with an Ascend id stune knows"
    )
    Backend(monkeypatch, "ascend", ascend_section())
    verdict, updates = judge.judge(collect.full(str(root), profile, "n1", timeout_s=2.0), profile, {})
    assert verdict.status == OK and updates["gpu_pci"] == NPU_ADDRS
    again, _ = judge.judge(collect.fast(str(root), profile, "n1", known_gpus=NPU_ADDRS), profile, {})
    assert again.status == OK


def test_a_device_the_backend_lists_but_the_bus_lacks_is_read_by_address_and_named(
    world, tmp_path, monkeypatch
):
    root = node_tree(tmp_path / "root", "amd", n=7)
    Backend(monkeypatch, "amd", amd_section())
    snap = collect.full(str(root), world["load"]("mi"), "n1", timeout_s=2.0)
    assert snap["pci_accel"]["devices"][AMD_ADDRS[7]] == {"present": False}
    verdict, _ = judge.judge(snap, world["load"]("mi"), {})
    assert verdict.status == FAIL and verdict.reason == f"{AMD_ADDRS[7]} gone from PCI"


def test_stune_health_capture_of_an_ascend_partition_has_its_accel_section(world, tmp_path, capsys):
    """`stune-health capture -p P` on an Ascend node: what doctor's fix text asks an admin to run. The real
    backend through the stand-in npu-smi and hccn_tool (tests/accel_standins), found in $STUNE_ACCEL_TOOLS."""
    from test_ascend_capture import install, state

    from slurm_tune.cli import health as health_cli

    tools = install(tmp_path / "tools", state(2))
    root = node_tree(tmp_path / "root", "ascend", n=2)
    os.environ["STUNE_ACCEL_TOOLS"] = str(tools)
    try:
        code = health_cli.main(["capture", "-p", "asc", "--sysfs-root", str(root), "--node", "n1"])
    finally:
        del os.environ["STUNE_ACCEL_TOOLS"]
    snap = json.loads(capsys.readouterr().out)
    assert code == 0 and snap["accel"]["answered"] is True and snap["accel"]["source"] == "npu-smi"
    assert [d["minor"] for d in snap["accel"]["devices"]] == [0, 1] and set(snap["accel"]["ports"]) == {
        "0",
        "1",
    }
    assert snap["gpus"]["answered"] is False  # NVML is not asked on an Ascend partition's node
