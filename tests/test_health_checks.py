"""The health checks, judged over snapshots that the real capture code took of fixture nodes shaped like
DGX-A100 (ConnectX-6 HDR), H100 RoCE (ConnectX-7) and cloud VPC machines."""

from __future__ import annotations

import fakenvml
import healthkit as kit
import hwtrees
import pytest

from slurm_tune.health import judge as health_judge
from slurm_tune.health import xid
from slurm_tune.health.result import DEGRADED, FAIL, OK, UNKNOWN, Result, make_verdict
from slurm_tune.health.state import empty


def verdict(snap, partition="hdr", previous=None, directory=None):
    return health_judge.judge(snap, kit.profile(partition, directory), previous or {})


def by(v, check, subject=None):
    found = [
        r for r in v[0].results if r.check == check and (subject is None or r.subject.startswith(subject))
    ]
    assert found, f"no {check} result for {subject}: {[r.line() for r in v[0].results]}"
    return found


@pytest.mark.parametrize("partition", ["hdr", "roce", "vpc"])
def test_a_healthy_node_is_ok_with_every_required_port_judged(tmp_path, partition):
    v = verdict(kit.node_snapshot(tmp_path, partition), partition)
    assert v[0].status == OK, [r.line() for r in v[0].results if r.status != OK]
    hcas = kit.profile(partition).fabric.hcas
    assert {r.subject for r in v[0].results if r.check == "ib.link"} == {f"{h.device}/{h.port}" for h in hcas}
    if partition == "roce":
        assert len(by(v, "ib.netdev")) == 8 and all(r.status == OK for r in by(v, "ib.netdev"))


def test_a_port_down_fails_naming_hca_and_port(tmp_path):
    snap = kit.node_snapshot(
        tmp_path, "hdr", hca_overrides={"mlx5_2": {"state": "1: DOWN", "phys_state": "3: Disabled"}}
    )
    v, _ = verdict(snap)
    assert v.status == FAIL and v.reason == "mlx5_2/1 state DOWN"
    (link,) = [r for r in v.results if r.check == "ib.link" and r.subject == "mlx5_2/1"]
    assert link.message == "state DOWN (1: DOWN), phys_state 3: Disabled; expected ACTIVE and LinkUp"


def test_a_port_polling_fails_on_phys_state(tmp_path):
    snap = kit.node_snapshot(
        tmp_path, "hdr", hca_overrides={"mlx5_4": {"state": "4: ACTIVE", "phys_state": "2: Polling"}}
    )
    assert verdict(snap)[0].reason == "mlx5_4/1 phys_state Polling"


def test_a_missing_hca_fails_and_the_storage_hca_is_not_required(tmp_path):
    import shutil

    root = kit.tree(tmp_path, "hdr")
    shutil.rmtree(root / "sys/class/infiniband/mlx5_5")
    shutil.rmtree(root / "sys/class/infiniband/mlx5_8")  # the storage HCA: not in the profile
    v, _ = verdict(kit.take(root, "hdr"))
    assert v.status == FAIL and v.reason == "mlx5_5 missing"
    assert not any("mlx5_8" in r.subject for r in v.results)


def test_the_link_layer_must_match_the_fabric(tmp_path):
    snap = kit.node_snapshot(tmp_path, "roce", hca_overrides={"mlx5_1": {"link_layer": "InfiniBand"}})
    v, _ = verdict(snap, "roce")
    assert v.status == FAIL and v.reason == "mlx5_1/1 link_layer InfiniBand"


def test_a_slow_port_is_degraded_not_failed(tmp_path):
    snap = kit.node_snapshot(tmp_path, "hdr", hca_overrides={"mlx5_3": {"rate": "100 Gb/sec (2X HDR)"}})
    v, _ = verdict(snap)
    assert v.status == DEGRADED and v.reason == "mlx5_3/1 rate 100 Gb/s < 200"
    assert (
        by((v, None), "ib.rate", "mlx5_3")[0].message
        == "rate 100 Gb/s (100 Gb/sec (2X HDR)); expected at least 200 Gb/s"
    )


def test_roce_netdev_down_or_rebound_fails(tmp_path):
    root = kit.tree(tmp_path, "roce")
    hwtrees.netdev(root, "eth3", operstate="down", flags="0x1002", carrier="0")
    v, _ = verdict(kit.take(root, "roce"), "roce")
    assert v.status == FAIL and v.reason == "eth3 down"


def test_the_socket_interface_must_be_up(tmp_path):
    root = kit.tree(tmp_path, "vpc")
    hwtrees.netdev(root, "ens5", operstate="down", flags="0x1002")
    v, _ = verdict(kit.take(root, "vpc"), "vpc")
    assert v.status == FAIL and v.reason == "ens5 down"


# ---- error counters: deltas since the last run -------------------------------------------------------------


def _counters(tmp_path, name, **counters):
    return kit.node_snapshot(tmp_path / name, "hdr", hca_overrides={"mlx5_0": {"counters": counters}})


def test_counters_first_sight_is_a_baseline_then_increases_are_judged(tmp_path):
    first = verdict(_counters(tmp_path, "a", symbol_error=500, link_downed=7))
    assert first[0].status == OK  # large totals are history, not news
    assert first[1]["baselines"]["mlx5_0/1"] == {
        "symbol_error": 500,
        "link_downed": 7,
        "link_error_recovery": 0,
        "port_rcv_errors": 0,
    }
    state = empty()
    health_judge.merge_state(state, first[1], rebaseline=True)
    second = verdict(_counters(tmp_path, "b", symbol_error=512, link_downed=7), previous=state)
    (r,) = by(second, "ib.counters", "mlx5_0")
    assert r.status == DEGRADED and r.reason == "mlx5_0/1 symbol_error +12"
    assert "symbol_error +12 since the last run (degraded above 10)" in r.message
    third = verdict(_counters(tmp_path, "c", symbol_error=505, link_downed=11), previous=state)
    (r,) = by(third, "ib.counters", "mlx5_0")
    assert r.status == FAIL and r.reason == "mlx5_0/1 link_downed +4"


def test_a_counter_that_went_down_was_reset_and_is_rebaselined(tmp_path):
    state = empty()
    health_judge.merge_state(state, verdict(_counters(tmp_path, "a", symbol_error=900))[1], rebaseline=True)
    v = verdict(_counters(tmp_path, "b", symbol_error=3), previous=state)
    (r,) = by(v, "ib.counters", "mlx5_0")
    assert r.status == OK and "went from 900 to 3 (counters reset): re-baselined" in r.message
    assert v[1]["baselines"]["mlx5_0/1"]["symbol_error"] == 3


def test_a_saturated_counter_cannot_be_measured(tmp_path):
    state = empty()
    health_judge.merge_state(state, verdict(_counters(tmp_path, "a", symbol_error=65535))[1], rebaseline=True)
    (r,) = by(verdict(_counters(tmp_path, "b", symbol_error=65535), previous=state), "ib.counters", "mlx5_0")
    assert r.status == UNKNOWN and "saturated at 65535" in r.message


def test_hooks_do_not_move_baselines_but_the_periodic_run_does():
    state = {"baselines": {"mlx5_0/1": {"symbol_error": 5}}}
    health_judge.merge_state(
        state,
        {"baselines": {"mlx5_0/1": {"symbol_error": 9}, "mlx5_1/1": {"symbol_error": 0}}},
        rebaseline=False,
    )
    assert state["baselines"] == {"mlx5_0/1": {"symbol_error": 5}, "mlx5_1/1": {"symbol_error": 0}}
    health_judge.merge_state(state, {"baselines": {"mlx5_0/1": {"symbol_error": 9}}}, rebaseline=True)
    assert state["baselines"]["mlx5_0/1"] == {"symbol_error": 9}


# ---- versions -------------------------------------------------------------------------------------------------


def test_old_hca_firmware_fails_against_the_minimum(tmp_path):
    snap = kit.node_snapshot(tmp_path, "hdr", hca_overrides={"mlx5_6": {"fw_ver": "20.28.1002"}})
    v, _ = verdict(snap)
    assert v.status == FAIL and v.reason == "mlx5_6 fw 20.28.1002 not validated"
    (r,) = by((v, None), "versions.hca_firmware", "mlx5_6")
    assert (
        r.message == "fw 20.28.1002 on board MT_0000000223 (MT4123); expected 20.31.1014 or newer "
        "(rule MT_0000000223)"
    )


def test_firmware_messages_never_print_none_for_a_missing_field():
    from slurm_tune.health import versions as health_versions

    no_rules = health_versions._one_hca("mlx5_0", {"mlx5_0": {}}, {})
    assert no_rules.status == OK and "None" not in no_rules.message
    assert (
        no_rules.message == "fw unreadable on an unreadable board_id (hca_type unreadable): the profile has "
        "no firmware rules"
    )
    off = health_versions._one_hca(
        "mlx5_0", {"mlx5_0": {"board_id": "MT_0000000223", "hca_type": "MT4123"}}, {"MT_0000000223": None}
    )
    assert off.message == "fw unreadable on board MT_0000000223 (MT4123): rule MT_0000000223 switched off"
    unmatched = health_versions._one_hca(
        "mlx5_0",
        {"mlx5_0": {"board_id": "MT_1", "hca_type": "MT4123", "fw_ver": " "}},
        {"MT_0000000223": {"min": "20.31.1014"}},
    )
    assert "None" not in unmatched.message and unmatched.message.startswith(
        "fw unreadable on board MT_1 (MT4123)"
    )


def test_firmware_rules_by_model_and_allowed_lists(tmp_path):
    directory = kit.profile_dir(
        tmp_path / "p",
        {
            "roce.yaml": [
                ('MT_0000000838: {min: "28.39.1002"}', 'MT4129: {allowed: ["28.39.1002", "28.40.1000"]}')
            ]
        },
    )
    ok_snap = kit.node_snapshot(tmp_path / "a", "roce")
    assert verdict(ok_snap, "roce", directory=directory)[0].status == OK
    newer = kit.node_snapshot(tmp_path / "b", "roce", hca_overrides={"mlx5_0": {"fw_ver": "28.41.1000"}})
    v, _ = verdict(newer, "roce", directory=directory)
    assert (
        v.status == FAIL
        and "expected one of 28.39.1002, 28.40.1000 (rule MT4129)"
        in by((v, None), "versions.hca_firmware", "mlx5_0")[0].message
    )


def test_gpu_driver_below_the_matrix_fails(tmp_path):
    root = kit.tree(tmp_path, "roce")
    nvml = fakenvml.FakeNvml(kit.gpu_devices("h100"), driver="535.104.05", cuda=12010)
    v, _ = verdict(kit.take(root, "roce", nvml=nvml), "roce")
    assert v.status == FAIL
    assert {r.check for r in v.results if r.status == FAIL} == {"versions.gpu_driver", "versions.cuda_driver"}
    assert by((v, None), "versions.cuda_driver")[0].message == "CUDA driver API 12.1; expected 12.2 or newer"


# ---- GPUs ----------------------------------------------------------------------------------------------------


def gpu_verdict(tmp_path, partition="hdr", directory=None, **gpu3):
    kind = kit.NODES[partition][1]
    snap = kit.node_snapshot(tmp_path, partition, devices=kit.gpu_devices(kind, 8, gpu3=gpu3))
    return verdict(snap, partition, directory=directory)


@pytest.mark.parametrize(
    "fields, status, reason",
    [
        ({"ecc_uncorrected": 2}, FAIL, "gpu3 2 uncorrected ECC"),
        ({"retired_pending": 1}, FAIL, "gpu3 retired pages pending"),
        ({"remapped": (0, 1, 1, 0)}, DEGRADED, "gpu3 row remap pending"),
        ({"remapped": (0, 1, 0, 1)}, FAIL, "gpu3 row remap failed"),
        ({"pcie_width": 8}, DEGRADED, "gpu3 PCIe x8"),
        ({"temperature": 91}, DEGRADED, "gpu3 91C"),
        ({"clock_reasons": 0x40 | 0x8}, DEGRADED, "gpu3 hw_slowdown"),
        ({"clock_reasons": 0x80}, DEGRADED, "gpu3 hw_power_brake"),
        ({"clock_reasons": 0x4 | 0x1}, OK, ""),  # power capping at load is normal
        ({"nvlink_down": [3, 5]}, FAIL, "gpu3 NVLink 3 down (+1)"),
        ({"persistence": 0}, DEGRADED, "gpu3 persistence off"),
        ({"name": "NVIDIA A100-SXM4-40GB"}, FAIL, "gpu3 is NVIDIA A100-SXM4-40GB"),
    ],
)
def test_gpu_findings(tmp_path, fields, status, reason):
    v, _ = gpu_verdict(tmp_path, **fields)
    assert (v.status, v.reason) == (status, reason), [r.line() for r in v.results if r.status != OK]


def test_nvlink_down_can_be_only_degraded_by_profile(tmp_path):
    directory = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("nvlink_down: fail", "nvlink_down: degraded")]}
    )
    v, _ = gpu_verdict(tmp_path / "n", directory=directory, nvlink_down=[0])
    assert (v.status, v.reason) == (DEGRADED, "gpu3 NVLink 0 down")


def test_pcie_generation_is_judged_only_under_load(tmp_path):
    idle, _ = gpu_verdict(tmp_path / "idle", pcie_gen=1, pstate=0, util_gpu=0)
    (r,) = by((idle, None), "gpu.pcie", "gpu3")
    assert r.status == OK and "gen 1 of 4 not judged: the GPU is idle" in r.message
    busy, _ = gpu_verdict(tmp_path / "busy", pcie_gen=3, pstate=0, util_gpu=97)
    assert (busy.status, busy.reason) == (DEGRADED, "gpu3 PCIe gen3")
    assert by((busy, None), "gpu.pcie", "gpu3")[0].message == "PCIe gen 3 under load in P0; expected gen 4"


def test_a_missing_gpu_is_named_by_its_pci_address(tmp_path):
    devices = [d for d in kit.gpu_devices("a100") if d["bus_id"] != "00000000:47:00.0"]
    v, _ = verdict(kit.node_snapshot(tmp_path, "hdr", devices=devices))
    assert (v.status, v.reason) == (FAIL, "7/8 GPUs")
    assert "on the PCI bus but not in NVML: 0000:47:00.0" in by((v, None), "gpu.count")[0].message


def test_nvml_that_hangs_fails_as_did_not_answer(tmp_path):
    root = kit.tree(tmp_path, "hdr")
    nvml = fakenvml.FakeNvml(kit.gpu_devices("a100"), hang_on_index=5)
    from slurm_tune.hw import snapshot

    snap = snapshot.capture(str(root), nvml_module=nvml, node="n1", timeout_s=0.3)
    v, _ = verdict(snap)
    assert (v.status, v.reason) == (FAIL, "NVML not answering")
    msg = by((v, None), "gpu.nvml")[0].message
    assert "did not answer within 0.3s" in msg and "stalled reading gpu5" in msg


def test_a_lost_gpu_fails(tmp_path):
    root = kit.tree(tmp_path, "hdr")
    v, _ = verdict(kit.take(root, "hdr", lost_index=2))
    assert (v.status, v.reason) == (FAIL, "gpu2 lost")
    assert by((v, None), "gpu.nvml", "gpu2")[0].message == "NVML says the GPU is lost; expected it to answer"


def test_no_pynvml_is_unknown_but_no_driver_fails():
    profile = kit.profile("hdr")
    no_module = {
        "format": "stune-snapshot/1",
        "gpus": {
            "answered": False,
            "devices": [],
            "error": "NVML unavailable: the nvml extra (nvidia-ml-py) is not installed",
        },
    }
    assert health_judge.judge(no_module, profile, {})[0].status == UNKNOWN
    no_driver = {
        "format": "stune-snapshot/1",
        "gpus": {
            "answered": False,
            "devices": [],
            "error": "NVML unavailable: libnvidia-ml.so not found (no NVIDIA driver?)",
        },
    }
    v, _ = health_judge.judge(no_driver, profile, {})
    assert v.status == FAIL and v.reason == "NVML not answering"


# ---- Xid events --------------------------------------------------------------------------------------------------


def kmsg_line(seq, code, pci="0000:47:00", text="GPU has fallen off the bus."):
    return f"4,{seq},{seq * 1000},-;NVRM: Xid (PCI:{pci}): {code}, pid=2231, name=python, {text}"


def booted(tmp_path, boot, records):
    root = kit.tree(tmp_path, "hdr")
    hwtrees.kmsg(root, records)
    if boot:
        hwtrees.boot_id(root, boot)
    return kit.take(root, "hdr")


def test_a_fatal_xid_fails_and_is_held_until_reboot(tmp_path):
    snap = booted(tmp_path / "a", "boot-1", [kmsg_line(1288, 79)])
    v, updates = verdict(snap)
    assert (v.status, v.reason) == (FAIL, "gpu2 Xid 79")
    assert "GPU has fallen off the bus" in by((v, None), "gpu.xid")[0].message
    state = empty()
    health_judge.merge_state(state, updates, rebaseline=True)
    assert state["xid_seq"] == 1288
    again, _ = verdict(snap, previous=state)  # no new event, but the GPU still needs a reset
    assert (again.status, again.reason) == (FAIL, "gpu2 Xid 79")
    rebooted = booted(tmp_path / "b", "boot-2", ["6,3,100,-;NVRM: loading NVIDIA UNIX Kernel Module"])
    after, updates = verdict(rebooted, previous=state)
    assert after.status == OK and updates["xid_sticky"] == [] and updates["boot_id"] == "boot-2"


def test_without_a_boot_id_a_restarted_kernel_log_means_a_reboot(tmp_path):
    state = empty()
    health_judge.merge_state(
        state, verdict(booted(tmp_path / "a", None, [kmsg_line(1288, 48)]))[1], rebaseline=True
    )
    assert state["xid_sticky"][0]["xid"] == 48
    v, updates = verdict(
        booted(tmp_path / "b", None, [kmsg_line(7, 13, text="Graphics Exception")]), previous=state
    )
    assert v.status == OK and updates["xid_seq"] == 7 and updates["xid_sticky"] == []


def test_application_xids_are_not_held_against_the_node(tmp_path):
    snap = kit.node_snapshot(
        tmp_path,
        "hdr",
        kmsg=[
            kmsg_line(10, 13, text="Graphics Exception"),
            kmsg_line(11, 31, text="MMU Fault"),
            kmsg_line(12, 999, text="something new"),
        ],
    )
    v, _ = verdict(snap)
    assert v.status == OK
    messages = [r.message for r in v.results if r.check == "gpu.xid"]
    assert any("Xid 999 (not in stune's Xid table)" in m for m in messages)


def test_only_xids_after_the_last_run_count(tmp_path):
    snap = kit.node_snapshot(tmp_path, "hdr", kmsg=[kmsg_line(50, 63, text="Row Remapper")])
    assert verdict(snap)[0].status == DEGRADED
    assert verdict(snap, previous={"xid_seq": 50})[0].status == OK


def test_every_table_entry_has_an_action_a_remedy_and_a_meaning():
    for code, rule in xid.XIDS.items():
        assert rule.action in xid.LEVELS and rule.remedy in xid.REMEDIES and rule.meaning, code
        assert not (rule.app and rule.action == xid.DRAIN), code  # an application's Xid never drains
    assert xid.rule_for(xid.XIDS, 79).action == xid.DRAIN and xid.rule_for(xid.XIDS, 13).action == xid.COUNT
    assert xid.rule_for(xid.XIDS, 4242) is xid.UNKNOWN_RULE


# ---- verdicts and internal errors ------------------------------------------------------------------------------


def test_a_check_that_raises_is_unknown_never_fail(tmp_path, monkeypatch):
    from slurm_tune.health import ib

    def broken(*args):
        raise KeyError("bug")

    monkeypatch.setattr(health_judge, "FAMILIES", (("ib", broken), *health_judge.FAMILIES[1:]))
    snap = kit.node_snapshot(tmp_path, "hdr", hca_overrides={"mlx5_2": {"state": "1: DOWN"}})
    v, _ = verdict(snap)
    assert v.status == UNKNOWN
    assert by((v, None), "ib.internal")[0].message == "internal error in the ib checks: KeyError: 'bug'"
    assert ib.check  # the real family is untouched


def test_the_verdict_reason_counts_the_other_findings():
    results = [
        Result("ib.link", "mlx5_2/1", FAIL, "m", "mlx5_2/1 state DOWN"),
        Result("ib.link", "mlx5_3/1", FAIL, "m", "mlx5_3/1 state DOWN"),
        Result("gpu.remap", "gpu1", DEGRADED, "m", "gpu1 row remap pending"),
    ]
    v = make_verdict(results)
    assert (v.status, v.reason) == (FAIL, "mlx5_2/1 state DOWN (+1 more)")
    assert make_verdict([Result("x", "y", UNKNOWN, "m", "")]).status == UNKNOWN
    assert make_verdict([]).status == OK


def test_a_gpu_gone_from_the_pci_bus_is_named_and_a_garbled_vendor_is_not_gone(tmp_path):
    from slurm_tune.health import collect

    root = kit.tree(tmp_path, "hdr")
    profile = kit.profile("hdr")
    state = empty()
    health_judge.merge_state(
        state, health_judge.judge(kit.take(root, "hdr"), profile, {})[1], rebaseline=True
    )
    assert state["gpu_pci"][2] == "0000:47:00.0"
    (root / "sys/bus/pci/devices/0000:47:00.0/vendor").write_text("\x00\xff\n")
    garbled, _ = health_judge.judge(collect.fast(str(root), profile, "n1", state["gpu_pci"]), profile, state)
    assert garbled.status == UNKNOWN
    assert "unreadable vendor id of 0000:47:00.0" in by((garbled, None), "gpu.pci")[0].message
    hwtrees.remove_pci(root, "0000:47:00.0")
    gone, _ = health_judge.judge(collect.fast(str(root), profile, "n1", state["gpu_pci"]), profile, state)
    assert (gone.status, gone.reason) == (FAIL, "0000:47:00.0 gone from PCI")


def test_the_prolog_judges_pcie_width_from_sysfs(tmp_path):
    from slurm_tune.health import collect

    root = kit.tree(tmp_path, "hdr")
    (root / "sys/bus/pci/devices/0000:b7:00.0/current_link_width").write_text("8\n")
    v, _ = health_judge.judge(collect.fast(str(root), kit.profile("hdr"), "n1"), kit.profile("hdr"), {})
    assert (v.status, v.reason) == (DEGRADED, "0000:b7:00.0 PCIe x8")
