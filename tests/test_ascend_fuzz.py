"""Byte-level fuzzing of every Ascend parser (hw/ascendparse.py, hw/hccnparse.py): nothing raises, every device
keeps the section's shape with values of their types and ranges, and noise never reads as a failure: a healthy
capture with its bytes flipped, spliced or cut never gives a health of Warning/Alarm/Critical, a DOWN link, a
net health other than Success, a port without an address, or an idle NPU where a process ran. Garbage is None.

Inputs: every capture of tests/fixtures/accel/ascend with bits flipped, bytes inserted, cut at every point, and
random bytes; then each capture with one reading replaced by digit-free garbage. (A flipped digit in a number
is another table as valid as the real one: a chip number 1 flipped to 0 moves that chip's process to chip 0.
So the process check is per NPU: a busy NPU never reads all idle.)"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw import ascendparse, hccnparse
from slurm_tune.hw.accel import utilization_from_section
from slurm_tune.hw.amdvalues import blank_device

FIX = Path(__file__).parent / "fixtures" / "accel" / "ascend"
NAMES = sorted(p.name for p in FIX.glob("*.txt"))
HEALTHY = [n for n in NAMES if "fault" not in n]  # every capture but the one that shows a Fault
FAST = settings(max_examples=400, deadline=None)
KEYS = set(blank_device(0))
RANGES = {  # field -> (low, high) of a value that is not None
    "power_w": (0, 10000),
    "temperature_c": (-50, 200),
    "util_pct": (0, 100),
    "mem_util_pct": (0, 100),
    "mem_used_mb": (0, 2**30),
    "mem_total_mb": (0, 2**30),
}


def check_device(d: dict) -> None:
    assert set(d) == KEYS
    for key in ("index", "chip"):
        assert type(d[key]) is int and 0 <= d[key] <= ascendparse.MAX_ID
    assert d["minor"] is None or (type(d["minor"]) is int and 0 <= d["minor"] <= ascendparse.MAX_ID)
    assert d["health"] is None or d["health"] in ascendparse.HEALTH
    for key in ("name", "bus_id"):
        assert d[key] is None or (isinstance(d[key], str) and d[key].isprintable() and 0 < len(d[key]) <= 256)
    for key, (low, high) in RANGES.items():
        v = d[key]
        assert v is None or (type(v) is float and math.isfinite(v) and low <= v <= high), (key, v)
    if d["mem_used_mb"] is not None:
        assert d["mem_total_mb"] is not None and d["mem_used_mb"] <= d["mem_total_mb"]
    assert d["processes"] is None or all(
        set(p) == {"pid", "mem_mb"} and type(p["pid"]) is int and p["pid"] > 0 for p in d["processes"]
    )
    assert all(isinstance(k, str) and isinstance(v, str) and "\n" not in v for k, v in d["errors"].items())


def parse_all(data: bytes) -> dict:
    """Every parser on `data`; what each gave, checked for shape."""
    text = data.decode("utf-8", "replace")
    parsed = ascendparse.parse_npu_smi_info(text)
    assert set(parsed) == {"tool_version", "driver_version", "devices", "errors"}
    for d in parsed["devices"]:
        check_device(d)
    assert len({(d["index"], d["chip"]) for d in parsed["devices"]}) == len(parsed["devices"])
    assert all(isinstance(e, str) for e in parsed["errors"]) and len(parsed["errors"]) <= 20
    utilization_from_section({"devices": parsed["devices"]})
    link, net, (ip, mask, ip_why) = (
        hccnparse.parse_link(text),
        hccnparse.parse_net_health(text),
        hccnparse.parse_ip(text),
    )
    assert link[0] in (None, *hccnparse.LINK) and (link[0] is None) == bool(link[1])
    assert net[0] in (None, *hccnparse.NET_HEALTH) and (net[0] is None) == bool(net[1])
    assert ip is None or hccnparse.ipv4(ip) == ip
    assert mask is None or hccnparse.ipv4(mask) == mask
    lldp, stat = hccnparse.parse_lldp(text), hccnparse.parse_stat(text)
    assert lldp["peer"]["mgmt_ip"] is None or hccnparse.ipv4(lldp["peer"]["mgmt_ip"])
    assert all(type(v) is int and v >= 0 for v in stat["counters"].values())
    assert hccnparse.parse_version_file(text) is None or hccnparse.parse_version_file(text)[0].isdigit()
    json.dumps([parsed, link, net, lldp, stat])
    return {"devices": parsed["devices"], "link": link[0], "net": net[0], "ip": (ip, mask, ip_why)}


def never_fails(got: dict, original: dict) -> None:
    """What a healthy capture may turn into under noise: the same, or unknown; never a failure."""
    assert all(d["health"] in ("OK", None) for d in got["devices"])
    assert got["link"] in ("UP", None)
    assert got["net"] in ("Success", None)
    if original["ip"][0] is not None:
        assert got["ip"] != (None, None, ""), "no address out of noise"
    for npu in {d["index"] for d in original["devices"] if d["processes"]}:
        chips = [d["processes"] for d in got["devices"] if d["index"] == npu]
        assert not chips or any(p != [] for p in chips), "an idle NPU out of noise"


def mutants(data: bytes, rng: random.Random):
    for _ in range(40):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            mutant[rng.randrange(len(mutant))] ^= 1 << rng.randrange(8)
        yield bytes(mutant)
    for _ in range(20):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutant.insert(
                rng.randrange(len(mutant) + 1), rng.choice((0x00, 0xFF, 0x0A, 0x7C, 0x2F, 0x3A, 0x20))
            )
        yield bytes(mutant)
    for i in range(0, len(data), 7):
        yield data[:i]
        yield data[i:]


@pytest.mark.parametrize("name", NAMES)
def test_every_capture_flipped_inserted_and_cut_never_raises_nor_fails(name):
    data = (FIX / name).read_bytes()
    original = parse_all(data)
    rng = random.Random(name)
    n = 0
    for mutant in mutants(data, rng):
        got = parse_all(mutant)
        if name in HEALTHY:
            never_fails(got, original)
        n += 1
    assert n > 60


@FAST
@given(data=st.binary(max_size=3000))
def test_random_bytes_never_raise_nor_fail(data):
    got = parse_all(data)
    assert got["link"] != "DOWN" and got["net"] in (None, "Success")
    assert all(d["health"] in ("OK", None) for d in got["devices"])


@FAST
@given(
    name=st.sampled_from(HEALTHY),
    edits=st.lists(st.tuples(st.integers(0, 12000), st.binary(max_size=12)), min_size=1, max_size=4),
)
def test_captures_with_random_bytes_spliced_in_never_raise_nor_fail(name, edits):
    data = bytearray((FIX / name).read_bytes())
    original = parse_all(bytes(data))
    for at, piece in edits:
        at %= len(data) + 1
        data[at : at + len(piece) % 5] = piece
    never_fails(parse_all(bytes(data)), original)


LONG = {  # linear time: no regex runs over the spacing of a line
    "blank lines": "\n" * 100000,
    "a row of spaces": "|" + " " * 200000 + "|",
    "a cell of slashes": "| " + " / " * 60000 + " |",
    "many cells": "|" * 200000,
    "a keyed line of spaces": "link status:" + " " * 200000 + "x",
    "an ipaddr of spaces": "ipaddr:" + " " * 200000 + "\nnetmask:",
    "a stat line of spaces": "[devid 0]" + " " * 200000 + "x",
    "a TLV of many lines": "Port ID TLV\n" + "\tIfname: x\n" * 100000,
    "many chips": (
        "| NPU   Name | Health | Power(W) |\n| Chip | Bus-Id | AICore(%) |\n+\n"
        + "| 0 910B | OK | 1 |\n| 0 | 0000:01:00.0 | 0 |\n+\n" * 20000
    ),
    "many process rows": "| NPU     Chip | Process id | Process name | Process memory(MB) |\n"
    + "| 0 0 | 1 | | 1 |\n" * 100000,
}


@pytest.mark.parametrize("what", sorted(LONG))
def test_long_pathological_outputs_are_read_in_linear_time(what):
    start = time.monotonic()
    parse_all(LONG[what].encode())
    assert time.monotonic() - start < 10, what


# (capture, a text found once in it, the reading within that text, device minor, field): that reading replaced
# by garbage makes the field None
_6512 = "npu-smi-info-910b3-25.2.0-procs-vllmascend6512.txt"
_310P = "npu-smi-info-310p3-24.1.rc2-ollama5315.txt"
READINGS = [
    (_6512, "| 97.9", "97.9", 0, "power_w"),
    (_6512, "| 97.9        34", "34", 0, "temperature_c"),
    (_6512, "41052/", "41052", 2, "mem_used_mb"),
    (_6512, "41052/", "41052", 2, "mem_util_pct"),
    (_6512, "| 37709", "37709", 2, "processes.0.mem_mb"),
    (_310P, "1397 /", "1397", 0, "mem_used_mb"),
    (_310P, "| 0            1397", "0", 0, "util_pct"),
]
GARBAGE = st.text(
    alphabet=st.characters(blacklist_categories=("Nd", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=6
).filter(lambda s: "|" not in s and "/" not in s)


@settings(max_examples=60, deadline=None)
@given(garbage=GARBAGE)
@pytest.mark.parametrize("name, text, reading, minor, field", READINGS)
def test_a_garbage_reading_is_none(name, text, reading, minor, field, garbage):
    data = (FIX / name).read_text(encoding="utf-8")
    assert data.count(text) == 1
    assert value_at(device_of(data, minor), field) is not None  # the real reading is read
    mutant = data.replace(text, text.replace(reading, garbage, 1))
    d = device_of(mutant, minor)
    assert d is None or value_at(d, field) is None, (garbage, d and value_at(d, field))


def device_of(text: str, minor: int) -> dict | None:
    return next((d for d in ascendparse.parse_npu_smi_info(text)["devices"] if d["minor"] == minor), None)


def value_at(d: dict, path: str):
    for part in path.split("."):
        d = d[int(part)] if isinstance(d, list) else d[part]
    return d
