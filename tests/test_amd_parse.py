"""Every AMD capture of tests/fixtures/accel/amd (copied from hardware-outputs/accel; origins in its SOURCES.md)
parsed into `accel` devices, each value written down here; everything a capture does not give is None. Then the
forms the captures do not cover (rocm-smi --json, a full rocminfo, amd-smi static --json), telling the outputs
apart, and one node's outputs merged into a replayable section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_tune.hw import amdparse, rocmparse
from slurm_tune.hw.accel import utilization_from_section
from slurm_tune.hw.amdvalues import blank_device, blank_system

FIX = Path(__file__).parent / "fixtures" / "accel" / "amd"


def dev(index: int, ecc=None, pcie=None, **values) -> dict:
    d = blank_device(index)
    d.update(values)
    d["ecc"].update(ecc or {})
    d["pcie"].update(pcie or {})
    return d


def system(**values) -> dict:
    return {**blank_system(), **values}


# the DPX capture: even devices are the first partition of a GPU (readings), odd ones its second (all N/A)
_DPX = {0: (60.0, 319.0), 2: (62.0, 299.0), 4: (58.0, 304.0), 6: (64.0, 309.0)}
_FIRMWARE_APU = {
    "asd": "0x21000091",
    "ce": "2",
    "dmcu": "0",
    "mc": "0",
    "me": "13",
    "mec": "18",
    "mec2": "18",
    "pfp": "13",
    "rlc": "26",
    "rlc srlc": "1",
    "rlc srlg": "1",
    "rlc srls": "1",
    "sdma": "1",
    "sdma2": "0",
    "smc": "00.84.79.221",
    "sos": "0x00000000",
    "ta ras": "00.00.00.00",
    "ta xgmi": "00.00.00.00",
    "uvd": "0x00000000",
    "vce": "0x00000000",
    "vcn": "0x02118000",
}

CAPTURES = {
    # banner: amdgpu version `Linuxver` is no version; UEC is the uncorrectable ECC count
    "amd-smi-default-table-strixhalo-amdsmi110.txt": (
        "amdsmi-table",
        system(tool_version="26.1.0+e94df3ed", rocm_version="6.4.1"),
        [
            dev(
                0,
                ecc={"uncorrected": 0},
                name="Radeon 8050S Graphics",
                bus_id="0000:c2:00.0",
                power_w=14.0,
                temperature_c=29.0,
                util_pct=7.0,
                mem_used_mb=3056.0,
                mem_total_mb=8192.0,
            )
        ],
    ),
    # the wrapped JPEG_ACTIVITY list and CLOCK cut mid-way do not disturb USAGE and POWER
    "amd-smi-metric-rdna-powerjoular67.txt": (
        "amdsmi-text",
        system(),
        [dev(0, util_pct=0.0, mem_util_pct=1.0, power_w=20.0)],
    ),
    # cut inside jpeg_activity: closed after its last whole line
    "amd-smi-metric-usage-json-w7700-beszel737.txt": (
        "amdsmi-json",
        system(),
        [dev(0, util_pct=42.0, mem_util_pct=1.0)],
    ),
    # serials <redacted> by the author: no serial; PCIE_INTERFACE_VERSION `Gen 5`; IFWI is the VBIOS
    "amd-smi-static-mi350x-rocmsystems2987.txt": (
        "amdsmi-text",
        system(driver_version="6.18.3"),
        [
            dev(
                0,
                pcie={"max_width": 16, "max_gen": 5},
                name="AMD Instinct MI350X",
                bus_id="0000:05:00.0",
                firmware={"vbios": "00154951"},
            )
        ],
    ),
    # VRAM% (allocation) is not read; secondary partitions are unmeasured, not 0
    "rocm-smi-concise-mi350-dpx-rocmsystems1508.txt": (
        "rocm-smi",
        system(),
        [
            dev(i, temperature_c=_DPX[i][0], power_w=_DPX[i][1], power_limit_w=1000.0, util_pct=0.0)
            if i in _DPX
            else dev(i)
            for i in range(8)
        ],
    ),
    # Card series is the APU's id as printed; every firmware block by its name
    "rocm-smi-showallinfo-fw-product-apu-legacyrocmbuild2410.txt": (
        "rocm-smi",
        system(),
        [dev(0, name="0x164e", firmware=_FIRMWARE_APU)],
    ),
    "rocminfo-agent-mi300x-legacyrocmbuild4414.txt": (
        "rocminfo",
        system(),
        [dev(0, name="AMD Instinct MI300X")],
    ),
}


def test_the_table_names_every_capture_once_and_sources_has_each():
    on_disk = {p.name for p in FIX.glob("*.txt")}
    assert len(on_disk) == 7 and on_disk == set(CAPTURES)
    assert {p.name for p in FIX.glob("*.md")} == {"README.md", "SOURCES.md"}
    sources = (FIX / "SOURCES.md").read_text()
    for name in on_disk:
        assert sources.count(f"| {name} |") == 1, name


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_every_capture(name):
    kind, expected_system, expected_devices = CAPTURES[name]
    data = (FIX / name).read_text(encoding="utf-8")
    assert amdparse.kind(data) == kind
    parsed = amdparse.parse_any(data)
    assert parsed["system"] == expected_system
    assert parsed["devices"] == expected_devices
    assert amdparse.parse_any(data.encode()) == parsed  # bytes as read from a tool's pipe


def test_the_static_and_metric_outputs_of_one_node_merge_into_a_replayable_section():
    static = (FIX / "amd-smi-static-mi350x-rocmsystems2987.txt").read_text(encoding="utf-8")
    metric = STATIC_METRIC_JSON
    section = amdparse.section([static, metric])
    assert section["answered"] is True and section["vendor"] == "amd" and section["source"] == "replay"
    (d,) = section["devices"]
    assert d["name"] == "AMD Instinct MI350X" and d["bus_id"] == "0000:05:00.0" and d["minor"] == 0
    assert d["util_pct"] == 12.0 and d["mem_used_mb"] == 1024.0 and d["mem_total_mb"] == 294896.0
    assert d["ecc"] == {"uncorrected": 0, "corrected": 3} and d["temperature_c"] == 52.0
    assert d["pcie"] == {"width": 16, "max_width": 16, "gen": 5, "max_gen": 5}
    assert section["system"]["driver_version"] == "6.18.3"
    json.dumps(section)  # a snapshot file holds it as it is
    (u,) = utilization_from_section(section)
    assert (u.index, u.sm_util, u.mem_util, u.power_w, u.procs) == (0, 12.0, 3.0, 410.0, None)


def test_outputs_with_no_device_make_an_unanswered_section():
    section = amdparse.section(["", b"\xff\xfe garbage", "GPU: x\n    USAGE:\n"])
    assert section["answered"] is False and section["devices"] == []
    assert section["error"] == "no AMD device in the tool outputs"


def test_minors_follow_the_bus_ids_where_the_outputs_do_not_name_render_nodes():
    table = (FIX / "amd-smi-default-table-strixhalo-amdsmi110.txt").read_text(encoding="utf-8")
    two = table.replace("0000:c2:00.0", "0000:e2:00.0") + table.split("|=====")[1].replace(
        "   0       0", "   1       1"
    )
    section = amdparse.section([two])
    assert [(d["index"], d["bus_id"], d["minor"]) for d in section["devices"]] == [
        (0, "0000:e2:00.0", 1),
        (1, "0000:c2:00.0", 0),
    ]


# amd-smi static --json and metric --json of an MI350X, in amd-smi 6.4's shape (the captures have neither whole)
STATIC_METRIC_JSON = """$ amd-smi metric --json
[
    {
        "gpu": 0,
        "usage": {"gfx_activity": {"value": 12, "unit": "%"}, "umc_activity": {"value": 3, "unit": "%"}},
        "power": {"socket_power": {"value": 410, "unit": "W"}, "gfx_voltage": "N/A"},
        "temperature": {"edge": "N/A", "hotspot": {"value": 52, "unit": "C"}, "mem": {"value": 44, "unit": "C"}},
        "pcie": {"width": 16, "speed": {"value": 32, "unit": "GT/s"}, "bandwidth": "N/A"},
        "ecc": {"total_correctable_count": 3, "total_uncorrectable_count": 0, "total_deferred_count": 0},
        "mem_usage": {"total_vram": {"value": 294896, "unit": "MB"}, "used_vram": {"value": 1024, "unit": "MB"}}
    }
]
"""


def test_amd_smi_metric_text_with_every_section_we_read():
    text = """GPU: 3
    USAGE:
        GFX_ACTIVITY: 100 %
        UMC_ACTIVITY: 57 %
    POWER:
        SOCKET_POWER: 731 W
    TEMPERATURE:
        EDGE: N/A
        HOTSPOT: 88 °C
        MEM: 71 °C
    PCIE:
        WIDTH: 8
        SPEED: 16 GT/s
    ECC:
        TOTAL_CORRECTABLE_COUNT: 12
        TOTAL_UNCORRECTABLE_COUNT: 1
    MEM_USAGE:
        TOTAL_VRAM: 196592 MB
        USED_VRAM: 180224 MB
"""
    (d,) = amdparse.parse_amdsmi_text(text)["devices"]
    assert d == dev(
        3,
        ecc={"uncorrected": 1, "corrected": 12},
        pcie={"width": 8, "gen": 4},
        util_pct=100.0,
        mem_util_pct=57.0,
        power_w=731.0,
        temperature_c=88.0,
        mem_used_mb=180224.0,
        mem_total_mb=196592.0,
    )


def test_rocm_smi_json_and_showallinfo_lines_read_the_same_keys():
    values = {
        "Card Series": "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
        "Serial Number": "692139000119",
        "PCI Bus": "0000:C9:00.0",
        "Temperature (Sensor junction) (C)": "45.0",
        "Temperature (Sensor edge) (C)": "38.0",
        "Average Graphics Package Power (W)": "128.0",
        "Max Graphics Package Power (W)": "560.0",
        "GPU use (%)": "100",
        "GPU memory use (%)": "7",
        "GPU Memory Allocated (VRAM%)": "35",
        "VRAM Total Memory (B)": "68702699520",
        "VRAM Total Used Memory (B)": "24051580928",
        "Driver version": "6.7.0",
        "VBIOS version": "113-D65205-107",
        "MEC firmware version": "63",
        "pcie clock level": "1 (16.0GT/s x16)",
    }
    expected = dev(
        1,
        pcie={"width": 16, "gen": 4},
        name="AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
        serial="692139000119",
        bus_id="0000:c9:00.0",
        temperature_c=45.0,
        power_w=128.0,
        power_limit_w=560.0,
        util_pct=100.0,
        mem_util_pct=7.0,
        mem_used_mb=22937.375,
        mem_total_mb=65520.0,
        firmware={"mec": "63", "vbios": "113-D65205-107"},
    )
    as_json = json.dumps({"card1": values})
    as_lines = "\n".join(f"GPU[1]\t\t: {k}: \t{v}" for k, v in values.items())
    for data in (as_json, as_lines):
        assert amdparse.kind(data) == "rocm-smi"
        parsed = rocmparse.parse_rocm_smi(data)
        assert parsed["devices"] == [expected] and parsed["system"]["driver_version"] == "6.7.0"


def test_rocminfo_reads_gpu_agents_only_at_their_own_indentation():
    data = """ROCk module version 6.10.5 is loaded
=====================
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD EPYC 9654 96-Core Processor
  Marketing Name:          AMD EPYC 9654 96-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx942
  Marketing Name:          AMD Instinct MI300X
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
*******
Agent 3
*******
  Name:                    gfx942
  Marketing Name:
  Device Type:             GPU
"""
    parsed = rocmparse.parse_rocminfo(data)
    assert parsed["system"]["driver_version"] == "6.10.5"
    assert parsed["devices"] == [dev(0, name="AMD Instinct MI300X"), dev(1, name="gfx942")]


@pytest.mark.parametrize(
    "data, util",
    [
        ('[\n  {\n    "gpu": 0,\n    "usage": {\n      "gfx_activity": {"value": 95', None),  # 95 or 9...
        ('[\n  {\n    "gpu": 0,\n    "usage": {\n      "gfx_activity": {"value": 95}\n', 95.0),
        ('[\n  {\n    "gpu": 0,\n    "usage": {\n      "gfx_activity": 9,\n      "umc_activity":', 9.0),
        ('junk\n[\n  {\n    "gpu": 0,\n    "usage": {"gfx_activity": 9}\n  },\n', 9.0),
    ],
)
def test_a_cut_json_document_keeps_the_whole_lines_before_the_cut(data, util):
    (d,) = amdparse.parse_amdsmi_json(data)["devices"]
    assert d["util_pct"] == util and d["index"] == 0
    assert amdparse.load_json('{"a": "unclosed') is None and amdparse.load_json("no json here") is None


def test_unit_forms_and_not_given_values():
    text = """GPU: 0
    POWER:
        SOCKET_POWER: 731000 mW
    MEM_USAGE:
        TOTAL_VRAM: 192 GB
        USED_VRAM: N/A
    USAGE:
        GFX_ACTIVITY: 101 %
        UMC_ACTIVITY: 2 MHz
    BUS:
        BDF: 0000:XX:00.0
        MAX_PCIE_SPEED: 16000
    TEMPERATURE:
        HOTSPOT: N/A
        EDGE: 35 °C
GPU: 1
    POWER:
        SOCKET_POWER: 65534 W
    TEMPERATURE:
        HOTSPOT: 511 °C
        EDGE: -273 °C
"""
    d, garbage = amdparse.parse_amdsmi_text(text)["devices"]
    assert (garbage["power_w"], garbage["temperature_c"]) == (
        None,
        None,
    )  # no device reads that: a sensor's junk
    assert (d["power_w"], d["mem_total_mb"], d["mem_used_mb"]) == (731.0, 196608.0, None)
    assert (d["util_pct"], d["mem_util_pct"]) == (None, None)  # over 100 %, a percentage in MHz: garbage
    assert d["bus_id"] == "0000:xx:00.0" and d["pcie"]["max_gen"] == 4 and d["temperature_c"] == 35.0
