"""Byte-level fuzzing of every AMD parser (hw/amdparse.py, hw/rocmparse.py) and of what the amdsmi library can
hand back (hw/amd.py): nothing raises, every device keeps the section's shape with values of their types and
ranges, and a value whose text is garbage is None (unmeasured), never a number made up from it.

Inputs: every capture of tests/fixtures/accel/amd with bits flipped, bytes inserted, cut at every point, and
random bytes; then each capture with one reading replaced by digit-free garbage."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import fakeamdsmi as fake
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.hw import amd, amdparse, rocmparse
from slurm_tune.hw.accel import utilization_from_section
from slurm_tune.hw.amdvalues import blank_device

FIX = Path(__file__).parent / "fixtures" / "accel" / "amd"
NAMES = sorted(p.name for p in FIX.glob("*.txt"))
PARSERS = [
    amdparse.parse_any,
    amdparse.parse_amdsmi_text,
    amdparse.parse_amdsmi_json,
    amdparse.parse_amdsmi_table,
    rocmparse.parse_rocm_smi,
    rocmparse.parse_rocminfo,
]
FAST = settings(max_examples=400, deadline=None)
KEYS = set(blank_device(0))
RANGES = {  # field -> (low, high) of a value that is not None
    "power_w": (0, 10000),
    "power_limit_w": (0, 10000),
    "temperature_c": (-50, 200),
    "util_pct": (0, 100),
    "mem_util_pct": (0, 100),
    "mem_used_mb": (0, 2**30),
    "mem_total_mb": (0, 2**30),
}


def check_device(d: dict) -> None:
    assert set(d) == KEYS
    assert type(d["index"]) is int and d["index"] >= 0 and d["chip"] == 0
    assert d["minor"] is None or (type(d["minor"]) is int and d["minor"] >= 0)
    for key in ("name", "bus_id", "serial"):
        assert d[key] is None or (isinstance(d[key], str) and d[key].isprintable() and 0 < len(d[key]) <= 256)
    for key, (low, high) in RANGES.items():
        v = d[key]
        assert v is None or (type(v) is float and math.isfinite(v) and low <= v <= high), (key, v)
    assert set(d["ecc"]) == {"uncorrected", "corrected"}
    assert all(v is None or (type(v) is int and v >= 0) for v in d["ecc"].values())
    assert set(d["pcie"]) == {"width", "max_width", "gen", "max_gen"}
    for key in ("width", "max_width"):
        assert d["pcie"][key] is None or 1 <= d["pcie"][key] <= 64
    for key in ("gen", "max_gen"):
        assert d["pcie"][key] is None or 1 <= d["pcie"][key] <= 7
    assert all(set(link) == {"link", "kind", "up"} and link["kind"] == "xgmi" for link in d["links"])
    assert d["processes"] is None or all(type(p["pid"]) is int for p in d["processes"])
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in d["firmware"].items())
    assert all(isinstance(k, str) and isinstance(v, str) and "\n" not in v for k, v in d["errors"].items())


def check_parsed(parsed: dict) -> None:
    assert set(parsed) == {"system", "devices"}
    for key, value in parsed["system"].items():
        assert value is None or isinstance(value, (str, dict)), key
    for d in parsed["devices"]:
        check_device(d)
    json.dumps(parsed)


def parse_all(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    for parser in PARSERS:
        check_parsed(parser(data if parser is amdparse.parse_any else text))
    section = amdparse.section([data, text])
    assert section["answered"] is bool(section["devices"])
    assert len({d["minor"] for d in section["devices"]}) <= len(section["devices"])
    utilization_from_section(section)


def mutants(data: bytes, rng: random.Random):
    for _ in range(40):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            mutant[rng.randrange(len(mutant))] ^= 1 << rng.randrange(8)
        yield bytes(mutant)
    for _ in range(20):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutant.insert(rng.randrange(len(mutant) + 1), rng.choice((0x00, 0xFF, 0x0A, 0x3A, 0x7B, 0x5B)))
        yield bytes(mutant)
    for i in range(0, len(data), 7):
        yield data[:i]
        yield data[i:]


@pytest.mark.parametrize("name", NAMES)
def test_every_capture_flipped_inserted_and_cut_never_raises(name):
    data = (FIX / name).read_bytes()
    rng = random.Random(name)
    n = 0
    for mutant in mutants(data, rng):
        parse_all(mutant)
        n += 1
    assert n > 60


@FAST
@given(data=st.binary(max_size=3000))
def test_random_bytes_never_raise(data):
    parse_all(data)


@FAST
@given(
    name=st.sampled_from(NAMES),
    edits=st.lists(st.tuples(st.integers(0, 4000), st.binary(max_size=12)), min_size=1, max_size=4),
)
def test_captures_with_random_bytes_spliced_in_never_raise(name, edits):
    data = bytearray((FIX / name).read_bytes())
    for at, piece in edits:
        at %= len(data) + 1
        data[at : at + len(piece) % 5] = piece
    parse_all(bytes(data))


LONG = {  # each took minutes before the parsers were made linear (a `^\s*` under re.M, a lazy `(.*?)\s*`)
    "blank lines": "\n" * 100000,
    "blank lines, then a header": "\n" * 50000 + "Device x",
    "a rocm-smi line of spaces": "GPU[0] : a: " + " " * 50000 + "x",
    "an amd-smi value of spaces": "GPU: 0\n    K: " + " " * 50000 + "x",
    "a wrapped value without end": "GPU: 0\n    A: x\n" + "        y\n" * 100000,
    "a header of parentheses": "Device " + "(" * 100000 + " GPU%",
    "a cut JSON document of many lines": '[\n{"gpu": 0,\n' + '"x": 1,\n' * 100000,
}


@pytest.mark.parametrize("what", sorted(LONG))
def test_long_pathological_outputs_are_read_in_linear_time(what):
    start = time.monotonic()
    for parser in PARSERS:
        check_parsed(parser(LONG[what]))
    assert time.monotonic() - start < 10, what


# (capture, the reading's text in it, device index, field): that text replaced by garbage makes the field None
READINGS = [
    ("amd-smi-metric-rdna-powerjoular67.txt", "SOCKET_POWER: 20 W", 0, "power_w"),
    ("amd-smi-metric-rdna-powerjoular67.txt", "GFX_ACTIVITY: 0 %", 0, "util_pct"),
    ("amd-smi-metric-rdna-powerjoular67.txt", "UMC_ACTIVITY: 1 %", 0, "mem_util_pct"),
    ("amd-smi-static-mi350x-rocmsystems2987.txt", "MAX_PCIE_WIDTH: 16", 0, "pcie.max_width"),
    ("amd-smi-default-table-strixhalo-amdsmi110.txt", "14 W", 0, "power_w"),
    ("amd-smi-default-table-strixhalo-amdsmi110.txt", "29 °C", 0, "temperature_c"),
    ("amd-smi-default-table-strixhalo-amdsmi110.txt", "3056/8192 MB", 0, "mem_used_mb"),
    ("rocm-smi-concise-mi350-dpx-rocmsystems1508.txt", "319.0W", 0, "power_w"),
    ("rocm-smi-concise-mi350-dpx-rocmsystems1508.txt", "60.0°C", 0, "temperature_c"),
]
GARBAGE = st.text(
    alphabet=st.characters(blacklist_categories=("Nd",), blacklist_characters="\r"), max_size=12
)


@settings(max_examples=60, deadline=None)
@given(garbage=GARBAGE)
@pytest.mark.parametrize("name, reading, index, field", READINGS)
def test_a_garbage_reading_is_none(name, reading, index, field, garbage):
    data = (FIX / name).read_text(encoding="utf-8")
    key, sep, _ = reading.rpartition(": ")
    assert data.count(reading) == 1
    assert getattr_path(device_of(data, index), field) is not None  # the real reading is read
    mutant = data.replace(reading, f"{key}{sep}{garbage}" if sep else garbage)
    d = device_of(mutant, index)
    assert d is None or getattr_path(d, field) is None, (garbage, d and getattr_path(d, field))


def device_of(data: str, index: int) -> dict | None:
    return next((d for d in amdparse.parse_any(data)["devices"] if d["index"] == index), None)


def getattr_path(d: dict, path: str):
    for part in path.split("."):
        d = d[part]
    return d


def test_the_json_capture_with_a_garbage_value_is_none():
    data = (FIX / "amd-smi-metric-usage-json-w7700-beszel737.txt").read_text(encoding="utf-8")
    for garbage in ('"42"x', "[42]", '{"value": "fourty"}', '"N/A"', "true", "-42", "1e400", '"42 MHz"'):
        mutant = data.replace('"value": 42,', f'"value": {garbage},')
        (d,) = amdparse.parse_amdsmi_json(mutant)["devices"] or [blank_device(0)]
        assert d["util_pct"] is None, garbage


# ---- what the library hands back ---------------------------------------------------------------------------

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.just(fake.NA),
    st.just(fake.UNSUPPORTED),
    st.lists(st.sampled_from(["U", "D", "X", "N/A", 3, None]), max_size=10),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
FIELDS = [k for k in fake.device(0) if k not in ("fail",)]


@settings(max_examples=300, deadline=None)
@given(values=st.dictionaries(st.sampled_from(FIELDS), ANY, max_size=8), lib=ANY, rocm=ANY)
def test_garbage_from_the_library_never_raises_and_stays_in_shape(values, lib, rocm):
    amdsmi = fake.FakeAmdSmi(
        [fake.device(0, **values), fake.device(1)], lib_version={"major": lib}, rocm_version=rocm
    )
    s = amd.capture(timeout_s=5, amdsmi_module=amdsmi)
    assert s["answered"] is True and len(s["devices"]) == 2, s.get("error")
    for d in s["devices"]:
        check_device(d)
    assert s["devices"][1]["errors"] == {} and s["devices"][1]["util_pct"] == 0.0  # the other GPU is whole
    json.dumps(s)
    utilization_from_section(s)
