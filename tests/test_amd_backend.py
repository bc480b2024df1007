"""hw/amd.py through tests/fakeamdsmi.py (amdsmi's API with injectable devices): every field of the `accel`
section, not supported -> None, failed reads named, amdsmi or libamd_smi.so missing, a hung call cut off by the
deadline, older amdsmi releases, the render-node minors, and the sampler's AmdSource."""

from __future__ import annotations

import json
import sys
import time

import fakeamdsmi as fake
import pytest

from slurm_tune.errors import StuneError
from slurm_tune.hw import amd
from slurm_tune.hw.amdvalues import blank_device

MI300X = "AMD Instinct MI300X"


def node(n: int = 2, model: str = "mi300x", **kw) -> fake.FakeAmdSmi:
    return fake.FakeAmdSmi([fake.device(i, model) for i in range(n)], **kw)


def test_every_field_of_an_mi300x():
    amdsmi = node()
    amdsmi.devices[1].update(
        gfx_activity=97,
        umc_activity=41,
        vram_used=180224,
        socket_power=731,
        hotspot=88,
        ecc_correctable=12,
        ecc_uncorrectable=1,
        pcie_width=8,
        pcie_speed=16000,
        xgmi=["U", "D", "U", "U", "U", "U", "U", "X"],
        processes=[(4242, 96 << 30), (4243, 1 << 20)],
    )
    s = amd.capture(amdsmi_module=amdsmi)
    assert {k: s[k] for k in ("answered", "vendor", "source")} == {
        "answered": True,
        "vendor": "amd",
        "source": "amdsmi",
    }
    assert "error" not in s and "stalled_at" not in s and 0 <= s["elapsed_s"] < 5
    assert s["system"] == {
        "driver_version": "6.10.5",
        "firmware_version": None,
        "cann_version": None,
        "rocm_version": "6.4.0",
        "tool_version": "25.3.0",
        "errors": {},
    }
    expected = blank_device(1)
    expected.update(
        minor=1,  # renderD136: MI300's 8 render nodes per GPU are stepped over
        render=136,
        name=MI300X,
        bus_id="0000:26:00.0",
        serial="692251001101",
        power_w=731.0,
        power_limit_w=750.0,
        temperature_c=88.0,
        util_pct=97.0,
        mem_util_pct=41.0,
        mem_used_mb=180224.0,
        mem_total_mb=196592.0,
        ecc={"uncorrected": 1, "corrected": 12},
        pcie={"width": 8, "max_width": 16, "gen": 4, "max_gen": 5},
        links=[{"link": i, "kind": "xgmi", "up": i != 1} for i in range(7)],
        processes=[{"pid": 4242, "mem_mb": 98304.0}, {"pid": 4243, "mem_mb": 1.0}],
        firmware={"vbios": "113-M3000100-102"},
    )
    assert s["devices"][1] == expected
    assert s["devices"][0]["minor"] == 0 and s["devices"][0]["processes"] == []
    json.dumps(s)  # a snapshot holds it as it is
    assert amdsmi.initialised is False  # the session was shut down


def test_an_mi210_falls_back_to_edge_less_hotspot_average_power_and_has_no_xgmi():
    amdsmi = node(2, "mi210")
    amdsmi.devices[0]["hotspot"] = fake.UNSUPPORTED
    d0, d1 = amd.capture(amdsmi_module=amdsmi)["devices"]
    assert (d0["temperature_c"], d1["temperature_c"]) == (35.0, 38.0)  # edge where hotspot is not supported
    assert d0["power_w"] == 41.0 and d0["power_limit_w"] == 300.0 and d0["pcie"]["gen"] == 4
    assert d0["links"] == [] and d0["errors"] == {} and (d0["minor"], d1["minor"]) == (0, 1)


UNSUPPORTED_FIELDS = {
    "gfx_activity": ("util_pct", None),
    "vram_total": ("mem_total_mb", None),
    "power_cap_uw": ("power_limit_w", None),
    "ecc_uncorrectable": ("ecc", {"uncorrected": None, "corrected": None}),
    "pcie_width": ("pcie", {"width": None, "max_width": None, "gen": None, "max_gen": None}),
    "xgmi": ("links", []),
    "processes": ("processes", None),
    "drm_render": ("render", None),
}


@pytest.mark.parametrize("value", sorted(UNSUPPORTED_FIELDS))
def test_not_supported_is_none_and_no_error(value):
    amdsmi = node(1)
    amdsmi.devices[0][value] = fake.UNSUPPORTED
    (d,) = amd.capture(amdsmi_module=amdsmi)["devices"]
    field, expected = UNSUPPORTED_FIELDS[value]
    assert d[field] == expected and d["errors"] == {}
    assert d["name"] == MI300X and d["minor"] == 0  # the rest is read


def test_na_values_are_unmeasured_not_zero():
    amdsmi = node(1)
    amdsmi.devices[0].update(
        gfx_activity=fake.NA, umc_activity=0xFFFF, socket_power=fake.NA, current_socket_power=fake.NA
    )
    amdsmi.devices[0].update(
        ecc_correctable=0xFFFFFFFFFFFFFFFF, vram_used=fake.NA, market_name="", product_serial=""
    )
    (d,) = amd.capture(amdsmi_module=amdsmi)["devices"]
    assert (d["util_pct"], d["mem_util_pct"], d["power_w"], d["mem_used_mb"]) == (None, None, None, None)
    assert d["ecc"] == {"uncorrected": 0, "corrected": None} and d["errors"] == {}
    assert (
        d["name"] == "AMD Instinct MI300X OAM" and d["serial"] == "0x8AF7052596831600"
    )  # the board's, the ASIC's


CALLS = {
    "amdsmi_get_gpu_activity": ("activity", ("util_pct", "mem_util_pct")),
    "amdsmi_get_gpu_vram_usage": ("vram", ("mem_used_mb", "mem_total_mb")),
    "amdsmi_get_power_info": ("power", ("power_w",)),
    "amdsmi_get_power_cap_info": ("power_limit", ("power_limit_w",)),
    "amdsmi_get_temp_metric": ("temperature_hotspot", ("temperature_c",)),
    "amdsmi_get_gpu_device_bdf": ("bus_id", ("bus_id",)),
    "amdsmi_get_gpu_process_list": ("processes", ("processes",)),
    "amdsmi_get_gpu_asic_info": ("asic", ()),
}


@pytest.mark.parametrize("api", sorted(CALLS))
def test_a_failed_read_is_none_and_named(api):
    amdsmi = node(2)
    amdsmi.devices[1]["fail"] = {api: fake.AMDSMI_STATUS_NO_PERM}
    s = amd.capture(amdsmi_module=amdsmi)
    name, fields = CALLS[api]
    d0, d1 = s["devices"]
    assert s["answered"] is True and d0["errors"] == {}
    assert d1["errors"] == {
        name: "AMDSMI_STATUS_NO_PERM - Permission Denied",
        **({"temperature_edge": "AMDSMI_STATUS_NO_PERM - Permission Denied"} if "temp" in name else {}),
    }
    assert all(d1[f] is None for f in fields) and all(d0[f] is not None for f in fields)


def test_a_failed_ecc_pcie_xgmi_read_is_named_with_the_others_intact():
    amdsmi = node(1)
    codes = {
        "amdsmi_get_gpu_total_ecc_count": 12,
        "amdsmi_get_pcie_info": 40,
        "amdsmi_get_gpu_xgmi_link_status": 12,
    }
    amdsmi.devices[0]["fail"] = codes
    (d,) = amd.capture(amdsmi_module=amdsmi)["devices"]
    assert d["errors"] == {
        "ecc": "AMDSMI_STATUS_IO - I/O Error",
        "pcie": "AMDSMI_STATUS_NO_DATA - No data was found for given input",
        "links": "AMDSMI_STATUS_IO - I/O Error",
    }
    assert d["ecc"] == {"uncorrected": None, "corrected": None} and d["links"] == [] and d["util_pct"] == 0.0


def test_system_read_errors_are_named():
    amdsmi = node(1)
    amdsmi.devices[0]["fail"] = {"amdsmi_get_gpu_driver_info": fake.AMDSMI_STATUS_NO_PERM}
    s = amd.capture(amdsmi_module=amdsmi)
    assert s["system"]["driver_version"] is None
    assert s["system"]["errors"] == {"driver_version": "AMDSMI_STATUS_NO_PERM - Permission Denied"}


def test_amdsmi_init_failing_is_an_unanswered_section():
    s = amd.capture(amdsmi_module=node(fail_init=fake.AMDSMI_STATUS_DRIVER_NOT_LOADED))
    assert s["answered"] is False and s["devices"] == []
    assert s["error"] == "amdsmi could not be opened: AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"


def test_no_gpus_is_answered_with_none():
    s = amd.capture(amdsmi_module=fake.FakeAmdSmi([]))
    assert s["answered"] is True and s["devices"] == [] and s["system"]["driver_version"] is None
    assert s["system"]["tool_version"] == "25.3.0"


def test_a_hung_call_is_cut_off_at_the_deadline_keeping_what_was_read():
    amdsmi = node(3, hang=(1, "amdsmi_get_gpu_activity"))
    start = time.monotonic()
    s = amd.capture(timeout_s=0.3, amdsmi_module=amdsmi)
    assert time.monotonic() - start < 2
    assert s["answered"] is False and s["timeout"] is True and s["stalled_at"] == 1
    assert s["error"] == "amdsmi did not answer within 0.3s" and s["reader"] in ("S", "R", "")
    assert [d["bus_id"] for d in s["devices"]] == ["0000:05:00.0"] and s["devices"][0]["minor"] == 0
    amdsmi.release.set()  # the abandoned reader returns; what it does later is not the section's
    time.sleep(0.05)
    assert len(s["devices"]) == 1


def test_amdsmi_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ModuleNotFoundError
    s = amd.capture()
    assert s["answered"] is False and s["error"] == "amdsmi not installed (pip install 'slurm-tune[amd]')"
    with pytest.raises(StuneError, match=r"^amdsmi not installed \(pip install 'slurm-tune\[amd\]'\)$"):
        amd.AmdSource()


def test_libamd_smi_missing_is_one_line_and_keeps_stdout_clean(tmp_path, monkeypatch, capsys):
    # what amdsmi 7.0.2 does without ROCm: prints two lines, then fails on _libraries['libamd_smi.so']
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'print("/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory")\n'
        'print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")\n'
        "_libraries = {}\n"
        "_libraries['libamd_smi.so'].amdsmi_free_name_value_pairs\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    s = amd.capture()
    assert capsys.readouterr().out == ""
    assert s["answered"] is False and "\n" not in s["error"]
    assert s["error"].startswith(
        "amdsmi cannot load libamd_smi.so (install amd-smi-lib from ROCm): /opt/rocm/lib"
    )


def test_an_older_amdsmi_without_enumeration_xgmi_and_rocm_calls(tmp_path):
    (tmp_path / "opt/rocm/.info").mkdir(parents=True)
    (tmp_path / "opt/rocm/.info/version").write_text("6.0.2-115\n")
    missing = (
        "amdsmi_get_gpu_enumeration_info",
        "amdsmi_get_gpu_xgmi_link_status",
        "amdsmi_get_rocm_version",
    )
    amdsmi = fake.FakeAmdSmi(
        [fake.device(i) for i in (2, 0, 1)],  # listed out of bus order
        missing=missing,
        lib_version={"year": 24, "major": 5, "minor": 1, "release": 0, "build": ""},
    )
    s = amd.capture(amdsmi_module=amdsmi, root=str(tmp_path))
    assert [(d["bus_id"], d["render"], d["minor"]) for d in s["devices"]] == [
        ("0000:46:00.0", None, 2),
        ("0000:05:00.0", None, 0),
        ("0000:26:00.0", None, 1),
    ]
    assert all(d["links"] == [] and d["errors"] == {} for d in s["devices"])
    assert s["system"]["rocm_version"] == "6.0.2" and s["system"]["tool_version"] == "24.5.1.0"


def test_rocm_version_the_library_cannot_tell_is_read_from_the_file(tmp_path):
    s = amd.capture(
        amdsmi_module=node(1, rocm_version=(False, "Could not find librocm-core.so")), root=str(tmp_path)
    )
    assert s["system"]["rocm_version"] is None and s["system"]["errors"] == {}
    (tmp_path / "opt/rocm/.info").mkdir(parents=True)
    (tmp_path / "opt/rocm/.info/version").write_text("6.3.3-74\n")
    s = amd.capture(amdsmi_module=node(1, rocm_version=(False, "")), root=str(tmp_path))
    assert s["system"]["rocm_version"] == "6.3.3"


def test_amdsmi_6_0_process_handles_are_read_one_by_one():
    amdsmi = node(1, process_handles=True)
    amdsmi.devices[0]["processes"] = [(77, 2 << 20)]
    (d,) = amd.capture(amdsmi_module=amdsmi)["devices"]
    assert d["processes"] == [{"pid": 77, "mem_mb": 2.0}] and "amdsmi_get_gpu_process_info" in amdsmi.calls
    amdsmi.devices[0]["fail"] = {"amdsmi_get_gpu_process_info": fake.AMDSMI_STATUS_NO_PERM}
    (d,) = amd.capture(amdsmi_module=amdsmi)["devices"]
    assert d["processes"] is None  # a list read in part is no count at all
    assert d["errors"] == {"processes": "AMDSMI_STATUS_NO_PERM - Permission Denied"}


@pytest.mark.parametrize(
    "renders, minors",
    [
        ([128, 129, 130, 131], [0, 1, 2, 3]),  # one render node per GPU
        ([128, 136, 144, 152, 160, 168, 176, 184], list(range(8))),  # MI300 SPX: 8 per GPU
        ([136, 144, 160], [1, 2, 4]),  # MI300 with GPUs 0 and 3 gone: the others keep their numbers
        ([128, 130], [0, 1]),  # a gap of one device alone reads as the step: a caveat, documented
    ],
)
def test_minor_is_the_render_nodes_gres_position(renders, minors):
    amdsmi = fake.FakeAmdSmi([fake.device(i, drm_render=r) for i, r in enumerate(renders)])
    assert [d["minor"] for d in amd.capture(amdsmi_module=amdsmi)["devices"]] == minors


def test_amd_source_samples_utilization_by_minor():
    amdsmi = node(2)
    amdsmi.devices[1].update(
        gfx_activity=88, umc_activity=30, socket_power=650, vram_used=2048, processes=[(9, 1)]
    )
    source = amd.AmdSource(amdsmi_module=amdsmi)
    u0, u1 = source.utilization()
    assert (u1.index, u1.uuid, u1.pci_bus_id) == (1, "692251001101", "0000:26:00.0")
    assert (u1.sm_util, u1.mem_util, u1.power_w, u1.procs) == (88.0, 30.0, 650.0, 1)
    assert (u1.mem_used_bytes, u1.mem_total_bytes) == (2048 * 1048576, 196592 * 1048576)
    assert (u0.sm_util, u0.procs) == (0.0, 0)
    before = list(amdsmi.calls)
    source.utilization()
    assert sorted(set(amdsmi.calls[len(before) :])) == [  # 4 calls per GPU and sample; identity read once
        "amdsmi_get_gpu_activity",
        "amdsmi_get_gpu_process_list",
        "amdsmi_get_gpu_vram_usage",
        "amdsmi_get_power_info",
    ]
    assert len(amdsmi.calls) - len(before) == 8
    source.close()
    assert amdsmi.initialised is False


def test_amd_source_unmeasured_reads_are_none_not_zero():
    amdsmi = node(1)
    amdsmi.devices[0].update(gfx_activity=fake.UNSUPPORTED, processes=fake.UNSUPPORTED)  # one call reads both
    (u,) = amd.AmdSource(amdsmi_module=amdsmi).utilization()
    assert (u.sm_util, u.mem_util, u.procs) == (None, None, None) and u.power_w == 142.0


def test_amd_source_a_hung_sample_is_unmeasured_and_not_called_into_again():
    amdsmi = node(2)
    source = amd.AmdSource(timeout_s=0.3, amdsmi_module=amdsmi)
    amdsmi.hang = (1, "amdsmi_get_gpu_vram_usage")
    readings = source.utilization()
    assert [(u.index, u.pci_bus_id, u.sm_util, u.power_w, u.procs) for u in readings] == [
        (0, "0000:05:00.0", None, None, None),
        (1, "0000:26:00.0", None, None, None),
    ]
    calls = len(amdsmi.calls)
    assert [u.sm_util for u in source.utilization()] == [None, None] and len(amdsmi.calls) == calls
    source.close()  # not while the library is stuck
    assert amdsmi.initialised is True
    amdsmi.hang = None
    amdsmi.release.set()
    deadline = time.monotonic() + 2
    while source._busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [u.sm_util for u in source.utilization()] == [0.0, 0.0]


def test_amd_source_that_cannot_open_raises_one_line():
    with pytest.raises(StuneError, match=r"^amdsmi could not be opened: AMDSMI_STATUS_DRIVER_NOT_LOADED"):
        amd.AmdSource(amdsmi_module=node(fail_init=fake.AMDSMI_STATUS_DRIVER_NOT_LOADED))
    hung = node(1, hang=(0, "amdsmi_get_gpu_asic_info"))
    with pytest.raises(StuneError, match=r"^amdsmi: amdsmi-init did not answer within 0.2s$"):
        amd.AmdSource(timeout_s=0.2, amdsmi_module=hung)
    hung.release.set()
