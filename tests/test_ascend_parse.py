"""Every Ascend capture of tests/fixtures/accel/ascend (copied from hardware-outputs/accel, plus two with the
process table; origins in its SOURCES.md) parsed, each value written down here; what a capture does not give
is None. Then the forms the captures do not cover: a chip whose values do not line up, a cut table, the
hccn_tool forms with and without spaces, the version files."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_tune.hw import ascendparse, hccnparse
from slurm_tune.hw.accel import utilization_from_section
from slurm_tune.hw.amdvalues import blank_device

FIX = Path(__file__).parent / "fixtures" / "accel" / "ascend"
NPU_SMI = sorted(p.name for p in FIX.glob("*.txt") if "npu-smi" in p.name)


def read(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def chip(index, chip_, minor, name, bus, power, temp, aicore, used, total, processes=None, health="OK"):
    d = blank_device(index)
    d.update(chip=chip_, minor=minor, name=name, health=health, bus_id=bus, power_w=power)
    d.update(temperature_c=temp, util_pct=aicore, mem_used_mb=used, mem_total_mb=total)
    d["mem_util_pct"] = round(used / total * 100, 2)
    d["processes"] = processes
    return d


def procs(*pairs) -> list[dict]:
    return [{"pid": pid, "mem_mb": mem} for pid, mem in pairs]


HBM = 65536.0
# 910B3, npu-smi 25.2.0, 8 NPUs: (power, temp, bus, HBM used); NPU 2 runs one process (an empty name)
_6512 = [
    (97.9, 34.0, "c1", 3408.0),
    (89.5, 32.0, "c2", 3408.0),
    (92.3, 32.0, "81", 41052.0),
    (92.4, 32.0, "82", 3390.0),
    (95.6, 37.0, "01", 3403.0),
    (97.2, 38.0, "02", 3400.0),
    (91.0, 36.0, "41", 3401.0),
    (95.4, 37.0, "42", 3400.0),
]
# A3, npu-smi 25.2.3: 8 NPUs x 2 chips, Phy-ID = minor 0..15; (power or None for chip 1, temp, bus, AICore, HBM)
_4930 = [
    (232.5, 52.0, "9d", 17.0, 53444.0),
    (None, 51.0, "9f", 17.0, 52948.0),
    (226.9, 51.0, "99", 17.0, 53200.0),
    (None, 52.0, "9b", 17.0, 52940.0),
    (175.3, 52.0, "95", 0.0, 3128.0),
    (None, 52.0, "97", 0.0, 2888.0),
    (170.6, 51.0, "91", 0.0, 3122.0),
    (None, 51.0, "93", 0.0, 2888.0),
    (167.2, 51.0, "8d", 0.0, 3136.0),
    (None, 49.0, "8f", 0.0, 2895.0),
    (174.5, 51.0, "89", 0.0, 3130.0),
    (None, 50.0, "8b", 0.0, 2895.0),
    (243.3, 53.0, "85", 17.0, 50719.0),
    (None, 50.0, "87", 17.0, 50242.0),
    (248.0, 52.0, "81", 17.0, 50494.0),
    (None, 52.0, "83", 17.0, 50242.0),
]
_4930_PROCS = {  # minor -> processes: both chips of NPUs 0, 1, 6 and 7 busy, NPUs 2..5 idle
    0: procs((3325989, 50128.0), (3330598, 132.0), (3328327, 133.0), (3333165, 132.0)),
    1: procs((3328327, 50119.0)),
    2: procs((3330598, 50117.0)),
    3: procs((3333165, 50119.0)),
    12: procs((3085960, 47426.0), (3085961, 122.0), (3085962, 122.0), (3085964, 122.0)),
    13: procs((3085961, 47416.0)),
    14: procs((3085962, 47416.0)),
    15: procs((3085964, 47416.0)),
}

# capture -> (tool version, driver version from the version line, devices). Processes None: the excerpt has no
# process table (the tool did not tell), never [] (idle).
CAPTURES = {
    # 910B3 24.1.rc1, cut after NPU 0 (a marker line); the CANN file after it has no table rows
    "cann-toolkit-install-info-and-npu-smi-910b3-24.1.rc1-vllmascend834.txt": (
        "24.1.rc1",
        "24.1.rc1",
        [chip(0, 0, 0, "910B3", "0000:c1:00.0", 97.6, 52.0, 0.0, 3525.0, HBM)],
    ),
    # 310P3: `Chip Device` (the Device column is the minor), Power NA, no HBM column (Memory-Usage is the
    # memory), both chips of NPU 1 on one Bus-Id, 104 columns
    "npu-smi-info-310p3-24.1.rc2-ollama5315.txt": (
        "24.1.rc2",
        "24.1.rc2",
        [
            chip(1, 0, 0, "310P3", "0000:01:00.0", None, 59.0, 0.0, 1397.0, 44280.0),
            chip(1, 1, 1, "310P3", "0000:01:00.0", None, 58.0, 0.0, 1520.0, 43693.0),
        ],
    ),
    # the whole 910B table with its process table
    "npu-smi-info-910b3-25.2.0-procs-vllmascend6512.txt": (
        "25.2.0",
        "25.2.0",
        [
            chip(
                i,
                0,
                i,
                "910B3",
                f"0000:{b}:00.0",
                p,
                t,
                0.0,
                h,
                HBM,
                procs((1333928, 37709.0)) if i == 2 else [],
            )
            for i, (p, t, b, h) in enumerate(_6512)
        ],
    ),
    # a suffixed name, masked bus ids (kept as printed), no closing border after NPU 1
    "npu-smi-info-910b4-1-25.2.0-hamiwebui47.txt": (
        "25.2.0",
        "25.2.0",
        [
            chip(0, 0, 0, "910B4-1", "0000:xx:00.0", 91.3, 33.0, 0.0, 3197.0, HBM),
            chip(1, 0, 1, "910B4-1", "0000:xx:00.0", 88.1, 32.0, 0.0, 3197.0, HBM),
        ],
    ),
    # a prompt line first; `26838/ 32768` (no space before the slash), 32 GiB HBM
    "npu-smi-info-910b4-24.1.1-1panel9472.txt": (
        "24.1.1",
        "24.1.1",
        [
            chip(0, 0, 0, "910B4", "0000:c1:00.0", 88.2, 30.0, 0.0, 26838.0, 32768.0),
            chip(1, 0, 1, "910B4", "0000:c2:00.0", 87.0, 30.0, 0.0, 29356.0, 32768.0),
        ],
    ),
    # A3: `Chip Phy-ID` (the Phy-ID is the minor), two chips per NPU, the second's Power `-`; no top border
    "npu-smi-info-a3-25.2.1-ucm748.txt": (
        "25.2.1",
        "25.2.1",
        [
            chip(0, 0, 0, "Ascend910", "0000:9d:00.0", 166.5, 38.0, 0.0, 3131.0, HBM),
            chip(0, 1, 1, "Ascend910", "0000:9f:00.0", None, 37.0, 0.0, 2886.0, HBM),
            chip(1, 0, 2, "Ascend910", "0000:99:00.0", 168.1, 37.0, 0.0, 3125.0, HBM),
        ],
    ),
    # the whole A3 table: both chips of an NPU in one process block
    "npu-smi-info-a3-25.2.3-procs-vllmascend4930.txt": (
        "25.2.3",
        "25.2.3",
        [
            chip(m // 2, m % 2, m, "Ascend910", f"0000:{b}:00.0", p, t, a, h, HBM, _4930_PROCS.get(m, []))
            for m, (p, t, b, a, h) in enumerate(_4930)
        ],
    ),
    # starts at the header: no version line
    "npu-smi-info-a3-ascend910-vllmascend2534.txt": (
        None,
        None,
        [
            chip(0, 0, 0, "Ascend910", "0000:9d:00.0", 178.5, 36.0, 0.0, 3416.0, HBM),
            chip(0, 1, 1, "Ascend910", "0000:9f:00.0", None, 36.0, 0.0, 3195.0, HBM),
            chip(1, 0, 2, "Ascend910", "0000:99:00.0", 186.3, 36.0, 0.0, 3415.0, HBM),
        ],
    ),
}


HCCN = {  # the hccn_tool captures, each read by a test below
    "hccn-tool-ip-link-nethealth-doc-vllmomni.txt",
    "hccn-tool-lldp-ip-route-910b-arthurchiao-blog.txt",
    "hccn-tool-net-health-fault-and-ranktable-mindspore-doc.txt",
    "hccn-tool-stat-tail-910b-arthurchiao-blog.txt",
}


def test_every_capture_is_read_here_and_sources_has_each():
    on_disk = {p.name for p in FIX.glob("*.txt")}
    assert len(on_disk) == 12 and on_disk == set(CAPTURES) | HCCN
    assert set(NPU_SMI) <= set(CAPTURES)
    assert {p.name for p in FIX.glob("*.md")} == {"README.md", "SOURCES.md"}
    sources = read("SOURCES.md")
    for name in on_disk:
        assert sources.count(f"| {name} |") == 1, name


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_each_npu_smi_capture_reads_as_written_down(name):
    tool, driver, devices = CAPTURES[name]
    parsed = ascendparse.parse_npu_smi_info(read(name))
    assert (parsed["tool_version"], parsed["driver_version"]) == (tool, driver)
    assert parsed["errors"] == []
    assert parsed["devices"] == devices


def test_the_sampler_reads_each_chip_by_its_minor():
    readings = utilization_from_section(
        {
            "devices": ascendparse.parse_npu_smi_info(
                read("npu-smi-info-a3-25.2.3-procs-vllmascend4930.txt")
            )["devices"]
        }
    )
    assert [r.index for r in readings] == list(range(16))
    first, idle = readings[0], readings[4]
    assert (first.sm_util, first.procs, first.power_w, first.mem_used_bytes) == (
        17.0,
        4,
        232.5,
        53444 * 1048576,
    )
    # a second chip's power is unmeasured (npu-smi's `-`)
    assert (idle.sm_util, idle.procs, readings[5].power_w) == (0.0, 0, None)


# ---- what the captures do not show ---------------------------------------------------------------------------

TABLE = read("npu-smi-info-910b3-25.2.0-procs-vllmascend6512.txt")


def devices_of(text: str) -> dict[int, dict]:
    return {d["minor"]: d for d in ascendparse.parse_npu_smi_info(text)["devices"]}


def test_health_words_are_taken_as_printed_and_nothing_else():
    row = "| 1     910B3               | OK  "
    for word in ("Warning", "Alarm", "Critical"):
        assert devices_of(TABLE.replace(row, row.replace("OK ", f"{word:<3}")))[1]["health"] == word
    for garbage in ("ok", "Alarmed", "UNKNOWN", "-"):
        d = devices_of(TABLE.replace("| OK            | 89.5", f"| {garbage:<14}| 89.5"))[1]
        assert d["health"] is None and "health" in d["errors"], garbage
        assert d["power_w"] == 89.5  # the rest of the chip is read


def test_a_chip_whose_values_do_not_line_up_is_left_out_not_guessed():
    text = TABLE.replace(
        "| 97.9        34                0    / 0 ", "| 97.9                          0    / 0 "
    )
    parsed = ascendparse.parse_npu_smi_info(text)
    assert [d["index"] for d in parsed["devices"]] == [1, 2, 3, 4, 5, 6, 7]
    assert parsed["errors"] == ["a row whose values do not line up with the header"]


def test_missing_values_are_none_never_zero():
    text = TABLE.replace("| 97.9        34    ", "| NA          N/A   ").replace(
        "0           0    / 0          3408 / 65536", "-           0    / 0          NA   / NA   ", 1
    )
    d = devices_of(text)[0]
    unmeasured = (d["power_w"], d["temperature_c"], d["util_pct"], d["mem_used_mb"], d["mem_util_pct"])
    assert unmeasured == (None, None, None, None, None)


def test_a_table_cut_in_the_process_table_leaves_the_unlisted_npus_unmeasured():
    cut = TABLE[: TABLE.index("| No running processes found in NPU 3")]
    found = devices_of(cut)
    assert [found[i]["processes"] for i in range(4)] == [[], [], procs((1333928, 37709.0)), None]
    assert all(found[i]["processes"] is None for i in range(3, 8))


def test_a_process_block_cut_short_leaves_its_npu_unmeasured():
    # cut after NPU 0's chip-0 rows: its chip 1 may have had rows still to come, so neither reads idle
    text = read("npu-smi-info-a3-25.2.3-procs-vllmascend4930.txt")
    cut = text[: text.index("| 0       1                 | 3328327")]
    found = devices_of(cut)
    assert (found[0]["processes"], found[1]["processes"]) == (None, None)
    assert all(found[m]["processes"] is None for m in range(16))  # nothing after the cut is listed either


def test_an_unreadable_process_row_makes_that_npu_unmeasured():
    d = devices_of(TABLE.replace("| 1333928       |", "| 13x3928       |"))[2]
    assert d["processes"] is None and "processes" in d["errors"]


def test_a_second_chip_without_a_device_column_has_no_minor():
    text = TABLE.replace(
        "| 0                         | 0000:C2:00.0", "| 1                         | 0000:C2:00.0"
    )
    d = next(d for d in ascendparse.parse_npu_smi_info(text)["devices"] if d["index"] == 1)
    assert (d["chip"], d["minor"], d["errors"]["minor"]) == (1, None, "no device number for this chip")


def test_a_chip_listed_twice_is_kept_once():
    lines = TABLE.splitlines(keepends=True)
    at = lines.index(next(line for line in lines if line.startswith("| 0     910B3")))
    parsed = ascendparse.parse_npu_smi_info("".join(lines[: at + 3] + lines[at : at + 3] + lines[at + 3 :]))
    assert [d["index"] for d in parsed["devices"]].count(0) == 1
    assert parsed["errors"] == ["NPU 0 chip listed twice"]


def test_used_over_total_is_not_a_reading():
    d = devices_of(TABLE.replace("3408 / 65536", "70000/ 65536", 1))[0]
    assert (d["mem_used_mb"], d["mem_util_pct"]) == (None, None) and "memory" in d["errors"]


def test_no_table_is_no_devices():
    for text in (
        "",
        "dcmi model initialized failed, because the device is used. ret is -8020\n",
        "| a | b |\n",
    ):
        assert ascendparse.parse_npu_smi_info(text) == {
            "tool_version": None,
            "driver_version": None,
            "devices": [],
            "errors": [],
        }


# ---- hccn_tool ------------------------------------------------------------------------------------------------


def commands(name: str) -> dict[str, str]:
    """A file holding several commands' outputs, each after its `$ hccn_tool -i 3 -X -g` prompt line."""
    out, current = {}, None
    for line in read(name).splitlines():
        if line.lstrip().startswith("$"):
            current = line.split()[4]
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def test_link_net_health_and_ip_from_the_documented_example():
    # one file, the three commands' outputs together: each parser takes its own line
    text = read("hccn-tool-ip-link-nethealth-doc-vllmomni.txt")
    assert hccnparse.parse_link(text) == ("UP", "")
    assert hccnparse.parse_net_health(text) == ("Success", "")
    assert hccnparse.parse_ip(text) == ("10.86.1.80", "255.255.255.0", "")


def test_net_health_success_and_fault():
    success, fault, _ranktable = read("hccn-tool-net-health-fault-and-ranktable-mindspore-doc.txt").split(
        "---\n", 2
    )
    assert hccnparse.parse_net_health(success) == ("Success", "")
    assert hccnparse.parse_net_health(fault) == ("Fault", "")
    both = hccnparse.parse_net_health(success + fault)  # two answers in one output: which one holds?
    assert both[0] is None and "no net health status" in both[1]


def test_the_blog_capture_lldp_ip_and_route():
    out = commands("hccn-tool-lldp-ip-route-910b-arthurchiao-blog.txt")
    assert sorted(out) == ["-ip", "-lldp", "-route"]
    assert hccnparse.parse_ip(out["-ip"]) == ("29.1.112.213", "255.255.0.0", "")
    ip, mask, why = hccnparse.parse_ip(out["-route"])
    assert (ip, mask) == (None, None) and why.startswith("no ipaddr and netmask")
    lldp = hccnparse.parse_lldp(out["-lldp"])
    assert lldp["peer"] == {
        "chassis_id": "...",  # masked by the author, kept as printed
        "port": "400GE1/1/20:2",
        "system_name": None,
        "system_description": "Versatile Routing Platform Software",
        "capabilities": "Bridge, Router",
        "mgmt_ip": None,  # 26.xx.xx.xx: masked, no address
        "max_frame_size": 9216,
    }
    assert lldp["tlvs"]["System Description"] == [
        "Versatile Routing Platform Software",
        "VRP (R) software, Version 8.211 (DX511 V200R021C10SPC600)",
        "Huarong DX511",
    ]
    assert sorted(lldp["tlvs"]) == sorted(
        [
            "Chassis ID",
            "Port ID",
            "System Description",
            "System Capabilities",
            "Management Address",
            "Maximum Frame Size",
            "End of LLDPDU",
        ]
    )


def test_the_stat_tail():
    stat = hccnparse.parse_stat(read("hccn-tool-stat-tail-910b-arthurchiao-blog.txt"))
    assert stat == {
        "devid": 3,
        "counters": {
            "cq_dealloc": 0,
            "qp_alloc": 1,
            "qp_dealloc": 0,
            "pd_active": 1,
            "mr_active": 0,
            "cq_active": 1,
            "qp_active": 1,
            "aeqe": 0,
            "ceqe": 0,
        },
        "error_counters": {},
    }
    errors = hccnparse.parse_stat(
        "[devid 0] mac_rx_bad_pkt_num: 7\n[devid 0] roce_rx_err_pkt_num: 2\n[devid 0] x: 1\n"
    )
    assert errors["error_counters"] == {"mac_rx_bad_pkt_num": 7, "roce_rx_err_pkt_num": 2}


@pytest.mark.parametrize(
    "text, want",
    [
        ("link status: UP\n", ("UP", "")),
        ("link status:DOWN\n", ("DOWN", "")),
        ("Link Status : down\n", ("DOWN", "")),
        ("link status: UNKNOWN\n", (None, "no link status in hccn_tool's output ('link status: UNKNOWN')")),
        ("", (None, "no link status in hccn_tool's output (nothing)")),
    ],
)
def test_link_forms(text, want):
    assert hccnparse.parse_link(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("ipaddr:192.168.1.10\nnetmask:255.255.255.0\n", ("192.168.1.10", "255.255.255.0", "")),
        ("ipaddr: 192.168.1.10\nnetmask: 255.255.255.0\n", ("192.168.1.10", "255.255.255.0", "")),
        ("ipaddr:10.30.12.9 netmask:255.255.255.0\n", ("10.30.12.9", "255.255.255.0", "")),
        ("ipaddr:\nnetmask:\n", (None, None, "")),  # no address configured
        ("ipaddr:10.0.0.1\nnetmask:255.255.x\n", ("10.0.0.1", None, "netmask is not an IPv4 address")),
        (
            "ipaddr:10.0.0.300\nnetmask:255.0.0.0\n",
            (None, None, "ipaddr is not an IPv4 address ('ipaddr:10.0.0.300')"),
        ),
        ("ipaddr:\n", (None, None, "no ipaddr and netmask in hccn_tool's output ('ipaddr:')")),  # cut
        ("ipaddr:\n10.0.0.1\nnetmask:\n", (None, None, "an empty ipaddr among other lines ('ipaddr:')")),
    ],
)
def test_ip_forms(text, want):
    assert hccnparse.parse_ip(text) == want


# ---- version files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, version",
    [
        ("cann-toolkit-install-info-and-npu-smi-910b3-24.1.rc1-vllmascend834.txt", "8.1.RC1.alpha001"),
        ("npu-smi-info-910b3-25.2.0-procs-vllmascend6512.txt", "8.3.RC2"),
        ("npu-smi-info-a3-25.2.3-procs-vllmascend4930.txt", "8.5.0"),
    ],
)
def test_the_cann_install_info(name, version):
    text = read(name)
    assert hccnparse.parse_version_file(text) == version
    assert hccnparse.parse_key_values(text)["package_name"] == "Ascend-cann-toolkit"


def test_driver_and_firmware_version_info():
    # the documented form of /usr/local/Ascend/driver/version.info and firmware/version.info (no capture)
    driver = "Version=24.1.rc2\nascendhal_version=7.35.23\npackage_version=24.1.rc2\n"
    assert hccnparse.parse_version_file(driver) == "24.1.rc2"
    assert hccnparse.parse_version_file("Version=7.5.0.1.129\nfirmware_version=1.0\n") == "7.5.0.1.129"
    assert hccnparse.parse_version_file("package_version=24.1.0\n") == "24.1.0"
    assert hccnparse.parse_version_file("Version=\n") is None
    assert hccnparse.parse_version_file("Version=garbage\n") is None
