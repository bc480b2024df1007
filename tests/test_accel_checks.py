"""The accel family (health/accel.py, acceldevice.py, accelports.py) and the accel version rules
(health/versions.py): every rule with its level, message and drain reason, over `accel` sections built by hand
in hw/accel.py's format (the backends' own code is not needed to judge), under ascend and amd profiles made
in tmp_path. Also: the gpu family stays off an amd/ascend partition, a DOWN port's drain reason through
health/apply.py, and `stune-health check --snapshot` judging an accel snapshot offline."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune.health import acceldevice, apply, judge
from slurm_tune.health.result import DEGRADED, FAIL, OK, UNKNOWN
from slurm_tune.hw.snapshot import FORMAT
from slurm_tune.profiles import load_profile
from slurm_tune.slurm import Node

BIN = Path(sys.executable).parent

ASCEND_YAML = """partition: asc
description: Atlas 800T A2, 8x 910B3
accelerator: ascend
fabric: {type: tcp, socket_ifname: eth0}
gpu: {count: 8, model: 910B}
"""
AMD_YAML = """partition: mi
description: 8x MI300X
accelerator: amd
fabric: {type: tcp, socket_ifname: eth0}
gpu: {count: 8, model: MI300X}
"""
NVIDIA_YAML = """partition: nv
fabric: {type: tcp, socket_ifname: eth0}
gpu: {count: 8}
"""


def profile_dir(tmp: Path, asc: str = "", mi: str = "") -> Path:
    """asc.yaml (ascend), mi.yaml (amd) and nv.yaml (nvidia), each with `extra` YAML appended."""
    directory = Path(tmp) / "profiles"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "asc.yaml").write_text(ASCEND_YAML + asc)
    (directory / "mi.yaml").write_text(AMD_YAML + mi)
    (directory / "nv.yaml").write_text(NVIDIA_YAML)
    return directory


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """load(name, extra YAML for that profile) -> the profile."""
    monkeypatch.setenv("STUNE_CACHE_DIR", str(tmp_path / "cache"))
    made = [0]

    def load(name: str = "asc", extra: str = ""):
        made[0] += 1
        directory = profile_dir(
            tmp_path / f"p{made[0]}", **({"asc": extra} if name == "asc" else {"mi": extra})
        )
        return load_profile(name, str(directory))

    return load


# ---- sections in hw/accel.py's format ---------------------------------------------------------------------
def npu(i: int, **kw) -> dict:
    """One 910B3 chip as hw/ascend.py reads it from npu-smi info (no ECC, no PCIe link in that table)."""
    dev = {
        "index": i,
        "chip": 0,
        "minor": i,
        "render": None,
        "firmware": {},
        "name": "910B3",
        "health": "OK",
        "bus_id": f"0000:{0xC1 + i:02x}:00.0",
        "serial": None,
        "power_w": 92.5,
        "power_limit_w": None,
        "temperature_c": 45.0,
        "util_pct": 0.0,
        "mem_util_pct": 5.2,
        "mem_used_mb": 3400.0,
        "mem_total_mb": 65536.0,
        "ecc": {"uncorrected": None, "corrected": None},
        "pcie": {"width": None, "max_width": None, "gen": None, "max_gen": None},
        "links": [],
        "processes": [],
        "errors": {},
    }
    dev.update(kw)
    return dev


def port(i: int, **kw) -> dict:
    out = {"link": "UP", "net_health": "Success", "ip": f"192.168.1.{10 + i}", "netmask": "255.255.255.0"}
    out["errors"] = {}
    out.update(kw)
    return out


def ascend_section(n: int = 8, devices=None, ports=None, **kw) -> dict:
    section = {
        "answered": True,
        "vendor": "ascend",
        "source": "npu-smi",
        "elapsed_s": 0.4,
        "system": {
            "driver_version": "24.1.rc2",
            "firmware_version": "7.5.0.1.129",
            "cann_version": "8.0.RC3",
            "rocm_version": None,
            "tool_version": "24.1.rc2",
            "errors": {},
        },
        "devices": devices if devices is not None else [npu(i) for i in range(n)],
        "ports": ports if ports is not None else {str(i): port(i) for i in range(n)},
    }
    section.update(kw)
    return section


def mi300(i: int, **kw) -> dict:
    """One MI300X as hw/amd.py reads it through amdsmi: 7 XGMI links, PCIe gen 5 x16."""
    dev = npu(i, name="AMD Instinct MI300X", health=None, bus_id=f"0000:{0x05 + 0x10 * i:02x}:00.0")
    dev.update(
        render=128 + 8 * i,
        power_w=150.0,
        power_limit_w=750.0,
        temperature_c=48.0,
        ecc={"uncorrected": 0, "corrected": 0},
        pcie={"width": 16, "max_width": 16, "gen": 5, "max_gen": 5},
        links=[{"link": k, "kind": "xgmi", "up": True} for k in range(7)],
        firmware={"vbios": "113-M3000100-102"},
    )
    dev.update(kw)
    return dev


def amd_section(n: int = 8, devices=None, **kw) -> dict:
    section = {
        "answered": True,
        "vendor": "amd",
        "source": "amdsmi",
        "elapsed_s": 0.8,
        "system": {
            "driver_version": "6.8.5",
            "firmware_version": None,
            "cann_version": None,
            "rocm_version": "6.2.0",
            "tool_version": "24.6.2.0",
            "errors": {},
        },
        "devices": devices if devices is not None else [mi300(i) for i in range(n)],
    }
    section.update(kw)
    return section


def pci_view(vendor: str, addresses, known=(), gone=(), **over) -> dict:
    """A `pci_accel` section as health/collect.py writes it: the devices read from sysfs, raw."""
    ids = {"ascend": ("0x19e5", "0xd802", "0x120000"), "amd": ("0x1002", "0x74a1", "0x120000")}[vendor]
    devices = {
        a: {"present": True, "vendor": ids[0], "device": ids[1], "class": ids[2], **over.get(a, {})}
        for a in addresses
    }
    devices.update({a: {"present": False} for a in gone})
    return {"answered": True, "devices": devices, "elapsed_s": 0.01, "vendor": vendor, "known": list(known)}


def snap(section=None, pci=None, **extra) -> dict:
    eth0 = {"present": True, "operstate": "up", "flags": "0x1003", "carrier": "1", "mtu": "1500", "type": "1"}
    out: dict = {"format": FORMAT, "node": "n1", "captured_at": 1.0, "sysfs_root": "/"}
    out["net"] = {"answered": True, "devices": {"eth0": eth0}, "elapsed_s": 0.01}
    if section is not None:
        out["accel"] = section
    if pci is not None:
        out["pci_accel"] = pci
    out.update(extra)
    return out


def results(snapshot, profile, previous=None):
    verdict, _ = judge.judge(snapshot, profile, previous or {})
    return verdict


def find(verdict, check, subject=None):
    found = [r for r in verdict.results if r.check == check and (subject is None or r.subject == subject)]
    assert found, f"no {check} {subject or ''} in {[(r.check, r.subject) for r in verdict.results]}"
    return found[0] if subject is not None or len(found) == 1 else found


# ---- the family as a whole --------------------------------------------------------------------------------
def test_a_healthy_ascend_node_is_ok_and_only_the_accel_family_judges_its_devices(profiles):
    profile = profiles("asc")
    gpus = {
        "answered": False,
        "devices": [],
        "error": "not captured (partition asc is ascend: NVML is not used)",
    }
    pci_gpus = {"answered": True, "devices": {}, "elapsed_s": 0.01}  # no NVIDIA GPU on an Ascend node's bus
    verdict = results(snap(ascend_section(), gpus=gpus, pci_gpus=pci_gpus), profile)
    assert verdict.status == OK, [r.line() for r in verdict.results if r.status != OK]
    assert not [r for r in verdict.results if r.check.startswith("gpu.")]
    checks = {r.check for r in verdict.results}
    assert {
        "accel.count",
        "accel.model",
        "accel.health",
        "accel.ecc",
        "accel.thermal",
        "accel.power",
    } <= checks
    assert {"accel.hccn_link", "accel.hccn_health", "accel.hccn_ip"} <= checks and "accel.xgmi" not in checks
    assert find(verdict, "accel.count").message == "8 NPUs answer npu-smi; expected 8"
    ecc = find(verdict, "accel.ecc", "npu3 0000:c4:00.0")
    assert ecc.status == OK and ecc.message == "ECC counts not reported by npu-smi"


def test_a_healthy_amd_node_is_ok_with_xgmi_and_no_hccn(profiles):
    verdict = results(snap(amd_section()), profiles("mi"))
    assert verdict.status == OK, [r.line() for r in verdict.results if r.status != OK]
    assert find(verdict, "accel.xgmi", "gpu2 0000:25:00.0").message == "7 XGMI links up"
    assert not [r for r in verdict.results if r.check.startswith(("accel.health", "accel.hccn"))]
    assert find(verdict, "accel.count").message == "8 GPUs answer amdsmi; expected 8"


def test_an_nvidia_profile_runs_no_accel_code_and_an_accel_snapshot_under_it_is_judged_by_its_vendor(
    profiles,
):
    nvidia = load_profile("nv", str(profile_dir(Path(os.environ["STUNE_CACHE_DIR"]).parent / "nv")))
    plain = results(snap(), nvidia)
    assert not [r for r in plain.results if r.check.startswith("accel.")]
    section = ascend_section(ports={str(i): port(i, link="DOWN" if i == 1 else "UP") for i in range(8)})
    verdict = results(snap(section), nvidia)
    assert find(verdict, "accel.hccn_link", "npu1 port").status == FAIL


def test_a_snapshot_without_accel_section_is_unknown_under_an_ascend_profile(profiles):
    verdict = results(snap(), profiles("asc"))
    found = find(verdict, "accel.backend")
    assert found.status == UNKNOWN and "no 'accel' section" in found.message
    assert "expected 8 Ascend NPUs" in found.message


def test_another_vendors_section_is_not_judged(profiles):
    found = find(results(snap(amd_section()), profiles("asc")), "accel.backend")
    assert found.status == UNKNOWN
    assert (
        found.message
        == "the 'accel' section is of vendor 'amd'; partition asc expects ascend devices: not judged"
    )


# ---- the backend answering --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, fields, status, message",
    [
        (
            "asc",
            {"error": "`npu-smi info` did not answer by the capture's deadline (5s)", "timeout": True},
            FAIL,
            "npu-smi did not answer: `npu-smi info` did not answer by the capture's deadline (5s); "
            "expected 8 NPUs to answer",
        ),
        (
            "asc",
            {
                "error": "`npu-smi info` exited 255 and listed no NPU: dcmi module initialize failed. ret is -8005"
            },
            FAIL,
            "npu-smi failed: `npu-smi info` exited 255 and listed no NPU: dcmi module initialize failed. "
            "ret is -8005; expected 8 NPUs to answer",
        ),
        (
            "mi",
            {"error": "did not answer within 5s", "timeout": True, "stalled_at": 3},
            FAIL,
            "amdsmi did not answer: did not answer within 5s (stalled at 3); expected 8 GPUs to answer",
        ),
        (
            "mi",
            {"error": "amdsmi could not be opened: AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"},
            FAIL,
            "amdsmi failed: amdsmi could not be opened: AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not "
            "loaded; expected 8 GPUs to answer",
        ),
        (
            "mi",
            {"error": "amdsmi not installed (pip install 'slurm-tune[amd]')"},
            UNKNOWN,
            "GPUs not judged: amdsmi not installed (pip install 'slurm-tune[amd]')",
        ),
        (
            "asc",
            {"error": "npu-smi not found ($STUNE_ACCEL_TOOLS, PATH, /usr/local/sbin)"},
            UNKNOWN,
            "NPUs not judged: npu-smi not found ($STUNE_ACCEL_TOOLS, PATH, /usr/local/sbin)",
        ),
        (
            "asc",
            {"error": "`npu-smi info` exited 0 and listed no NPU: '\\x00\\x13garbage'"},
            UNKNOWN,
            "NPUs not judged: `npu-smi info` exited 0 and listed no NPU: '\\x00\\x13garbage'",
        ),
        (
            "asc",
            {"error": "not captured: GPU snapshot /x/gpus.json has no 'accel'"},
            UNKNOWN,
            "NPUs not judged: not captured: GPU snapshot /x/gpus.json has no 'accel'",
        ),
        ("asc", {}, UNKNOWN, "NPUs not judged: no answer"),
    ],
)
def test_a_backend_that_did_not_answer(profiles, name, fields, status, message):
    make = ascend_section if name == "asc" else amd_section
    section = make(answered=False, devices=[], **fields)
    if name == "asc" and fields.get("timeout"):
        section["stalled_at"] = "npu-smi info"
    found = find(results(snap(section), profiles(name)), "accel.backend")
    assert (found.status, found.message) == (status, message)
    if status == FAIL:
        hung = "did not answer" in message.split(":", 1)[0]
        tool = "npu-smi" if name == "asc" else "amdsmi"
        assert found.reason == f"{tool} {'not answering' if hung else 'failing'}"


@pytest.mark.parametrize("section", [None, [], "x", {"answered": "yes", "vendor": "ascend"}])
def test_an_unreadable_section_is_unknown(profiles, section):
    verdict = results(snap(section if section is not None else {}), profiles("asc"))
    found = find(verdict, "accel.backend")
    assert found.status == UNKNOWN and found.message == "unreadable 'accel' section"


# ---- count and model --------------------------------------------------------------------------------------
def test_a_missing_npu_fails_naming_its_minor_and_an_extra_one_is_degraded(profiles):
    devices = [npu(i) for i in range(8) if i != 3]
    found = find(results(snap(ascend_section(devices=devices)), profiles("asc")), "accel.count")
    assert (found.status, found.message, found.reason) == (
        FAIL,
        "7 NPUs answer npu-smi; expected 8; missing: npu3",
        "7/8 NPUs",
    )
    extra = find(results(snap(ascend_section(n=9)), profiles("asc")), "accel.count")
    assert (extra.status, extra.reason) == (DEGRADED, "9 NPUs, expected 8")


def test_a_garbled_device_entry_counts_and_is_its_own_unknown(profiles):
    devices = [npu(i) for i in range(8)]
    devices[5] = "\x00garbage"
    verdict = results(snap(ascend_section(devices=devices)), profiles("asc"))
    assert find(verdict, "accel.count").status == OK
    entry = find(verdict, "accel.device", "npu#5")
    assert (entry.status, entry.message) == (UNKNOWN, "unreadable device entry")
    assert verdict.status == UNKNOWN


def test_the_wrong_model_fails(profiles):
    devices = [npu(i, name="310P3" if i == 2 else "910B3") for i in range(8)]
    found = find(
        results(snap(ascend_section(devices=devices)), profiles("asc")), "accel.model", "npu2 0000:c3:00.0"
    )
    assert (found.status, found.message, found.reason) == (FAIL, "310P3; expected 910B", "npu2 is 310P3")


# ---- Ascend health ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "health, extra, status, message, reason",
    [
        (
            "Warning",
            "",
            DEGRADED,
            "npu-smi health Warning; expected OK (accel.health_warning: degraded)",
            "npu4 health Warning",
        ),
        (
            "Warning",
            "accel: {health_warning: fail}\n",
            FAIL,
            "npu-smi health Warning; expected OK (accel.health_warning: fail)",
            "npu4 health Warning",
        ),
        ("Alarm", "", FAIL, "npu-smi health Alarm; expected OK", "npu4 Alarm"),
        ("Critical", "", FAIL, "npu-smi health Critical; expected OK", "npu4 Critical"),
        (
            "W\ufffdrning",
            "",
            UNKNOWN,
            "unreadable health 'W\ufffdrning'",
            "npu4 0000:c5:00.0: unreadable health 'W\ufffdrning'",
        ),
        ("alarm", "", UNKNOWN, "unreadable health 'alarm'", "npu4 0000:c5:00.0: unreadable health 'alarm'"),
        (None, "", UNKNOWN, "unreadable health None", "npu4 0000:c5:00.0: unreadable health None"),
    ],
)
def test_npu_smi_health(profiles, health, extra, status, message, reason):
    devices = [npu(i, health=health if i == 4 else "OK") for i in range(8)]
    verdict = results(snap(ascend_section(devices=devices)), profiles("asc", extra))
    found = find(verdict, "accel.health", "npu4 0000:c5:00.0")
    assert (found.status, found.message, found.reason) == (status, message, reason)
    assert verdict.status == status


def test_health_the_tool_could_not_read_says_why(profiles):
    bad = npu(1, health=None, errors={"health": "not a health state npu-smi gives: 'Unkn'"})
    devices = [bad if i == 1 else npu(i) for i in range(8)]
    found = find(
        results(snap(ascend_section(devices=devices)), profiles("asc")), "accel.health", "npu1 0000:c2:00.0"
    )
    assert found.message == "unreadable health None: not a health state npu-smi gives: 'Unkn'"


# ---- ECC, temperature, power, PCIe, XGMI -------------------------------------------------------------------
def amd_with(profiles, i: int, extra: str = "", **kw):
    devices = [mi300(k, **kw) if k == i else mi300(k) for k in range(8)]
    verdict = results(snap(amd_section(devices=devices)), profiles("mi", extra))
    return verdict, f"gpu{i} {devices[i]['bus_id']}"


@pytest.mark.parametrize(
    "ecc, extra, status, message, reason",
    [
        (
            {"uncorrected": 2, "corrected": 0},
            "",
            FAIL,
            "2 uncorrectable ECC/RAS errors; expected 0 (accel.ecc_uncorrected: fail)",
            "gpu3 2 uncorrected ECC",
        ),
        (
            {"uncorrected": 2, "corrected": 0},
            "accel: {ecc_uncorrected: degraded}\n",
            DEGRADED,
            "2 uncorrectable ECC/RAS errors; expected 0 (accel.ecc_uncorrected: degraded)",
            "gpu3 2 uncorrected ECC",
        ),
        (
            {"uncorrected": 0, "corrected": 50},
            "accel: {ecc_corrected_max: 10}\n",
            DEGRADED,
            "50 correctable ECC/RAS errors; expected at most 10 (accel.ecc_corrected_max)",
            "gpu3 50 corrected ECC",
        ),
        ({"uncorrected": 0, "corrected": 50}, "", OK, "0 uncorrectable, 50 correctable ECC/RAS errors", ""),
        (
            {"uncorrected": "2", "corrected": 0},
            "",
            UNKNOWN,
            "unreadable ECC counts ('2', 0)",
            "gpu3 0000:35:00.0: unreadable ECC counts ('2', 0)",
        ),
        (
            {"uncorrected": True, "corrected": 0},
            "",
            UNKNOWN,
            "unreadable ECC counts (True, 0)",
            "gpu3 0000:35:00.0: unreadable ECC counts (True, 0)",
        ),
        (
            {"uncorrected": -1, "corrected": 1 << 70},
            "",
            UNKNOWN,
            f"unreadable ECC counts (-1, {1 << 70})",
            f"gpu3 0000:35:00.0: unreadable ECC counts (-1, {1 << 70})",
        ),
        (
            "lots",
            "",
            UNKNOWN,
            "unreadable ECC counts 'lots'",
            "gpu3 0000:35:00.0: unreadable ECC counts 'lots'",
        ),
    ],
)
def test_ecc(profiles, ecc, extra, status, message, reason):
    verdict, subject = amd_with(profiles, 3, extra, ecc=ecc)
    found = find(verdict, "accel.ecc", subject)
    assert (found.status, found.message, found.reason) == (status, message, reason)


def test_ecc_the_library_failed_to_read_is_unknown_and_unreported_is_ok(profiles):
    verdict, subject = amd_with(
        profiles, 0, ecc={"uncorrected": None, "corrected": None}, errors={"ecc": "AMDSMI_STATUS_NO_PERM"}
    )
    assert find(verdict, "accel.ecc", subject).message == "ECC counts not read: AMDSMI_STATUS_NO_PERM"
    verdict, subject = amd_with(profiles, 0, ecc={"uncorrected": None, "corrected": None})
    found = find(verdict, "accel.ecc", subject)
    assert (found.status, found.message) == (OK, "ECC counts not reported by amdsmi")


@pytest.mark.parametrize(
    "name, temp, extra, status, message",
    [
        ("asc", 86.0, "", DEGRADED, "86 C; expected at most 85 C (accel.max_temp_c)"),
        ("asc", 85.0, "", OK, "85 C (limit 85 C)"),
        (
            "asc",
            75.0,
            "accel: {max_temp_c: 70}\n",
            DEGRADED,
            "75 C; expected at most 70 C (accel.max_temp_c)",
        ),
        ("mi", 99.0, "", OK, "99 C (limit 100 C)"),
        ("mi", 101.0, "", DEGRADED, "101 C; expected at most 100 C (accel.max_temp_c)"),
        ("mi", 1e300, "", UNKNOWN, "unreadable temperature 1e+300"),
        ("mi", float("nan"), "", UNKNOWN, "unreadable temperature nan"),
        ("mi", "hot", "", UNKNOWN, "unreadable temperature 'hot'"),
        ("asc", None, "", OK, "temperature not reported by npu-smi"),
    ],
)
def test_temperature(profiles, name, temp, extra, status, message):
    if name == "asc":
        devices = [npu(i, temperature_c=temp if i == 6 else 45.0) for i in range(8)]
        verdict, subject = (
            results(snap(ascend_section(devices=devices)), profiles(name, extra)),
            "npu6 0000:c7:00.0",
        )
    else:
        verdict, subject = amd_with(profiles, 6, extra, temperature_c=temp)
    found = find(verdict, "accel.thermal", subject)
    assert (found.status, found.message) == (status, message)
    if status == DEGRADED:
        assert found.reason == f"{subject.split()[0]} {temp:g}C"


@pytest.mark.parametrize(
    "power, extra, status, message",
    [
        (720.0, "accel: {max_power_w: 700}\n", DEGRADED, "720 W; expected at most 700 W (accel.max_power_w)"),
        (650.0, "accel: {max_power_w: 700}\n", OK, "650 W (limit 700 W)"),
        (720.0, "", OK, "720 W"),
        (None, "accel: {max_power_w: 700}\n", OK, "power not reported by amdsmi"),
        (-3.0, "", UNKNOWN, "unreadable power -3.0"),
    ],
)
def test_power(profiles, power, extra, status, message):
    verdict, subject = amd_with(profiles, 1, extra, power_w=power)
    found = find(verdict, "accel.power", subject)
    assert (found.status, found.message) == (status, message)
    if status == DEGRADED:
        assert found.reason == "gpu1 720W"


def test_power_a_read_that_failed_is_unknown_only_where_a_limit_judges_it(profiles):
    errors = {"power": "AMDSMI_STATUS_API_FAILED"}
    verdict, subject = amd_with(profiles, 1, "accel: {max_power_w: 700}\n", power_w=None, errors=errors)
    assert find(verdict, "accel.power", subject).message == "power not read: AMDSMI_STATUS_API_FAILED"
    verdict, subject = amd_with(profiles, 1, power_w=None, errors=errors)
    assert find(verdict, "accel.power", subject).status == OK


@pytest.mark.parametrize(
    "pcie, util, status, message, reason",
    [
        (
            {"width": 8, "max_width": 16, "gen": 5, "max_gen": 5},
            0.0,
            DEGRADED,
            "PCIe link x8; expected x16 (width is judged at any load)",
            "gpu5 PCIe x8",
        ),
        (
            {"width": 16, "max_width": 16, "gen": 1, "max_gen": 5},
            0.0,
            OK,
            "x16; gen 1 of 5 not judged: the device is idle (links train down at idle), judged under load",
            "",
        ),
        (
            {"width": 16, "max_width": 16, "gen": 3, "max_gen": 5},
            87.0,
            DEGRADED,
            "PCIe gen 3 under load; expected gen 5",
            "gpu5 PCIe gen3",
        ),
        (
            {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5},
            87.0,
            OK,
            "gen 5 x16 under load; expected gen 5 x16",
            "",
        ),
        (
            {"width": 7, "max_width": 16, "gen": 5, "max_gen": 5},
            0.0,
            UNKNOWN,
            "unreadable PCIe link {'width': 7, 'max_width': 16, 'gen': 5, 'max_gen': 5}",
            None,
        ),
        (
            {"width": "x16", "max_width": 16, "gen": 5, "max_gen": 5},
            0.0,
            UNKNOWN,
            "unreadable PCIe link {'width': 'x16', 'max_width': 16, 'gen': 5, 'max_gen': 5}",
            None,
        ),
    ],
)
def test_pcie(profiles, pcie, util, status, message, reason):
    verdict, subject = amd_with(profiles, 5, pcie=pcie, util_pct=util)
    found = find(verdict, "accel.pcie", subject)
    assert (found.status, found.message) == (status, message)
    if reason is not None:
        assert found.reason == reason


def test_npu_smi_reports_no_pcie_link_and_that_is_said_not_judged(profiles):
    found = find(results(snap(ascend_section()), profiles("asc")), "accel.pcie", "npu0 0000:c1:00.0")
    assert (found.status, found.message) == (OK, "PCIe link width not reported by npu-smi")


@pytest.mark.parametrize("extra, status", [("", FAIL), ("accel: {links_down: degraded}\n", DEGRADED)])
def test_an_xgmi_link_down(profiles, extra, status):
    links = [{"link": k, "kind": "xgmi", "up": k not in (3, 5)} for k in range(7)]
    verdict, subject = amd_with(profiles, 2, extra, links=links)
    found = find(verdict, "accel.xgmi", subject)
    level = "fail" if status == FAIL else "degraded"
    assert (found.status, found.reason) == (status, "gpu2 XGMI 3 down (+1)")
    assert found.message == f"XGMI link 3, 5 down of 7; expected all up (accel.links_down: {level})"


@pytest.mark.parametrize("links", ["U U D", [{"link": 0, "up": "D"}], [{"link": "0", "up": False}], [None]])
def test_garbled_xgmi_links_are_unknown(profiles, links):
    verdict, subject = amd_with(profiles, 2, links=links)
    assert find(verdict, "accel.xgmi", subject).status == UNKNOWN


def test_one_devices_bug_is_its_own_unknown(profiles, monkeypatch):
    real = acceldevice._ecc

    def broken(dev, *args):
        if dev.get("minor") == 4:
            raise ZeroDivisionError("boom")
        return real(dev, *args)

    monkeypatch.setattr(acceldevice, "_ecc", broken)
    section = amd_section(
        devices=[mi300(k, ecc={"uncorrected": 1, "corrected": 0}) if k == 6 else mi300(k) for k in range(8)]
    )
    verdict = results(snap(section), profiles("mi"))
    bug = find(verdict, "accel.internal")
    assert bug.status == UNKNOWN and bug.subject == "gpu4 0000:45:00.0"
    assert bug.message == "internal error judging gpu4: ZeroDivisionError: boom"
    assert find(verdict, "accel.ecc", "gpu6 0000:65:00.0").status == FAIL and verdict.status == FAIL


# ---- Ascend's RoCE ports (hccn_tool) ----------------------------------------------------------------------
def with_port(profiles, n: int, extra: str = "", **kw):
    ports = {str(i): port(i, **kw) if i == n else port(i) for i in range(8)}
    return results(snap(ascend_section(ports=ports)), profiles("asc", extra))


def test_a_port_link_down_fails_naming_the_npu_and_drains_with_that_reason(profiles):
    verdict = with_port(profiles, 3, link="DOWN", net_health="Fault")
    found = find(verdict, "accel.hccn_link", "npu3 port")
    assert (found.status, found.message, found.reason) == (
        FAIL,
        "link DOWN (hccn_tool -i 3 -link -g); expected UP",
        "npu3 port link DOWN",
    )
    assert verdict.status == FAIL and verdict.reason == "npu3 port link DOWN"
    want = apply.want_for(verdict)
    assert want == apply.Want(apply.DRAIN, "npu3 port link DOWN")
    node = Node(
        name="n1", state="idle", flags=(), reason="", reason_user="", reason_time=0, features="",
        active_features="", comment="", partitions=("asc",), gres="npu:8", gres_used="", tres="",
    )  # fmt: skip
    fields, _ = apply.plan(node, want, apply.drain_kind(node, {}))
    assert fields == {"state": "DRAIN", "reason": "stune: npu3 port link DOWN"}


@pytest.mark.parametrize(
    "net_health, extra, status",
    [
        ("Fault", "", DEGRADED),
        ("Receive timeout", "accel: {hccn: {net_health: fail}}\n", FAIL),
        ("Success", "", OK),
    ],
)
def test_net_health(profiles, net_health, extra, status):
    found = find(with_port(profiles, 6, extra, net_health=net_health), "accel.hccn_health", "npu6 port")
    assert found.status == status
    if status != OK:
        level = "fail" if status == FAIL else "degraded"
        assert found.message == (
            f"net_health {net_health} (hccn_tool -i 6 -net_health -g); expected Success "
            f"(accel.hccn.net_health: {level})"
        )
        assert found.reason == f"npu6 port net_health {net_health}"


@pytest.mark.parametrize(
    "extra, status, message",
    [
        ("", FAIL, "no IPv4 address (hccn_tool -i 2 -ip -g); expected one (accel.hccn.require_ip)"),
        (
            "accel: {hccn: {require_ip: false}}\n",
            OK,
            "no IPv4 address (not required: accel.hccn.require_ip false)",
        ),
    ],
)
def test_a_port_without_an_address(profiles, extra, status, message):
    found = find(with_port(profiles, 2, extra, ip=None, netmask=None), "accel.hccn_ip", "npu2 port")
    assert (found.status, found.message) == (status, message)
    if status == FAIL:
        assert found.reason == "npu2 port no IP"


@pytest.mark.parametrize(
    "fields, check, message",
    [
        ({"link": "D\x00WN"}, "accel.hccn_link", "unreadable link state 'D\\x00WN'"),
        ({"link": "down"}, "accel.hccn_link", "unreadable link state 'down'"),
        (
            {
                "link": None,
                "errors": {"link": "`hccn_tool -i 5 -link -g` did not answer by the capture's deadline (5s)"},
            },
            "accel.hccn_link",
            "link state not read: `hccn_tool -i 5 -link -g` did not answer by the capture's deadline (5s)",
        ),
        ({"net_health": "Faul"}, "accel.hccn_health", "unreadable net_health 'Faul'"),
        ({"net_health": None}, "accel.hccn_health", "net_health not read: not read"),
        ({"ip": "10.0.0.300"}, "accel.hccn_ip", "unreadable address '10.0.0.300'"),
        (
            {"ip": None, "errors": {"ip": "no ipaddr and netmask in hccn_tool's output ('x')"}},
            "accel.hccn_ip",
            "address not read: no ipaddr and netmask in hccn_tool's output ('x')",
        ),
    ],
)
def test_a_port_that_did_not_answer_or_printed_garbage_is_unknown(profiles, fields, check, message):
    verdict = with_port(profiles, 5, **fields)
    found = find(verdict, check, "npu5 port")
    assert (found.status, found.message) == (UNKNOWN, message)
    assert verdict.status == UNKNOWN


def test_hccn_tool_missing_makes_every_port_unknown_and_hccn_check_off_judges_none(profiles):
    why = "hccn_tool not found ($STUNE_ACCEL_TOOLS, PATH, /usr/local/sbin)"
    ports = {
        str(i): port(i, link=None, net_health=None, ip=None, netmask=None, errors={"hccn_tool": why})
        for i in range(8)
    }
    verdict = results(snap(ascend_section(ports=ports)), profiles("asc"))
    hccn = [r for r in verdict.results if r.check.startswith("accel.hccn")]
    assert len(hccn) == 24 and {r.status for r in hccn} == {UNKNOWN}
    assert find(verdict, "accel.hccn_ip", "npu0 port").message == f"address not read: {why}"
    off = results(snap(ascend_section(ports=ports)), profiles("asc", "accel: {hccn: {check: false}}\n"))
    assert off.status == OK and not [r for r in off.results if r.check.startswith("accel.hccn")]


def test_an_npu_without_a_port_reading_and_garbled_ports_are_unknown(profiles):
    ports = {str(i): port(i) for i in range(8) if i != 7}
    verdict = results(snap(ascend_section(ports=ports)), profiles("asc"))
    found = find(verdict, "accel.hccn", "npu7 port")
    assert (found.status, found.message) == (UNKNOWN, "no hccn_tool reading")
    ports["x"] = port(9)
    ports["1"] = "UP"
    verdict = results(snap(ascend_section(ports=ports)), profiles("asc"))
    assert find(verdict, "accel.hccn", "npu1 port").message == "unreadable port entry"
    assert find(verdict, "accel.hccn", "node").message == "unreadable port id 'x'"
    verdict = results(snap(ascend_section(ports=["UP"] * 8)), profiles("asc"))
    assert (
        find(verdict, "accel.hccn", "node").message
        == "unreadable hccn_tool ports ['UP', 'UP', 'UP', 'UP', 'UP', 'UP', 'UP', 'UP']"
    )


# ---- the PCI bus's view -----------------------------------------------------------------------------------
ADDRS = [f"0000:{0xC1 + i:02x}:00.0" for i in range(8)]


def test_a_device_a_full_check_listed_gone_from_the_bus_fails_naming_it(profiles):
    pci = pci_view("ascend", ADDRS[:2] + ADDRS[3:], known=ADDRS, gone=[ADDRS[2]])
    found = find(results(snap(pci=pci), profiles("asc")), "accel.pci")
    assert (found.status, found.reason) == (FAIL, "0000:c3:00.0 gone from PCI")
    assert found.message == "7 Ascend NPUs on the PCI bus; gone from the bus: 0000:c3:00.0"


def test_the_bus_view_before_any_full_check_and_an_unreadable_id(profiles):
    ok = find(results(snap(pci=pci_view("ascend", ADDRS[:4])), profiles("asc")), "accel.pci")
    assert (ok.status, ok.message) == (OK, "4 Ascend NPUs on the PCI bus (before any full check)")
    # none of the ids stune's table knows: a new model, or the devices gone: the full check tells
    none = find(results(snap(pci=pci_view("ascend", [])), profiles("asc")), "accel.pci")
    assert (none.status, none.message) == (
        UNKNOWN,
        "no device with an Ascend id stune knows on the PCI bus; expected 8 NPUs (gpu.count): the full check "
        "lists them",
    )
    garbled = pci_view("ascend", ADDRS[:1], **{ADDRS[0]: {"vendor": "0x19\ufffd5"}})
    found = find(results(snap(pci=garbled), profiles("asc")), "accel.pci")
    assert (found.status, found.message) == (
        UNKNOWN,
        "0 Ascend NPUs on the PCI bus; unreadable ids of 0000:c1:00.0",
    )
    known = pci_view("ascend", ADDRS, known=ADDRS)
    ok = find(results(snap(pci=known), profiles("asc")), "accel.pci")
    assert ok.message == "8 Ascend NPUs on the PCI bus as the last full check listed 8"


def test_a_known_address_judges_by_vendor_id_and_another_vendors_device_there_fails(profiles):
    newer = pci_view(
        "ascend", ADDRS, known=ADDRS, **{ADDRS[1]: {"device": "0xd806"}}
    )  # an id not in the table
    assert find(results(snap(pci=newer), profiles("asc")), "accel.pci").status == OK
    swapped = pci_view("ascend", ADDRS, known=ADDRS, **{ADDRS[1]: {"vendor": "0x10de", "device": "0x20b0"}})
    found = find(results(snap(pci=swapped), profiles("asc")), "accel.pci")
    assert (found.status, found.reason) == (FAIL, "0000:c2:00.0 not an Ascend NPU")
    assert (
        found.message
        == "7 Ascend NPUs on the PCI bus; not the Ascend device a full check listed at 0000:c2:00.0"
    )
    garbled = pci_view("ascend", ADDRS, known=ADDRS, **{ADDRS[1]: {"vendor": "0x1\x009e5"}})
    assert find(results(snap(pci=garbled), profiles("asc")), "accel.pci").status == UNKNOWN
    neighbour = pci_view("ascend", [*ADDRS, "0000:3b:00.0"], known=ADDRS, **{"0000:3b:00.0": {"vendor": "?"}})
    assert find(results(snap(pci=neighbour), profiles("asc")), "accel.pci").status == OK
    unlisted_gone = pci_view("ascend", ADDRS, known=ADDRS, gone=["0000:3b:00.0"])
    assert find(results(snap(pci=unlisted_gone), profiles("asc")), "accel.pci").status == OK


def test_a_full_check_remembers_the_addresses_the_backend_listed_and_the_bus_showed(profiles):
    pci = pci_view("amd", [d["bus_id"] for d in amd_section()["devices"]][:7])  # gpu7 not on the bus
    _, updates = judge.judge(snap(amd_section(), pci), profiles("mi"), {})
    assert updates["gpu_pci"] == [f"0000:{0x05 + 0x10 * i:02x}:00.0" for i in range(7)]
    state: dict = {}
    judge.merge_state(state, updates, rebaseline=False)
    assert state["gpu_pci"] == updates["gpu_pci"]
    masked = ascend_section(devices=[npu(i, bus_id="0000:xx:00.0") for i in range(8)])
    assert "gpu_pci" not in judge.judge(snap(masked, pci_view("ascend", ADDRS)), profiles("asc"), {})[1]


# ---- versions ---------------------------------------------------------------------------------------------
ASC_VERSIONS = """versions:
  npu_driver: {min: 24.1.rc3}
  npu_firmware: {allowed: [7.5.0.1.129]}
  cann: {min: 8.0.RC3}
  rocm: {min: 6.3.0}
"""


def test_the_ascend_version_matrix(profiles):
    verdict = results(snap(ascend_section()), profiles("asc", ASC_VERSIONS))
    driver = find(verdict, "versions.npu_driver")
    assert (driver.status, driver.message, driver.reason) == (
        FAIL,
        "Ascend NPU driver 24.1.rc2; expected 24.1.rc3 or newer",
        "Ascend NPU driver 24.1.rc2 not validated",
    )
    assert find(verdict, "versions.npu_firmware").status == OK
    cann = find(verdict, "versions.cann")
    assert (cann.status, cann.message) == (OK, "CANN toolkit 8.0.RC3; expected 8.0.RC3 or newer")
    assert not [r for r in verdict.results if r.check == "versions.rocm"]  # the other vendor's rule


def test_a_newer_release_passes_a_release_candidate_floor_and_garbage_is_unknown(profiles):
    section = ascend_section()
    section["system"].update(driver_version="24.1.0", cann_version="8.0.RC\ufffd3")
    section["system"]["errors"]["cann_version"] = (
        "/usr/local/Ascend/ascend-toolkit/latest/...: no version= line"
    )
    verdict = results(snap(section), profiles("asc", ASC_VERSIONS))
    assert find(verdict, "versions.npu_driver").status == OK
    cann = find(verdict, "versions.cann")
    assert cann.status == UNKNOWN
    assert cann.message == (
        "unreadable CANN toolkit version '8.0.RC\ufffd3' (/usr/local/Ascend/ascend-toolkit/latest/...: no "
        "version= line); expected 8.0.RC3 or newer"
    )


def test_versions_are_judged_even_when_the_devices_did_not_answer(profiles):
    section = ascend_section(answered=False, devices=[], error="`npu-smi info` did not answer", timeout=True)
    section["system"]["cann_version"] = "8.0.RC2"
    verdict = results(snap(section), profiles("asc", ASC_VERSIONS))
    assert find(verdict, "versions.cann").status == FAIL
    assert find(verdict, "accel.backend").status == FAIL


def test_the_amd_version_matrix(profiles):
    extra = "versions:\n  rocm: {allowed: [6.2.0, 6.2.4]}\n  amdgpu_driver: {min: 6.10.5}\n  cann: {min: 8.0.RC3}\n"
    verdict = results(snap(amd_section()), profiles("mi", extra))
    assert find(verdict, "versions.rocm").message == "ROCm 6.2.0; expected one of 6.2.0, 6.2.4"
    driver = find(verdict, "versions.amdgpu_driver")
    assert (driver.status, driver.reason) == (FAIL, "amdgpu driver 6.8.5 not validated")
    assert not [r for r in verdict.results if r.check == "versions.cann"]


def test_nvidia_version_rules_are_not_judged_on_an_accel_partition(profiles):
    gpus = {
        "answered": False,
        "devices": [],
        "error": "not captured (partition asc is ascend: NVML is not used)",
    }
    verdict = results(
        snap(ascend_section(), gpus=gpus), profiles("asc", "versions:\n  gpu_driver: {min: 535.0}\n")
    )
    assert not [r for r in verdict.results if r.check == "versions.gpu_driver"]


# ---- offline check ----------------------------------------------------------------------------------------
def test_stune_health_check_judges_an_accel_snapshot_offline(tmp_path):
    directory = profile_dir(tmp_path)
    env = dict(os.environ, STUNE_PARTITIONS=str(directory), STUNE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("STUNE_HEALTH_PARTITION", None)
    ports = {str(i): port(i, link="DOWN" if i == 3 else "UP") for i in range(8)}
    bad = tmp_path / "n1.json"
    bad.write_text(json.dumps(snap(ascend_section(ports=ports))))
    good = tmp_path / "g1.json"
    good.write_text(json.dumps(snap(amd_section())))

    def check(path, partition, *more):
        cmd = [str(BIN / "stune-health"), "check", "--snapshot", str(path), "-p", partition, *more]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    proc = check(bad, "asc")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith(": FAIL - npu3 port link DOWN")
    line = "fail accel.hccn_link npu3 port: link DOWN (hccn_tool -i 3 -link -g); expected UP"
    assert " ".join(lines[1].split()) == line
    doc = json.loads(check(bad, "asc", "--json").stdout)
    assert doc["status"] == "fail" and doc["reason"] == "npu3 port link DOWN"
    assert check(good, "mi").returncode == 0
    assert (
        check(good, "asc").returncode == 4
    )  # another vendor's capture: unknown, never a verdict on the node


def test_the_section_in_a_snapshot_file_round_trips(tmp_path, profiles):
    section = ascend_section()
    path = tmp_path / "s.json"
    path.write_text(json.dumps(snap(copy.deepcopy(section))))
    from slurm_tune.hw.snapshot import load

    assert load(str(path))["accel"] == section
