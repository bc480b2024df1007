"""Fuzzing the accel family (health/accel.py, acceldevice.py, accelports.py): garbage is unknown, never fail.

Two levels, as the house style has it: whole JSON values (hypothesis' nested garbage) put in place of any field
of a healthy Ascend or AMD section, and byte-level mutations of a healthy snapshot file's JSON. Nothing raises
(a caught internal error would show as an `*.internal` finding), and every failure is backed by evidence in
the (mutated) snapshot itself, in the exact form the backends write: a port's link "DOWN", a health state
"Alarm" or "Critical", an int of uncorrectable errors above 0, an XGMI link with up false, a text name not
the profile's model, fewer device entries than gpu.count, a port whose `ip` is null, a device gone from the
bus or the bus's ids spelling another device. Bytes can spell such a value (a flipped digit); garbage that
spells none can never fail a node. A mutation in one device leaves every other device's findings as they were.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_accel_checks import amd_section, ascend_section, pci_view, profile_dir, snap
from test_active_parse import mutate

from slurm_tune import fastjson
from slurm_tune.health import judge
from slurm_tune.health.accel import vendor_id
from slurm_tune.health.acceldevice import HEALTH_FAIL, bus_address, name_of
from slurm_tune.health.result import FAIL
from slurm_tune.profiles import load_profile
from slurm_tune.vendors import HCCN_NET_HEALTH, NET_HEALTH_OK

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DEVICE_CHECKS = ("accel.model", "accel.health", "accel.ecc", "accel.thermal", "accel.power", "accel.pcie")
DEVICE_CHECKS += ("accel.xgmi", "accel.device", "accel.internal")
MODEL = {"ascend": "910b", "amd": "mi300x"}
NPU_ADDRS = [f"0000:{0xC1 + i:02x}:00.0" for i in range(8)]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """The ascend and amd profiles (the strict ones: Warning, net_health and XGMI fail too)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUNE_CACHE_DIR", str(tmp / "cache"))
        strict = "accel: {health_warning: fail, hccn: {net_health: fail}}\n"
        directory = profile_dir(tmp, asc=strict, mi="accel: {links_down: fail, max_power_w: 700}\n")
        yield {"ascend": load_profile("asc", str(directory)), "amd": load_profile("mi", str(directory))}


GARBAGE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["UP", "DOWN", "OK", "Warning", "Alarm", "Critical", "Success", "Fault", "0x19e5", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def fail_is_backed(r, snapshot: dict, vendor: str) -> bool:
    """Whether a failure finding has its evidence in the snapshot, in the backends' exact form."""
    section = snapshot.get("accel") if isinstance(snapshot.get("accel"), dict) else {}
    devices = section.get("devices") if isinstance(section.get("devices"), list) else []
    named = {name_of(d, pos, vendor): d for pos, d in enumerate(devices)}
    dev = named.get(r.subject.split()[0])
    dev = dev if isinstance(dev, dict) else {}
    ports = section.get("ports") if isinstance(section.get("ports"), dict) else {}
    port = ports.get(r.subject.split()[0][3:]) if r.subject.endswith(" port") else None
    port = port if isinstance(port, dict) else {}
    ecc = dev.get("ecc") if isinstance(dev.get("ecc"), dict) else {}
    links = dev.get("links") if isinstance(dev.get("links"), list) else []
    name = dev.get("name")
    backed = {
        "accel.count": lambda: len(devices) < 8,
        "accel.model": lambda: isinstance(name, str) and MODEL[vendor] not in name.lower(),
        "accel.health": lambda: dev.get("health") in (*HEALTH_FAIL, "Warning"),
        "accel.ecc": lambda: type(ecc.get("uncorrected")) is int and ecc["uncorrected"] > 0,
        "accel.xgmi": lambda: any(isinstance(k, dict) and k.get("up") is False for k in links),
        "accel.hccn_link": lambda: port.get("link") == "DOWN",
        "accel.hccn_health": lambda: (
            port.get("net_health") in HCCN_NET_HEALTH and port.get("net_health") != NET_HEALTH_OK
        ),
        "accel.hccn_ip": lambda: "ip" in port and port["ip"] is None,
        "accel.backend": lambda: section.get("answered") is False,
        "accel.pci": lambda: bus_backs_a_failure(snapshot, vendor),
    }
    return r.check in backed and backed[r.check]()


def bus_backs_a_failure(snapshot: dict, vendor: str) -> bool:
    """A device a full check listed (the section's `known`, or the backend's listing in the same snapshot) that
    is gone from the bus or carries another vendor's readable id."""
    section = snapshot.get("pci_accel")
    devices = section.get("devices") if isinstance(section, dict) else None
    if not isinstance(devices, dict):
        return False
    known = section.get("known") if isinstance(section.get("known"), list) else []
    accel = snapshot.get("accel") if isinstance(snapshot.get("accel"), dict) else {}
    listed = accel.get("devices") if isinstance(accel.get("devices"), list) else []
    known = [*known, *(bus_address(d.get("bus_id")) for d in listed if isinstance(d, dict))]
    for address in known:
        dev = devices.get(address) if isinstance(address, str) else None
        if isinstance(dev, dict) and dev.get("present") is False:
            return True
        if (
            isinstance(dev, dict)
            and dev.get("present") is True
            and vendor_id(dev.get("vendor"), vendor) is False
        ):
            return True
    return False


def judged(snapshot: dict, profile):
    verdict, _ = judge.judge(snapshot, profile, {})
    internal = [r.line() for r in verdict.results if r.check.endswith(".internal")]
    assert not internal, internal
    return verdict


def assert_fails_backed(verdict, snapshot: dict, vendor: str) -> None:
    unbacked = [
        r.line() for r in verdict.results if r.status == FAIL and not fail_is_backed(r, snapshot, vendor)
    ]
    assert not unbacked, unbacked


def healthy(vendor: str) -> dict:
    if vendor == "ascend":
        return snap(ascend_section(), pci_view("ascend", NPU_ADDRS, known=NPU_ADDRS))
    section = amd_section()
    addresses = [d["bus_id"] for d in section["devices"]]
    return snap(section, pci_view("amd", addresses, known=addresses))


def paths(section: dict) -> list[tuple]:
    """Every place in a section garbage can go: each key, nested ones too, and each whole entry."""
    out: list[tuple] = [(k,) for k in section]
    for i, dev in enumerate(section["devices"]):
        out.append(("devices", i))
        for key, value in dev.items():
            out.append(("devices", i, key))
            if isinstance(value, dict):
                out += [("devices", i, key, k) for k in value]
            if key == "links":
                out += [("devices", i, "links", n, k) for n in range(len(value)) for k in ("link", "up")]
    for n, port in section.get("ports", {}).items():
        out.append(("ports", n))
        out += [("ports", n, k) for k in port]
    out += [("system", k) for k in section["system"]]
    return out


def put(doc, path: tuple, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@pytest.mark.parametrize("vendor", ["ascend", "amd"])
def test_the_healthy_snapshots_are_ok(profiles, vendor):
    verdict = judged(healthy(vendor), profiles[vendor])
    assert verdict.status == "ok", [r.line() for r in verdict.results if r.status != "ok"]


@pytest.mark.parametrize("vendor", ["ascend", "amd"])
@FAST
@given(data=st.data())
def test_garbage_in_any_field_never_fails_unbacked_and_stays_in_its_device(profiles, vendor, data):
    base = healthy(vendor)
    where = data.draw(st.sampled_from(paths(base["accel"])))
    value = data.draw(GARBAGE)
    doc = copy.deepcopy(base)
    put(doc["accel"], where, value)
    verdict = judged(doc, profiles[vendor])
    assert_fails_backed(verdict, doc, vendor)
    if where[0] == "devices" and len(where) >= 2:
        devices = doc["accel"]["devices"]
        names = [name_of(d, pos, vendor) for pos, d in enumerate(devices)]
        changed = names[where[1]]
        if names.count(changed) == 1:
            before = judged(base, profiles[vendor])

            def others(v):
                return sorted(
                    (r.check, r.subject, r.status, r.message)
                    for r in v.results
                    if r.check in DEVICE_CHECKS and r.subject.split()[0] in set(names) - {changed}
                )

            assert others(verdict) == others(before)


@pytest.mark.parametrize("vendor", ["ascend", "amd"])
@FAST
@given(data=st.data())
def test_byte_level_mutations_of_a_snapshot_file(profiles, vendor, data):
    base = healthy(vendor)
    ours = {k: base.pop(k) for k in ("accel", "pci_accel")}  # the other sections are other families' to fuzz
    damaged = mutate(data, json.dumps(ours, indent=1).encode())
    try:
        doc = fastjson.loads(damaged.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return  # hw/snapshot.load names the file and line: a clear error, not a verdict
    if not isinstance(doc, dict):
        return
    doc = {**base, **doc}
    assert_fails_backed(judged(doc, profiles[vendor]), doc, vendor)


@FAST
@given(
    vendor_id=st.one_of(st.text(max_size=10), st.sampled_from(["0x19e5", "0x1002", "0x10de"])),
    device=st.one_of(st.text(max_size=10), st.sampled_from(["0xd802", "0xd500", "0x1822"])),
    cls=st.one_of(st.text(max_size=10), st.sampled_from(["0x120000", "0x038000", "0x040300"])),
    which=st.integers(0, 7),
)
def test_garbled_bus_ids_are_unknown_unless_they_spell_another_device(
    profiles, vendor_id, device, cls, which
):
    for vendor in ("ascend", "amd"):
        doc = healthy(vendor)
        address = sorted(doc["pci_accel"]["devices"])[which]
        doc["pci_accel"]["devices"][address].update(vendor=vendor_id, device=device, **{"class": cls})
        verdict = judged(doc, profiles[vendor])
        assert_fails_backed(verdict, doc, vendor)
