"""The drift family's verdicts and reasons, for every setting: fixture trees (tests/drifttrees.py, in the kernel's
formats, PCI config space as binary files) drifted one setting at a time, captured by the real capture code
(health/collect.full(drift=True)) and judged by the real family. Each drift is degraded with the fix in its
reason; what cannot be read is unknown."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import drifttrees as dt
import healthkit as kit
import hwtrees
import pytest

from slurm_tune.health import collect
from slurm_tune.health import judge as health_judge
from slurm_tune.health.result import DEGRADED, OK, UNKNOWN

GPU0, HCA0, GPU1 = hwtrees.DGX_GPU_PCI[0], hwtrees.DGX_HCA_PCI[0], hwtrees.DGX_GPU_PCI[1]
DS_GPU0, DS_HCA0 = "0000:02:00.0", "0000:02:01.0"  # the switch ports above gpu0 and mlx5_0 (pcie_switches)
ROOT_PORT, UPSTREAM = "0000:00:01.1", "0000:01:00.0"


def capture(root: Path, partition: str = "hdr", profile=None, tmp: Path | None = None, devices=None) -> dict:
    kind, driver = kit.NODES[partition][1:]
    gpus = kit.gpu_file(
        (tmp or root.parent) / "gpus.json", kind, 4 if partition == "vpc" else 8, devices, driver=driver
    )
    return collect.full(str(root), profile or kit.profile(partition), "n1", str(gpus), drift=True)


def drift_results(snap: dict, profile) -> dict:
    verdict, _ = health_judge.judge(snap, profile, {})
    return {(r.check, r.subject): r for r in verdict.results if r.check.startswith("drift.")}


def judged(root: Path, partition: str = "hdr", profile=None, **kw):
    profile = profile or kit.profile(partition)
    snap = capture(root, partition, profile, **kw)
    verdict, _ = health_judge.judge(snap, profile, {})
    return verdict, drift_results(snap, profile)


@pytest.fixture
def hdr(tmp_path):
    return kit.tree(tmp_path / "root", "hdr")


@pytest.fixture
def roce(tmp_path):
    return kit.tree(tmp_path / "root", "roce")


def test_the_standard_nodes_are_tuned_as_their_profiles_expect(tmp_path):
    for partition in ("hdr", "roce", "vpc"):
        root = kit.tree(tmp_path / partition / "root", partition)
        verdict, found = judged(root, partition)
        assert verdict.status == OK, verdict.reason
        checks = {c for c, _ in found}
        if partition == "vpc":  # a tcp fabric: no GPUDirect RDMA, the hypervisor's CPU clock and IOMMU
            assert checks == {"drift.thp", "drift.fabricmanager"}
        else:
            assert {"drift.gdr_module", "drift.pcie_acs", "drift.iommu", "drift.slurmd_memlock"} <= checks
            assert {"drift.cpu_governor", "drift.numa_balancing", "drift.fabricmanager"} <= checks
        assert ("drift.roce_mtu" in checks) == (partition == "roce")


def test_a_hook_never_judges_drift(hdr):
    """The prolog's fast snapshot and the epilog's full one have no drift section: nothing is judged, and the
    prolog's capture never reads a host setting (docs/speed.md)."""
    dt.host(hdr, gdr_module=False)
    profile = kit.profile("hdr")
    for snap in (collect.fast(str(hdr), profile, "n1"), collect.full(str(hdr), profile, "n1", nvml=False)):
        assert "drift" not in snap
        assert not [
            r for r in health_judge.judge(snap, profile, {})[0].results if r.check.startswith("drift")
        ]


# ---- nvidia-peermem -----------------------------------------------------------------------------------------


def test_a_gdr_partition_without_nvidia_peermem_is_degraded_with_the_fix_in_its_reason(hdr):
    dt.host(hdr, gdr_module=False)
    verdict, found = judged(hdr)
    r = found[("drift.gdr_module", "node")]
    assert (r.status, r.reason) == (DEGRADED, "nvidia-peermem not loaded: modprobe nvidia-peermem")
    assert "nccl.net_gdr_level PHB on an IB partition" in r.message
    assert verdict.status == DEGRADED and verdict.reason.startswith("nvidia-peermem not loaded: modprobe")


def test_nv_peer_mem_counts_and_a_partition_without_gdr_does_not_ask(tmp_path, hdr):
    (hdr / "proc/modules").write_text(
        dt.modules_text(("nvidia_peermem",)) + "\nnv_peer_mem 20480 0 - Live 0xffffffffc0fd0000 (OE)\n"
    )
    assert judged(hdr)[1][("drift.gdr_module", "node")].status == OK
    dt.host(hdr, gdr_module=False)
    for level in ("LOC", None):  # GDR off, or left to NCCL: nothing expected
        text = "nccl:\n  net_gdr_level: PHB\n"
        profiles = kit.profile_dir(
            tmp_path / f"p{level}", {"hdr.yaml": [(text, f"nccl:\n  net_gdr_level: {level or '~'}\n")]}
        )
        found = judged(hdr, profile=kit.profile("hdr", profiles))[1]
        assert ("drift.gdr_module", "node") not in found and ("drift.pcie_acs", "node") not in found


def test_an_unreadable_module_list_is_unknown_never_a_drift(hdr):
    (hdr / "proc/modules").unlink()
    assert judged(hdr)[1][("drift.gdr_module", "node")].status == UNKNOWN
    (hdr / "proc/modules").write_text(
        "nvidia_uvm 1437696 0 - Live 0xffffffffc1a00000 (POE)\nnvidia_p\xffrmem 1\n"
    )
    r = judged(hdr)[1][("drift.gdr_module", "node")]
    assert r.status == UNKNOWN and "1 unreadable line" in r.message


# ---- PCIe ACS -------------------------------------------------------------------------------------------------


def test_acs_redirect_on_a_switch_port_between_a_gpu_and_its_hca_is_degraded(hdr):
    dt.set_acs(hdr, DS_GPU0, dt.ACS_LINUX)  # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+
    verdict, found = judged(hdr)
    r = found[("drift.pcie_acs", DS_GPU0)]
    assert r.status == DEGRADED
    assert r.reason == (
        f"ACS on {DS_GPU0} ReqRedir+ CmpltRedir+ EgressCtrl-: setpci -s {DS_GPU0} ECAP_ACS+0x6.w=0000"
    )
    assert "on the path gpu0-mlx5_0 (+1 more)" in r.message and "pci=disable_acs_redir=" in r.message
    assert [s for c, s in found if c == "drift.pcie_acs"] == [DS_GPU0]  # the other ports are off
    assert verdict.status == DEGRADED


def test_egress_control_alone_redirects_and_source_validation_alone_does_not(hdr):
    dt.set_acs(hdr, DS_HCA0, 0x0020)  # P2P Egress Control
    assert judged(hdr)[1][("drift.pcie_acs", DS_HCA0)].status == DEGRADED
    dt.set_acs(hdr, DS_HCA0, 0x0011)  # SrcValid+ UpstreamFwd+: no redirect of peer-to-peer
    found = judged(hdr)[1]
    assert found[("drift.pcie_acs", "node")].status == OK and ("drift.pcie_acs", DS_HCA0) not in found


def test_acs_above_the_switch_is_not_on_the_path_and_a_port_without_acs_is_fine(hdr):
    dt.set_acs(hdr, ROOT_PORT, dt.ACS_LINUX)  # above the switch both devices share
    dt.set_acs(hdr, "0000:02:02.0", None)  # gpu1's port: no ACS capability at all
    found = judged(hdr)[1]
    assert found[("drift.pcie_acs", "node")].status == OK
    assert "off on 16 GPU-HCA path(s)" in found[("drift.pcie_acs", "node")].message


def test_a_gpu_and_an_hca_that_meet_at_the_root_complex_are_not_judged(tmp_path):
    """No shared PCI device: the traffic goes through the root complex whatever ACS says (Linux's p2pdma)."""
    root = tmp_path / "root"
    hwtrees.numa(root)
    top_a, top_b = dt.host_bridge(root, "0000:00"), dt.host_bridge(root, "0000:40")
    rp_a = dt.bridge(root, top_a, "0000:00:01.1", dt.ACS_LINUX)
    rp_b = dt.bridge(root, top_b, "0000:40:01.1", dt.ACS_LINUX)
    for i, address in enumerate(hwtrees.DGX_GPU_PCI):
        hwtrees.gpu(root, address, numa_node=i // 4, parent=rp_a)
    for i, address in enumerate(hwtrees.DGX_HCA_PCI):
        hwtrees.hca(root, f"mlx5_{i}", pci=address, netdevs=(f"ib{i}",), parent=rp_b)
        hwtrees.netdev(root, f"ib{i}", kind="32", mtu="4092")
    dt.host(root)
    for address in hwtrees.DGX_NVSWITCH_PCI:
        hwtrees.nvswitch(root, address)
    r = judged(root)[1][("drift.pcie_acs", "node")]
    assert r.status == OK and "meet at the root complex" in r.message


def test_unreadable_config_space_is_unknown_for_that_port_only(hdr):
    for size, why in ((64, "only 64 bytes of config space readable"), (0, "truncated (0 bytes)")):
        (dt.pci_dir(hdr, DS_GPU0) / "config").write_bytes(dt.bridge_config(dt.ACS_LINUX)[:size])
        dt.set_acs(hdr, DS_HCA0, dt.ACS_LINUX)
        found = judged(hdr)[1]
        assert (
            found[("drift.pcie_acs", DS_GPU0)].status == UNKNOWN
            and why in found[("drift.pcie_acs", DS_GPU0)].message
        )
        assert found[("drift.pcie_acs", DS_HCA0)].status == DEGRADED  # the neighbour is still judged
        dt.set_acs(hdr, DS_HCA0, 0)
    (dt.pci_dir(hdr, DS_GPU0) / "config").unlink()
    assert judged(hdr)[1][("drift.pcie_acs", DS_GPU0)].status == UNKNOWN


def test_a_device_whose_place_in_the_hierarchy_cannot_be_seen_is_unknown(hdr):
    entry = hdr / "sys/bus/pci/devices" / GPU0
    entry.unlink()
    entry.mkdir()  # a plain directory, as no real sysfs has: its path says nothing
    (entry / "vendor").write_text("0x10de\n")
    (entry / "class").write_text("0x030200\n")
    r = judged(hdr)[1][("drift.pcie_acs", "gpu0")]
    assert r.status == UNKNOWN and "not a link into sys/devices" in r.message


# ---- IOMMU, governor, THP, NUMA balancing -------------------------------------------------------------------


def test_translated_dma_is_degraded_and_passthrough_is_fine(hdr):
    dt.iommu_group(hdr, GPU0, 17, "DMA-FQ")
    dt.iommu_group(hdr, HCA0, 18, "DMA")
    r = judged(hdr)[1][("drift.iommu", "node")]
    assert r.status == DEGRADED and r.reason.startswith(
        "IOMMU translated for gpu0, mlx5_0: boot with iommu=pt"
    )
    for i, address in enumerate([*hwtrees.DGX_GPU_PCI, *hwtrees.DGX_HCA_PCI]):
        dt.iommu_group(hdr, address, 20 + i, "identity")
    r = judged(hdr)[1][("drift.iommu", "node")]
    assert r.status == OK and "passthrough" in r.message


def test_an_iommu_group_without_a_type_goes_by_the_command_line(hdr):
    dt.iommu_group(hdr, GPU0, 17, "identity")
    (hdr / "sys/kernel/iommu_groups/17/type").unlink()  # kernels before 5.11
    assert judged(hdr)[1][("drift.iommu", "gpu0")].status == UNKNOWN
    (hdr / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/md0 intel_iommu=on iommu=pt\n")
    assert judged(hdr)[1][("drift.iommu", "node")].status == OK
    (hdr / "sys/kernel/iommu_groups/17/type").write_text("DM\xffA\n")
    assert judged(hdr)[1][("drift.iommu", "gpu0")].status == UNKNOWN


def test_a_powersave_governor_is_degraded_and_no_cpufreq_is_unknown(hdr):
    dt.put(hdr, "sys/devices/system/cpu/cpufreq/policy3/scaling_governor", "powersave")
    r = judged(hdr)[1][("drift.cpu_governor", "node")]
    assert r.status == DEGRADED
    assert r.reason == "CPU governor powersave on 1 of 8 policies: cpupower frequency-set -g performance"
    dt.put(hdr, "sys/devices/system/cpu/cpufreq/policy3/scaling_governor", "perf\x00rmance")
    assert judged(hdr)[1][("drift.cpu_governor", "node")].status == UNKNOWN
    shutil.rmtree(hdr / "sys/devices/system/cpu/cpufreq")
    r = judged(hdr)[1][("drift.cpu_governor", "node")]
    assert r.status == UNKNOWN and "no cpufreq policies" in r.message


@pytest.mark.parametrize(
    "text, status",
    [
        ("always [madvise] never", OK),
        ("[always] madvise never", OK),
        ("always madvise [never]", DEGRADED),
        ("always madvise never", UNKNOWN),
        ("[always] [madvise] never", UNKNOWN),
        ("\xff\xfe", UNKNOWN),
    ],
)
def test_transparent_huge_pages(hdr, text, status):
    dt.put(hdr, "sys/kernel/mm/transparent_hugepage/enabled", text)
    r = judged(hdr)[1][("drift.thp", "node")]
    assert r.status == status
    if status == DEGRADED:
        assert r.reason == (
            "transparent huge pages never: echo always > /sys/kernel/mm/transparent_hugepage/enabled"
        )


@pytest.mark.parametrize(
    "text, status", [("0", OK), ("1", DEGRADED), ("3", DEGRADED), ("9", UNKNOWN), ("", UNKNOWN)]
)
def test_numa_balancing(hdr, text, status):
    dt.put(hdr, "proc/sys/kernel/numa_balancing", text)
    r = judged(hdr)[1][("drift.numa_balancing", "node")]
    assert r.status == status
    if status == DEGRADED:
        assert r.reason == f"NUMA balancing on ({text}): sysctl -w kernel.numa_balancing=0"


# ---- slurmd's memlock, fabric manager --------------------------------------------------------------------------


def test_slurmds_locked_memory_limit_must_be_unlimited(hdr):
    dt.host(hdr, memlock=("65536", "65536"))
    r = judged(hdr)[1][("drift.slurmd_memlock", "node")]
    assert r.status == DEGRADED
    assert r.reason == (
        "slurmd memlock 64 KiB (hard 64 KiB): LimitMEMLOCK=infinity in slurmd.service, then systemctl restart "
        "slurmd"
    )
    dt.host(hdr, memlock=("unlimited", "8388608"))
    assert judged(hdr)[1][("drift.slurmd_memlock", "node")].status == DEGRADED
    limits = hdr / f"proc/{dt.SLURMD_PID}/limits"
    limits.write_text(
        limits.read_text().replace("Max locked memory         unlimited", "Max locked memory  unlim")
    )
    assert judged(hdr)[1][("drift.slurmd_memlock", "node")].status == UNKNOWN
    shutil.rmtree(hdr / f"proc/{dt.SLURMD_PID}")
    r = judged(hdr)[1][("drift.slurmd_memlock", "node")]
    assert r.status == UNKNOWN and "no slurmd process" in r.message


def test_nvswitches_without_a_fabric_manager_are_degraded(hdr, tmp_path):
    os.unlink(hdr / f"proc/{dt.FABRICMANAGER_PID}/comm")
    r = judged(hdr)[1][("drift.fabricmanager", "node")]
    assert r.status == DEGRADED and r.reason.endswith(": systemctl enable --now nvidia-fabricmanager")
    assert "6 NVSwitches" in r.message
    for address in hwtrees.DGX_NVSWITCH_PCI:
        hwtrees.remove_pci(hdr, address)
    r = judged(hdr)[1][("drift.fabricmanager", "node")]
    assert r.status == OK and "no NVSwitch" in r.message


# ---- GPU power and clocks (NVML, replayed) ---------------------------------------------------------------------


def test_gpu_power_limit_and_clocks_against_the_profile(tmp_path, hdr):
    profiles = kit.profile_dir(
        tmp_path / "p",
        {"hdr.yaml": [("cache:\n", "drift:\n  gpu_power_limit_w: 400\n  gpu_sm_clock_mhz: 1410\ncache:\n")]},
    )
    profile = kit.profile("hdr", profiles)
    devices = kit.gpu_devices("a100", gpu3={"power_limit_mw": 300000}, gpu5={"app_clocks": (1275, 1593)})
    verdict, found = judged(hdr, profile=profile, devices=devices)
    assert verdict.status == DEGRADED
    assert (
        found[("drift.gpu_power_limit", "gpu3")].reason == "gpu3 power limit 300 W: nvidia-smi -i 3 -pl 400"
    )
    assert found[("drift.gpu_clocks", "gpu5")].reason == (
        "gpu5 application clocks SM 1275 MHz memory 1593 MHz: nvidia-smi -i 5 -ac 1593,1410"
    )
    assert {s for c, s in found if c.startswith("drift.gpu")} == {"gpu3", "gpu5"}
    devices = kit.gpu_devices("a100", gpu2={"app_clocks": None})  # NotSupported
    found = judged(hdr, profile=profile, devices=devices)[1]
    assert found[("drift.gpu_clocks", "gpu2")].status == UNKNOWN
    assert found[("drift.gpu_power_limit", "node")].status == OK


# ---- RoCE MTU, sysctls --------------------------------------------------------------------------------------------


def test_a_roce_netdev_below_the_mtu_is_degraded(roce):
    hwtrees.netdev(roce, "eth3", mtu="1500")
    r = judged(roce, "roce")[1][("drift.roce_mtu", "eth3")]
    assert (r.status, r.reason) == (DEGRADED, "eth3 MTU 1500: ip link set eth3 mtu 4200")
    hwtrees.netdev(roce, "eth3", mtu="9000")
    hwtrees.netdev(roce, "eth4", mtu="15\xff00")
    found = judged(roce, "roce")[1]
    assert (
        found[("drift.roce_mtu", "eth3")].status == OK and found[("drift.roce_mtu", "eth4")].status == UNKNOWN
    )


def test_the_sysctls_the_profile_names(tmp_path, hdr):
    sysctls = (
        "drift:\n  sysctls:\n    net.core.rmem_max: '>=67108864'\n    vm.swappiness: 10\n"
        "    net.ipv4.tcp_rmem: 4096 131072 6291456\n    net.ipv4.conf.eth0/100.rp_filter: 2\n"
        "    kernel.shmmax: '>=1'\ncache:\n"
    )
    profiles = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("cache:\n", sysctls.replace("conf.eth0/100.", "x."))]}
    )
    profile = kit.profile("hdr", profiles)
    dt.put(hdr, "proc/sys/kernel/shmmax", "18446744073692774399")
    found = judged(hdr, profile=profile)[1]
    rmem = found[("drift.sysctl", "net.core.rmem_max")]
    assert rmem.reason == "net.core.rmem_max 212992: sysctl -w net.core.rmem_max=67108864"
    assert found[("drift.sysctl", "vm.swappiness")].reason == "vm.swappiness 60: sysctl -w vm.swappiness=10"
    assert found[("drift.sysctl", "net.ipv4.tcp_rmem")].status == OK  # tabs as the kernel writes them
    assert found[("drift.sysctl", "kernel.shmmax")].status == OK
    assert found[("drift.sysctl", "net.ipv4.x.rp_filter")].status == UNKNOWN  # no such file: not a drift


def test_a_sysctl_missing_from_an_older_capture_is_unknown(tmp_path, hdr):
    snap = capture(hdr)  # read with the shipped hdr profile: no profile sysctls
    profiles = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("cache:\n", "drift:\n  sysctls: {kernel.pid_max: 4194304}\ncache:\n")]}
    )
    r = drift_results(snap, kit.profile("hdr", profiles))[("drift.sysctl", "kernel.pid_max")]
    assert r.status == UNKNOWN and "not captured" in r.message


def test_one_setting_garbled_in_the_snapshot_leaves_the_others_judged(hdr):
    dt.host(hdr, governor="powersave")
    profile = kit.profile("hdr")
    snap = capture(hdr)
    snap["drift"]["host"]["processes"] = "garbage"
    snap["drift"]["pci"]["config"] = {k: {"acs": {"ctrl": "x"}} for k in snap["drift"]["pci"]["config"]}
    found = drift_results(snap, profile)
    assert found[("drift.slurmd_memlock", "node")].status == UNKNOWN
    assert found[("drift.cpu_governor", "node")].status == DEGRADED
    assert {found[k].status for k in found if k[0] == "drift.pcie_acs"} == {UNKNOWN}
