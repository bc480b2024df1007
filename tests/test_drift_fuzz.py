"""Byte-level fuzzing of every drift parser (hw/driftparse.py, hw/pciconfig.py) and of every file the drift
capture reads in a DGX-A100 tree: no exception, never a failure, and garbage is never a drift (unknown,
unless the bytes happen to spell a real value). PCI config space is fuzzed as whole random files and as real
ones with bytes flipped."""

from __future__ import annotations

import drifttrees as dt
import healthkit as kit
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.health import collect
from slurm_tune.health import judge as health_judge
from slurm_tune.health.result import DEGRADED, FAIL
from slurm_tune.hw import driftparse as parse
from slurm_tune.hw import pciconfig

TEXT = st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace"))
FAST = settings(max_examples=600, deadline=None)


def _real_text_mutations():
    """Real file contents with a few characters replaced, inserted or cut: close to what a parser accepts."""
    real = [
        dt.modules_text(),
        dt.limits_text(),
        dt.limits_text("65536", "65536"),
        "always [madvise] never",
        "0",
    ]
    return st.tuples(st.sampled_from(real), st.lists(st.tuples(st.integers(0, 2000), TEXT), max_size=3)).map(
        lambda t: _mutate(t[0], t[1])
    )


def _mutate(text: str, edits) -> str:
    for at, piece in edits:
        at %= len(text) + 1
        text = text[:at] + piece[:4] + text[at + len(piece) % 3 :]
    return text


@FAST
@given(text=st.one_of(TEXT, _real_text_mutations()))
def test_the_text_parsers_never_raise_and_answer_in_their_types(text):
    modules = parse.parse_modules(text)
    assert isinstance(modules[0], dict) and isinstance(modules[1], int)
    assert all(state in parse.MODULE_STATES for state in modules[0].values())
    name, problem = parse.loaded_gdr_module(text)
    assert name in (None, *parse.GDR_MODULES) and (problem is None or isinstance(problem, str))
    assert not (name and problem)
    limit = parse.parse_memlock(text)
    assert limit is None or all(v == parse.UNLIMITED or (type(v) is int and 0 <= v < 1 << 70) for v in limit)
    assert parse.parse_thp(text) in (None, *parse.THP_MODES)
    governor = parse.parse_governor(text)
    assert governor is None or (governor.isascii() and len(governor) <= parse.GOVERNOR_MAX)
    small = parse.parse_small_int(text, 3)
    assert small is None or 0 <= small <= 3
    for expected in (">=67108864", "4096 87380 6291456", "1"):
        assert parse.sysctl_matches(text, expected) in (None, True, False)
    assert parse.cmdline_passthrough(text) in (None, True, False)


@FAST
@given(data=st.binary(max_size=4200))
def test_random_config_space_never_raises(data):
    check_acs(pciconfig.parse_acs(data))


def check_acs(found: dict) -> None:
    assert set(found) == {"size", "acs", "problem"}
    acs = found["acs"]
    if acs is not None:
        assert found["problem"] is None
        assert 0x100 <= acs["offset"] <= 0xFFC and acs["offset"] % 4 == 0
        assert 0 <= acs["cap"] <= 0xFFFF and 0 <= acs["ctrl"] <= 0xFFFF


@FAST
@given(
    ctrl=st.integers(0, 0xFFFF),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 4096),
)
def test_real_config_space_with_bytes_flipped_or_cut_never_raises(ctrl, flips, cut):
    data = bytearray(dt.bridge_config(ctrl))
    assert pciconfig.parse_acs(bytes(data))["acs"]["ctrl"] == ctrl  # the real one reads back exactly
    for at, value in flips:
        data[at] = value
    check_acs(pciconfig.parse_acs(bytes(data[:cut])))


@FAST
@given(
    parts=st.lists(
        st.one_of(TEXT, st.sampled_from(["pci0000:00", "0000:00:01.1", "0000:07:00.0"])), max_size=8
    )
)
def test_device_paths_never_raise(parts):
    chain, why = pciconfig.split_device_path(parts)
    assert (chain is None) != (why is None)
    if chain:
        assert all(pciconfig.is_pci_address(c) for c in chain)
    for p in parts:
        assert pciconfig.is_pci_address(p) in (True, False) and pciconfig.is_host_bridge(p) in (True, False)


# ---- garbage in the files of a node ------------------------------------------------------------------------


def _is_real(setting: str, data: bytes) -> bool:
    """Whether these bytes spell a real value of the setting (then a drift is a drift, not garbage)."""
    text = data.decode("utf-8", "replace").strip()
    if setting == "pcie_acs":
        return pciconfig.parse_acs(data)["problem"] is None
    return {
        "gdr_module": lambda: parse.loaded_gdr_module(text)[1] is None,
        "thp": lambda: parse.parse_thp(text) is not None,
        "numa_balancing": lambda: parse.parse_small_int(text, 3) is not None,
        "cpu_governor": lambda: parse.parse_governor(text) is not None,
        "slurmd_memlock": lambda: parse.parse_memlock(text) is not None,
        "iommu": lambda: text in ("identity", "DMA", "DMA-FQ", "unmanaged", "blocked"),
        "sysctl": lambda: parse.sysctl_matches(text, ">=1000") is not None,
        "roce_mtu": lambda: True,
    }[setting]()


FILES = {
    "proc/modules": "gdr_module",
    "sys/kernel/mm/transparent_hugepage/enabled": "thp",
    "proc/sys/kernel/numa_balancing": "numa_balancing",
    "sys/devices/system/cpu/cpufreq/policy3/scaling_governor": "cpu_governor",
    f"proc/{dt.SLURMD_PID}/limits": "slurmd_memlock",
    "sys/kernel/iommu_groups/5/type": "iommu",
    "proc/sys/net/core/netdev_max_backlog": "sysctl",
    "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/config": "pcie_acs",
    "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:01.0/config": "pcie_acs",
    "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:07:00.0/config": "pcie_acs",
    # any bytes can be a process's name, so a garbled comm cannot be told from another process: never a
    # failure, but not asserted to be unknown
    f"proc/{dt.SLURMD_PID}/comm": None,
    f"proc/{dt.FABRICMANAGER_PID}/comm": None,
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drift-fuzz")
    root = kit.tree(tmp / "root", "hdr")
    dt.iommu_group(root, "0000:07:00.0", 5, "identity")
    profiles = kit.profile_dir(
        tmp / "p",
        {"hdr.yaml": [("cache:\n", "drift:\n  sysctls: {net.core.netdev_max_backlog: '>=1000'}\ncache:\n")]},
    )
    profile = kit.profile("hdr", profiles)
    gpus = str(kit.gpu_file(tmp / "gpus.json"))
    snap = collect.full(str(root), profile, "n1", gpus, drift=True)
    assert health_judge.judge(snap, profile, {})[0].status == "ok"
    for rel in FILES:
        assert (root / rel).is_file(), rel
    return root, profile, gpus


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), garbage=st.one_of(st.binary(max_size=80), st.binary(min_size=256, max_size=4096)))
def test_garbage_in_any_drift_file_is_never_a_failure_nor_a_false_drift(tuned, data, garbage):
    root, profile, gpus = tuned
    rel = data.draw(st.sampled_from(sorted(FILES)))
    setting = FILES[rel]
    original = (root / rel).read_bytes()
    (root / rel).write_bytes(garbage)
    try:
        snap = collect.full(str(root), profile, "n1", gpus, drift=True)
        verdict, _ = health_judge.judge(snap, profile, {})
    finally:
        (root / rel).write_bytes(original)
    assert not [r.line() for r in verdict.results if r.status == FAIL]
    if setting is not None and not _is_real(setting, garbage):
        false = [r.line() for r in verdict.results if r.check == f"drift.{setting}" and r.status == DEGRADED]
        assert not false, f"{rel} = {garbage[:40]!r} made {false}"
    others = [r for r in verdict.results if r.status == DEGRADED and r.check != f"drift.{setting}"]
    assert not others or setting is None, [r.line() for r in others]  # one file, one setting
