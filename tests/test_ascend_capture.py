"""hw/ascend.py's capture and sampler reading through the stand-in npu-smi and hccn_tool (tests/accel_standins/,
copied into a per-node directory with its state.json): what the section holds, how the tools are found
(accel.tools > $STUNE_ACCEL_TOOLS with %n > PATH > the driver's directories), the version files under the root,
and what a missing tool, a hang (the deadline), garbage and a flood of output make of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from slurm_tune.frozen import Frozen
from slurm_tune.hw import ascend, ascendtools
from stune_dev.accel import npu_entry

STANDINS = Path(__file__).parent / "accel_standins"
FIX = Path(__file__).parent / "fixtures" / "accel" / "ascend"
CAPTURE_6512 = FIX / "npu-smi-info-910b3-25.2.0-procs-vllmascend6512.txt"
BASE_ENV = {"PATH": "/usr/bin:/bin"}


def npu(i: int, **values) -> dict:
    return npu_entry(i, **values)  # the dev cluster's: one home for a stand-in NPU


def state(n: int = 4, **top) -> dict:
    ports = {
        str(i): {
            "link": "UP",
            "net_health": "Success",
            "ip": f"192.168.1.{10 + i}",
            "netmask": "255.255.255.0",
        }
        for i in range(n)
    }
    return {"npu_smi_version": "24.1.rc2", "npus": [npu(i) for i in range(n)], "ports": ports, **top}


def install(where: Path, values: dict, tools=("npu-smi", "hccn_tool")) -> Path:
    """A node's tools directory: the stand-ins and their state.json."""
    where.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        shutil.copyfile(STANDINS / tool, where / tool)
        (where / tool).chmod(0o755)
    (where / "state.json").write_text(json.dumps(values))
    return where


def env(tools_dir: Path | str | None = None, **extra) -> dict:
    return {**BASE_ENV, **({"STUNE_ACCEL_TOOLS": str(tools_dir)} if tools_dir else {}), **extra}


def version_tree(root: Path, driver="24.1.rc2", firmware="7.5.0.1.129", arch="aarch64-linux") -> Path:
    """The Ascend version files under a relocatable root, in the forms the driver and the CANN toolkit write."""
    ascend_dir = root / "usr/local/Ascend"
    (ascend_dir / "driver").mkdir(parents=True)
    (ascend_dir / "driver/version.info").write_text(
        f"Version={driver}\nascendhal_version=7.35.23\npackage_version={driver}\n"
    )
    (ascend_dir / "firmware").mkdir()
    (ascend_dir / "firmware/version.info").write_text(f"Version={firmware}\nfirmware_version=1.0\n")
    toolkit = ascend_dir / "ascend-toolkit/latest" / arch
    toolkit.mkdir(parents=True)
    cann = CAPTURE_6512.read_text().split("CANN:\n", 1)[1]  # the 8.3.RC2 install file of the 6512 capture
    (toolkit / "ascend_toolkit_install.info").write_text(cann)
    return root


def live_processes_under(path: Path) -> list[int]:
    """Processes (not zombies) whose command line names something under `path`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if str(path).encode() in cmdline and stat and stat[0] != "Z":
            found.append(int(pid))
    return found


def gone_soon(path: Path) -> bool:
    deadline = time.monotonic() + 5
    while live_processes_under(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not live_processes_under(path)


# ---- the stand-ins -------------------------------------------------------------------------------------------


def test_the_standin_prints_the_real_910b_table_byte_for_byte(tmp_path):
    """From the 6512 capture's values the stand-in prints that capture: widths, borders, process table."""
    rows = [(97.9, 34, "C1", 3408), (89.5, 32, "C2", 3408), (92.3, 32, "81", 41052), (92.4, 32, "82", 3390)]
    rows += [(95.6, 37, "01", 3403), (97.2, 38, "02", 3400), (91.0, 36, "41", 3401), (95.4, 37, "42", 3400)]
    busy = [{"pid": 1333928, "name": "", "mem_mb": 37709}]
    values = {
        "npu_smi_version": "25.2.0",
        "npus": [
            npu(
                i,
                power_w=p,
                temp_c=t,
                bus_id=f"0000:{b}:00.0",
                hbm_used_mb=h,
                hugepages_used=0,
                hugepages_total=0,
                processes=busy if i == 2 else [],
            )
            for i, (p, t, b, h) in enumerate(rows)
        ],
    }
    tools = install(tmp_path, values)
    printed = subprocess.run([tools / "npu-smi", "info"], capture_output=True, text=True, check=True).stdout
    real = CAPTURE_6512.read_text().split("NPU:\n", 1)[1].split("\n\nCANN:", 1)[0] + "\n"
    assert printed == real


def test_the_standins_refuse_what_they_do_not_know(tmp_path):
    tools = install(tmp_path, state(2))
    for argv in (
        ["npu-smi", "info", "-t", "board"],
        ["hccn_tool", "-i", "0", "-lldp", "-g"],
        ["hccn_tool", "-i", "7", "-link", "-g"],
    ):
        done = subprocess.run([tools / argv[0], *argv[1:]], capture_output=True, text=True)
        assert done.returncode == 1 and done.stdout == "" and done.stderr, argv
    (tools / "state.json").unlink()
    done = subprocess.run([tools / "npu-smi", "info"], capture_output=True, text=True)
    assert done.returncode == 2 and "state.json" in done.stderr


# ---- capture ---------------------------------------------------------------------------------------------------


def test_capture_reads_every_chip_port_and_version(tmp_path):
    values = state(4)
    values["npus"][1].update(
        aicore_pct=87, hbm_used_mb=52000, processes=[{"pid": 4242, "name": "python3", "mem_mb": 48000}]
    )
    tools = install(tmp_path / "tools", values)
    root = version_tree(tmp_path / "root")
    s = ascend.capture(str(root), timeout_s=20, environ=env(tools))
    assert s["answered"] is True and "error" not in s and "timeout" not in s, s.get("error")
    assert (s["vendor"], s["source"]) == ("ascend", "npu-smi") and 0 < s["elapsed_s"] < 20
    assert s["system"] == {
        "driver_version": "24.1.rc2",
        "firmware_version": "7.5.0.1.129",
        "cann_version": "8.3.RC2",
        "rocm_version": None,
        "tool_version": "24.1.rc2",
        "errors": {},
    }
    assert [(d["index"], d["chip"], d["minor"], d["bus_id"]) for d in s["devices"]] == [
        (i, 0, i, f"0000:{0xC1 + i:02x}:00.0") for i in range(4)
    ]
    busy = s["devices"][1]
    assert (busy["name"], busy["health"], busy["power_w"], busy["temperature_c"]) == (
        "910B3",
        "OK",
        92.5,
        45.0,
    )
    assert (busy["util_pct"], busy["mem_used_mb"], busy["mem_total_mb"], busy["mem_util_pct"]) == (
        87.0,
        52000.0,
        65536.0,
        79.35,
    )
    assert busy["processes"] == [{"pid": 4242, "mem_mb": 48000.0}] and s["devices"][0]["processes"] == []
    assert s["ports"] == {
        str(i): {
            "link": "UP",
            "net_health": "Success",
            "ip": f"192.168.1.{10 + i}",
            "netmask": "255.255.255.0",
            "errors": {},
        }
        for i in range(4)
    }
    json.dumps(s)


def test_what_the_state_injects_is_what_the_section_says(tmp_path):
    values = state(4)
    values["npus"][0]["health"] = "Warning"
    values["npus"][3].update(health="Alarm", power_w=None, aicore_pct=None)
    values["ports"]["1"]["link"] = "DOWN"
    values["ports"]["2"].update(net_health="Fault", ip=None)
    s = ascend.capture(str(tmp_path / "none"), timeout_s=20, environ=env(install(tmp_path / "t", values)))
    assert [d["health"] for d in s["devices"]] == ["Warning", "OK", "OK", "Alarm"]
    assert (s["devices"][3]["power_w"], s["devices"][3]["util_pct"]) == (None, None)  # npu-smi's NA
    assert [s["ports"][k]["link"] for k in "0123"] == ["UP", "DOWN", "UP", "UP"]
    assert s["ports"]["2"] == {"link": "UP", "net_health": "Fault", "ip": None, "netmask": None, "errors": {}}


def test_without_version_files_the_driver_comes_from_npu_smi_and_the_rest_says_why(tmp_path):
    s = ascend.capture(str(tmp_path / "empty"), timeout_s=20, environ=env(install(tmp_path / "t", state(1))))
    assert (s["system"]["driver_version"], s["system"]["firmware_version"], s["system"]["cann_version"]) == (
        "24.1.rc2",
        None,
        None,
    )
    assert s["system"]["errors"] == {
        "firmware_version": "/usr/local/Ascend/firmware/version.info: not found",
        "cann_version": "no ascend_toolkit_install.info (CANN toolkit) found",
    }


def test_the_cann_toolkit_home_from_the_environment_and_this_machines_arch_first(tmp_path):
    root = version_tree(tmp_path / "root")
    home = root / "opt/cann/latest"
    for arch, version in (("aarch64-linux", "8.0.RC3"), ("x86_64-linux", "8.0.RC2")):
        (home / arch).mkdir(parents=True)
        (home / arch / "ascend_toolkit_install.info").write_text(
            f"package_name=Ascend-cann-toolkit\nversion={version}\n"
        )
    system = ascend.read_versions(str(root), {"ASCEND_TOOLKIT_HOME": "/opt/cann/latest"})
    assert system["cann_version"] == {"aarch64": "8.0.RC3", "x86_64": "8.0.RC2"}.get(
        os.uname().machine, "8.0.RC3"
    )
    assert ascend.read_versions(str(root), {})["cann_version"] == "8.3.RC2"  # the default toolkit home


# ---- finding the tools -----------------------------------------------------------------------------------------


def test_tools_dir_with_the_node_name(tmp_path):
    for node, npus in (("n1", 2), ("n2", 3)):
        install(tmp_path / "nodes" / node / "accel-tools", state(npus))
    pattern = env(str(tmp_path / "nodes" / "%n" / "accel-tools"))
    assert len(ascend.capture(str(tmp_path), 20, environ=pattern, node="n2")["devices"]) == 3
    assert (
        len(ascend.capture(str(tmp_path), 20, environ={**pattern, "SLURMD_NODENAME": "n1"})["devices"]) == 2
    )


def test_accel_tools_win_over_the_tools_dir_and_the_dir_over_path(tmp_path):
    profile_dir, env_dir, path_dir = (
        install(tmp_path / d, state(n)) for d, n in (("p", 1), ("e", 2), ("path", 3))
    )
    on_path = {"PATH": f"{path_dir}:/usr/bin:/bin"}
    # the profile's accel.tools, as the loaded profile gives it
    tools = Frozen({"npu-smi": str(profile_dir / "npu-smi"), "hccn_tool": str(profile_dir / "hccn_tool")})
    assert (
        len(
            ascend.capture(
                "/nonexistent", 20, tools=tools, environ={**on_path, "STUNE_ACCEL_TOOLS": str(env_dir)}
            )["devices"]
        )
        == 1
    )
    assert (
        len(
            ascend.capture("/nonexistent", 20, environ={**on_path, "STUNE_ACCEL_TOOLS": str(env_dir)})[
                "devices"
            ]
        )
        == 2
    )
    assert len(ascend.capture("/nonexistent", 20, environ=on_path)["devices"]) == 3


def test_a_configured_tool_that_is_not_there_is_reported_not_looked_around(tmp_path):
    tools_dir = install(tmp_path / "t", state(1))
    s = ascend.capture("/nonexistent", 20, tools={"npu-smi": str(tmp_path / "nope")}, environ=env(tools_dir))
    assert (s["answered"], s["error"]) == (
        False,
        f"npu-smi: {tmp_path / 'nope'} (accel.tools) is not executable",
    )
    s = ascend.capture("/nonexistent", 20, tools={"npu-smi": "npu-smi"}, environ=env(tools_dir))
    assert s["error"] == "npu-smi: accel.tools gives 'npu-smi', not an absolute path"


@pytest.mark.skipif(
    any(os.path.exists(os.path.join(d, "npu-smi")) for d in ascendtools.SEARCH_DIRS),
    reason="this machine has npu-smi",
)
def test_a_missing_npu_smi_is_an_unanswered_section_saying_so(tmp_path):
    s = ascend.capture(str(tmp_path), 20, environ={"PATH": str(tmp_path)})
    assert (s["answered"], s["devices"], s["ports"]) == (False, [], {})
    assert (
        s["error"]
        == "npu-smi not found ($STUNE_ACCEL_TOOLS, PATH, /usr/local/sbin, /usr/local/bin, /usr/local/Ascend/driver/tools)"
    )
    assert ascend.utilization(5, environ={"PATH": str(tmp_path)}) == []


@pytest.mark.skipif(
    any(os.path.exists(os.path.join(d, "hccn_tool")) for d in ascendtools.SEARCH_DIRS),
    reason="this machine has hccn_tool",
)
def test_a_missing_hccn_tool_is_said_in_every_port(tmp_path):
    s = ascend.capture(str(tmp_path), 20, environ=env(install(tmp_path / "t", state(2), tools=("npu-smi",))))
    assert s["answered"] is True and len(s["devices"]) == 2
    for port in s["ports"].values():
        assert (port["link"], port["net_health"], port["ip"]) == (None, None, None)
        assert port["errors"] == {
            "hccn_tool": "hccn_tool not found ($STUNE_ACCEL_TOOLS, PATH, /usr/local/sbin, /usr/local/bin, /usr/local/Ascend/driver/tools)"
        }


# ---- deadlines, garbage, floods --------------------------------------------------------------------------------


def test_a_hanging_npu_smi_stops_at_the_deadline_and_says_where(tmp_path):
    tools = install(tmp_path / "t", state(2, hang="info", hang_s=60))
    start = time.monotonic()
    s = ascend.capture(str(tmp_path), timeout_s=1.5, environ=env(tools))
    assert time.monotonic() - start < 3
    assert (s["answered"], s["stalled_at"], s["timeout"], s["reader"]) == (False, "npu-smi info", True, "S")
    assert s["error"] == "`npu-smi info` did not answer within 1.5s"
    assert (s["devices"], s["ports"]) == ([], {})
    assert gone_soon(tools), "the stuck stand-in was not killed"
    start = time.monotonic()
    assert ascend.utilization(1.0, environ=env(tools)) == []
    assert time.monotonic() - start < 2.5


def test_a_hanging_hccn_tool_keeps_what_was_read_and_names_the_command(tmp_path):
    tools = install(tmp_path / "t", state(3, hang=["link:1"], hang_s=60))
    s = ascend.capture(str(tmp_path), timeout_s=3, environ=env(tools))
    assert (s["answered"], s["stalled_at"], s["timeout"], s["reader"]) == (
        True,
        "hccn_tool -i 1 -link -g",
        True,
        "S",
    )
    assert len(s["devices"]) == 3 and s["ports"]["0"]["errors"] == {} and s["ports"]["0"]["link"] == "UP"
    stalled = "not read: `hccn_tool -i 1 -link -g` hung first"
    assert s["ports"]["1"]["errors"] == {
        "link": "`hccn_tool -i 1 -link -g` did not answer within the hccn_tool reads' 3s",
        "net_health": stalled,
        "ip": stalled,
    }
    assert all(s["ports"]["1"][v] is None for v in ("link", "net_health", "ip"))
    for other in "02":  # read beside it
        assert (s["ports"][other]["link"], s["ports"][other]["errors"]) == ("UP", {})
    assert gone_soon(tools)


def test_when_every_link_read_hangs_the_devices_not_started_are_not_read(tmp_path):
    tools = install(tmp_path / "t", state(ascend.PARALLEL + 2, hang="link", hang_s=60))
    start = time.monotonic()
    s = ascend.capture(str(tmp_path), timeout_s=2, environ=env(tools))
    assert time.monotonic() - start < 6
    side_by_side = [str(i) for i in range(ascend.PARALLEL)]
    assert s["answered"] is True and s["timeout"] is True
    assert s["stalled_at"] in {f"hccn_tool -i {n} -link -g" for n in side_by_side}
    for n in side_by_side:
        assert (
            s["ports"][n]["errors"]["link"]
            == f"`hccn_tool -i {n} -link -g` did not answer within the hccn_tool reads' 2s"
        )
    stalled = f"not read: `{s['stalled_at']}` hung first"
    for n in (str(ascend.PARALLEL), str(ascend.PARALLEL + 1)):
        assert s["ports"][n]["errors"] == {"link": stalled, "net_health": stalled, "ip": stalled}
    assert gone_soon(tools)


def test_a_tool_still_stuck_from_an_earlier_run_is_not_started_again(tmp_path):
    tools = install(tmp_path / "t", state(1))
    stuck = subprocess.Popen(["sleep", "30"])
    ascendtools._stuck[str(tools / "npu-smi")] = stuck
    deadline = time.monotonic() + 5
    while Path(f"/proc/{stuck.pid}/stat").read_text().rpartition(")")[2].split()[0] != "S":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        s = ascend.capture(str(tmp_path), timeout_s=10, environ=env(tools))
        assert (s["answered"], s["timeout"], s["reader"], s["stalled_at"]) == (
            False,
            True,
            "S",
            "npu-smi info",
        )
        assert (
            s["error"]
            == f"`npu-smi info` not run: an earlier one is still stuck (pid {stuck.pid}); not run again"
        )
    finally:
        stuck.kill()
        stuck.wait()
    again = ascend.capture(str(tmp_path), timeout_s=20, environ=env(tools))
    assert again["answered"] is True  # the earlier one has died: this one ran
    assert str(tools / "npu-smi") not in ascendtools._stuck


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_garbage_from_npu_smi_is_an_unanswered_section(tmp_path):
    script(
        tmp_path / "t" / "npu-smi",
        "echo 'dcmi model initialized failed, because the device is used. ret is -8020'; exit 255",
    )
    s = ascend.capture(str(tmp_path), 20, environ=env(tmp_path / "t"))
    assert (s["answered"], s["devices"]) == (False, [])
    assert (
        s["error"]
        == "`npu-smi info` exited 255 and listed no NPU: dcmi model initialized failed, because the device is used. ret is -8020"
    )
    script(tmp_path / "t" / "npu-smi", "head -c 3000 /dev/urandom")
    assert ascend.capture(str(tmp_path), 20, environ=env(tmp_path / "t"))["answered"] is False


def test_a_table_with_a_chip_row_left_out_is_unanswered_keeping_the_rest(tmp_path):
    tools = install(tmp_path / "t", state(3))
    table = subprocess.run([tools / "npu-smi", "info"], capture_output=True, text=True, check=True).stdout
    row = "| 1     910B3               | OK            | 92.5        45"
    assert table.count(row) == 1
    garbled = table.replace(row, row[:-2] + "  ")  # NPU 1 without its temperature: its values do not line up
    script(tools / "npu-smi", f"cat <<'EOF'\n{garbled}EOF")
    s = ascend.capture(str(tmp_path), 20, environ=env(tools))
    assert s["answered"] is False
    assert (
        s["error"]
        == "`npu-smi info`: 1 chip row(s) left out: a row whose values do not line up with the header"
    )
    assert [d["minor"] for d in s["devices"]] == [0, 2] and sorted(s["ports"]) == ["0", "2"]
    assert s["ports"]["2"]["link"] == "UP"


def test_garbage_or_a_failing_hccn_tool_is_unknown_in_the_port(tmp_path):
    tools = install(tmp_path / "t", state(2))
    script(
        tools / "hccn_tool",
        'case "$2" in 0) echo "link status: SOMETIMES"; echo "net health status: Maybe";;'
        ' *) echo "hccn_tool: dsmi_get_device_info failed, ret = -8001" >&2; exit 3;; esac',
    )
    s = ascend.capture(str(tmp_path), 20, environ=env(tools))
    assert s["ports"]["0"]["link"] is None and s["ports"]["0"]["net_health"] is None
    assert (
        s["ports"]["0"]["errors"]["link"] == "no link status in hccn_tool's output ('link status: SOMETIMES')"
    )
    assert (
        s["ports"]["1"]["errors"]["link"]
        == "`hccn_tool -i 1 -link -g` exited 3: hccn_tool: dsmi_get_device_info failed, ret = -8001"
    )
    assert "timeout" not in s


def test_a_tool_that_floods_its_output_is_cut_off(tmp_path):
    script(tmp_path / "t" / "npu-smi", "exec yes 'this is not a table'")
    start = time.monotonic()
    s = ascend.capture(str(tmp_path), 20, environ=env(tmp_path / "t"))
    assert time.monotonic() - start < 10
    assert (s["answered"], s["error"]) == (False, "`npu-smi info` printed more than 1024 KiB")
    assert gone_soon(tmp_path / "t")


# ---- the sampler's reading -------------------------------------------------------------------------------------


def test_utilization_is_one_npu_smi_run(tmp_path):
    values = state(3)
    values["npus"][2].update(
        aicore_pct=90, processes=[{"pid": 1, "name": "a", "mem_mb": 1}, {"pid": 2, "name": "b", "mem_mb": 2}]
    )
    values["npus"][1]["aicore_pct"] = None
    readings = ascend.utilization(10, environ=env(install(tmp_path, values)))
    assert [(r.index, r.sm_util, r.procs, r.power_w) for r in readings] == [
        (0, 0.0, 0, 92.5),
        (1, None, 0, 92.5),
        (2, 90.0, 2, 92.5),
    ]
    assert readings[0].mem_used_bytes == 3400 * 1048576 and readings[0].pci_bus_id == "0000:c1:00.0"
