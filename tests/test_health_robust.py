"""Issue 10, node health: a parse problem is unknown, never fail - each class of garbage with its own
property test (thousands of generated sysfs values), plus what an unknown must say and what K unknowns in a
row do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import healthkit as kit
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from slurm_tune.health import collect
from slurm_tune.health import judge as health_judge
from slurm_tune.health import node as health_node
from slurm_tune.health import state as health_state
from slurm_tune.health import versions as health_versions
from slurm_tune.health.result import DEGRADED, FAIL, OK, UNKNOWN, WARNING
from slurm_tune.hw import sysfs as hw_sysfs
from slurm_tune.profiles import parse_version

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
IB = "sys/class/infiniband"
MANY = settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def results(verdict) -> dict:
    return {(r.check, r.subject): r for r in verdict.results}


# ---- versions: fully well formed, or unknown ------------------------------------------------------------------

VALID = st.lists(st.integers(0, 10**9 - 1).map(str), min_size=1, max_size=8).map(".".join)
JUNK = st.sampled_from(
    ["\ufffd", "\xff", " ", "-", "_", "a", "..", ".", "\n", "\x00", "+", "v", "\u0663", "e"]
)


@st.composite
def near_versions(draw):
    """A valid version with garbage spliced in, dropped or doubled: the shape a flipped byte gives."""
    text = draw(VALID)
    at = draw(st.integers(0, len(text)))
    junk = draw(st.one_of(JUNK, st.text(max_size=3), st.just("9" * draw(st.integers(10, 6000)))))
    return text[:at] + junk + text[at:]


VERSION_TEXT = st.one_of(
    VALID,
    near_versions(),
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
)


@MANY
@given(VERSION_TEXT)
@example("20.31.10\ufffd14")
@example("20.31." + "9" * 5000)
def test_a_version_is_judged_only_when_fully_well_formed(text):
    """Unknown exactly when the text is not a well-formed version: garbage never reads as a lower version."""
    rule = kit.profile("hdr").versions.hca_firmware["MT_0000000223"]
    status, _ = health_versions.judge(text, rule)
    key = parse_version(text)
    if key is None:
        assert status == UNKNOWN
        assert (
            not text.strip(" \t\r\n").isascii()
            or not all(p.isdigit() and 0 < len(p) <= 9 for p in text.strip(" \t\r\n").split("."))
            or text.count(".") > 7
        )
    else:
        assert key == tuple(int(p) for p in text.strip().split("."))
        assert status == (OK if key >= (20, 31, 1014) else FAIL)


def test_vbios_versions_are_hex():
    assert parse_version("96.00.74.00.0D", hex_parts=True) == (0x96, 0, 0x74, 0, 0x0D)
    assert parse_version("96.00.74.00.0D") is None
    assert parse_version("96.00.74.00.0G", hex_parts=True) is None


def test_a_stray_byte_in_fw_ver_is_unknown_naming_the_file(tmp_path):
    root = kit.tree(tmp_path / "root", "hdr")
    (root / IB / "mlx5_4/fw_ver").write_bytes(b"20.31.10\xff14\n")
    verdict, _ = health_judge.judge(kit.take(root, "hdr"), kit.profile("hdr"), {})
    r = results(verdict)[("versions.hca_firmware", "mlx5_4")]
    assert verdict.status == UNKNOWN and r.status == UNKNOWN
    assert f"{IB}/mlx5_4/fw_ver" in r.message and "20.31.10\ufffd14" in r.message


def test_a_profile_version_must_be_well_formed(tmp_path):
    from slurm_tune.errors import ConfigError

    directory = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [('{min: "20.31.1014"}', '{min: "20.31.1014a"}')]}
    )
    with pytest.raises(
        ConfigError,
        match=r"hdr.yaml:\d+: versions.hca_firmware.MT_0000000223: '20.31.1014a' is "
        r"not a version",
    ):
        kit.profile("hdr", directory)


# ---- bounded numbers: a bad value affects only its own finding ----------------------------------------------


@MANY
@given(
    st.one_of(
        st.integers(0, 2**70).map(str),
        st.integers(21, 6000).map(lambda n: "9" * n),
        st.text(alphabet="0123456789+- \n\u0663x", max_size=30),
        st.binary(max_size=30).map(lambda b: b.decode("utf-8", "replace")),
    )
)
def test_a_counter_is_a_64_bit_number_or_unreadable(text):
    value = hw_sysfs.parse_counter(text)
    assert value is None or (0 <= value < 2**64 and str(value) == text.strip().lstrip("0").rjust(1, "0"))
    if (
        text.strip().isascii()
        and text.strip().isdigit()
        and len(text.strip()) <= 20
        and int(text.strip()) < 2**64
    ):
        assert value == int(text.strip())


@pytest.fixture(scope="module")
def down_tree(tmp_path_factory):
    """A DGX-A100 tree whose mlx5_3 port is really DOWN, its state after a clean run (baselines taken), and the
    files of the other HCAs that a parser reads."""
    root = kit.tree(tmp_path_factory.mktemp("down") / "root", "hdr")
    profile = kit.profile("hdr")
    state: dict = {}
    health_judge.merge_state(
        state, health_judge.judge(kit.take(root, "hdr"), profile, {})[1], rebaseline=True
    )
    (root / IB / "mlx5_3/ports/1/state").write_text("1: DOWN\n")
    (root / IB / "mlx5_3/ports/1/phys_state").write_text("3: Disabled\n")
    files = sorted(
        str(p.relative_to(root))
        for p in (root / IB).rglob("*")
        if p.is_file() and "mlx5_3" not in str(p) and p.name != "node_guid"
    )
    clean = results(
        health_judge.judge(collect.fast(str(root), profile, "n1", state.get("gpu_pci")), profile, state)[0]
    )
    return root, profile, state, files, clean


GARBAGE_BYTES = st.one_of(
    st.binary(max_size=40),
    st.integers(21, 6000).map(lambda n: b"9" * n),
    st.integers(2**64, 2**80).map(lambda n: str(n).encode()),
    st.sampled_from([b"", b"-1", b"1e9", b"\xff", b"4: ACTIV\xc3", b"200 Gb/sec", b"0x10"]),
)


@MANY
@given(data=st.data(), garbage=GARBAGE_BYTES)
def test_garbage_in_one_hca_never_hides_a_down_port_on_another(down_tree, data, garbage):
    root, profile, state, files, clean = down_tree
    rel = data.draw(st.sampled_from(files))
    device = rel.split("/")[3]
    text = garbage.decode("utf-8", "replace").strip()
    name = Path(rel).name
    assume(not (name == "state" and text in ("1: DOWN", "2: INIT", "3: ARMED", "0: NOP")))
    assume(not (name == "phys_state" and text[:2] in ("1:", "2:", "3:", "4:", "6:", "7:")))
    assume(not (name == "link_layer" and text == "Ethernet"))
    assume(not (name == "rate" and hw_sysfs.parse_rate_gbps(text) is not None))
    assume(not (name == "fw_ver" and parse_version(text) is not None))
    assume(not (name in hw_sysfs.IB_ERROR_COUNTERS and hw_sysfs.parse_counter(text) is not None))
    original = (root / rel).read_bytes()
    (root / rel).write_bytes(garbage)
    try:
        got = results(
            health_judge.judge(collect.fast(str(root), profile, "n1", state.get("gpu_pci")), profile, state)[
                0
            ]
        )
    finally:
        (root / rel).write_bytes(original)
    assert got[("ib.link", "mlx5_3/1")].status == FAIL  # the real failure stays visible
    assert not [r for r in got.values() if r.status == FAIL and r.subject != "mlx5_3/1"], garbage
    for key, r in got.items():  # only the garbled HCA's own findings may change
        if not key[1].startswith(device + "/") and key[1] != device:
            assert r == clean[key], (rel, garbage, r)


def test_a_5000_digit_counter_is_one_unknown_and_the_down_port_still_fails(down_tree):
    root, profile, state, _, _ = down_tree
    path = root / IB / "mlx5_0/ports/1/counters/symbol_error"
    original = path.read_bytes()
    path.write_text("9" * 5000 + "\n")
    try:
        verdict = health_judge.judge(
            collect.fast(str(root), profile, "n1", state.get("gpu_pci")), profile, state
        )[0]
    finally:
        path.write_bytes(original)
    got = results(verdict)
    assert verdict.status == FAIL and verdict.reason == "mlx5_3/1 state DOWN"
    assert got[("ib.counters", "mlx5_0/1")].status == UNKNOWN
    assert not [r for r in verdict.results if r.check.endswith(".internal")]


def test_a_5000_digit_xid_record_is_skipped():
    from slurm_tune.hw.kernellog import parse_xid_record

    assert parse_xid_record("4," + "9" * 5000 + ",1,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1") is None
    assert parse_xid_record("4,1,1,-;NVRM: Xid (PCI:0000:07:00): " + "9" * 5000 + ", pid=1") is None
    assert parse_xid_record("4,12,34,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1")["xid"] == 79


# ---- firmware rules: board_id, PSID patterns, and HCAs no rule matches ---------------------------------------


def fw_profile(tmp_path, rules: str):
    directory = kit.profile_dir(
        tmp_path / "p",
        {
            "hdr.yaml": [
                (
                    '    MT_0000000223: {min: "20.31.1014"}     # ConnectX-6 VPI HDR200 (MCX653105A-HDAT)',
                    rules,
                )
            ]
        },
    )
    return kit.profile("hdr", directory)


@MANY
@given(
    st.one_of(
        st.text(max_size=20),
        st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
        st.sampled_from(["MT_0000000223", "DEL0000000010", "MT_00000002\u0663", "", " MT_0000000223"]),
    )
)
def test_a_garbled_board_id_is_unknown_never_ok_or_fail(board):
    rules = kit.profile("hdr").versions.hca_firmware
    key, problem = health_versions.match_rule(rules, board, "MT4123")
    if health_versions.well_formed_id(board):
        assert problem is None and key == ("MT_0000000223" if board == "MT_0000000223" else None)
    else:
        assert key is None and problem == f"unreadable board_id {board!r}"


def test_an_unreadable_board_id_is_unknown(tmp_path):
    root = kit.tree(tmp_path / "root", "hdr")
    (root / IB / "mlx5_5/board_id").write_bytes(b"MT_00\xff0000223\n")
    verdict, _ = health_judge.judge(kit.take(root, "hdr"), kit.profile("hdr"), {})
    r = results(verdict)[("versions.hca_firmware", "mlx5_5")]
    assert r.status == UNKNOWN and f"{IB}/mlx5_5/board_id" in r.message and verdict.status == UNKNOWN
    (root / IB / "mlx5_5/board_id").unlink()  # not there at all: unreadable too
    r = results(health_judge.judge(kit.take(root, "hdr"), kit.profile("hdr"), {})[0])[
        ("versions.hca_firmware", "mlx5_5")
    ]
    assert r.status == UNKNOWN and "unreadable board_id None" in r.message


def test_oem_psids_match_rules_by_pattern_and_unmatched_hcas_are_a_warning(tmp_path):
    profile = fw_profile(tmp_path, '    "DEL*": {min: "20.31.1014"}\n    MT4123: {min: "20.30.1000"}')
    root = kit.tree(
        tmp_path / "root",
        "hdr",
        hca_overrides={
            "mlx5_0": {
                "board_id": "DEL0000000010",
                "fw_ver": "20.28.1002",
            },  # OEM PSID below the pattern's rule
            "mlx5_1": {"board_id": "DEL0000000010", "fw_ver": "20.31.1014"},
            "mlx5_2": {"board_id": "HPE0000000027", "hca_type": "MT4129"},
        },
    )  # no rule for this board or model
    verdict, _ = health_judge.judge(kit.take(root, "hdr"), profile, {})
    got = results(verdict)
    assert got[("versions.hca_firmware", "mlx5_0")].status == FAIL
    assert "(rule DEL*)" in got[("versions.hca_firmware", "mlx5_0")].message
    assert got[("versions.hca_firmware", "mlx5_1")].status == OK
    assert got[("versions.hca_firmware", "mlx5_3")].status == OK  # MT_0000000223 falls to its model, MT4123
    warn = got[("versions.hca_firmware", "mlx5_2")]
    assert warn.status == WARNING and "no firmware rule matches this HCA" in warn.message
    (root / IB / "mlx5_0/fw_ver").write_text("20.31.1014\n")
    verdict, _ = health_judge.judge(kit.take(root, "hdr"), profile, {})
    assert verdict.status == OK  # a warning is about the policy: the node stays ok
    assert [r for r in verdict.results if r.status == WARNING] == [warn]


def test_the_warning_shows_in_check_and_in_the_runs_dry_run(tmp_path, monkeypatch):
    directory = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("MT_0000000223: {min", "MT_0000000999: {min")]}
    )
    root = kit.tree(tmp_path / "root", "hdr")
    snap = tmp_path / "snap.json"
    env = dict(
        os.environ,
        STUNE_PARTITIONS=str(directory),
        STUNE_SYSFS_ROOT=str(root),
        SLURMD_NODENAME="n7",
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
        STUNE_STATE_DIR=str(tmp_path / "st"),
        STUNE_HEALTH_PARTITION="hdr",
        SLURM_CONF="/nonexistent/slurm.conf",
    )
    subprocess.run(
        [str(BIN / "stune-health"), "capture", "-o", str(snap)], env=env, check=True, capture_output=True
    )
    out = subprocess.run(
        [str(BIN / "stune-health"), "check", "--snapshot", str(snap)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and ": OK" in out.stdout.splitlines()[0]
    assert (
        "warning  versions.hca_firmware  mlx5_0: fw 20.31.1014 on board MT_0000000223 (MT4123): no firmware "
        "rule matches this HCA" in out.stdout
    )
    dry = subprocess.run(
        [str(BIN / "stune-health"), "run", "--dry-run"], env=env, capture_output=True, text=True
    )
    assert "warning  versions.hca_firmware  mlx5_7: " in dry.stdout, dry.stdout + dry.stderr


# ---- missing and unreadable are different findings -----------------------------------------------------------


def breakers():
    def loop(path: Path):
        shutil.rmtree(path)
        path.symlink_to(path.name)  # points at itself: ELOOP

    def file_instead(path: Path):
        shutil.rmtree(path)
        path.write_text("not a directory\n")

    def dangling(path: Path):
        shutil.rmtree(path)
        path.symlink_to("/nonexistent/stune-test")

    return {"symlink loop": loop, "a file where a directory belongs": file_instead, "dangling link": dangling}


@pytest.mark.parametrize("how", list(breakers()))
@pytest.mark.parametrize(
    "where, check, subject",
    [
        (f"{IB}/mlx5_4", "ib.link", "mlx5_4/1"),
        (f"{IB}/mlx5_4/ports/1", "ib.link", "mlx5_4/1"),
        (f"{IB}/mlx5_4/ports", "ib.link", "mlx5_4/1"),
    ],
)
def test_an_entry_that_is_there_but_unreadable_is_unknown(tmp_path, how, where, check, subject):
    root = kit.tree(tmp_path / "root", "hdr")
    breakers()[how](root / where)
    profile = kit.profile("hdr")
    for snap in (collect.fast(str(root), profile, "n1"), kit.take(root, "hdr")):
        r = results(health_judge.judge(snap, profile, {})[0])[(check, subject)]
        assert r.status == UNKNOWN, (how, where, r)
        assert "mlx5_4" in r.message


def test_an_unreadable_netdev_is_unknown_and_a_missing_one_fails(tmp_path):
    root = kit.tree(tmp_path / "root", "roce")
    profile = kit.profile("roce")
    hca = profile.fabric.hcas[0]
    net = root / "sys/class/net" / hca.netdev
    real = net.resolve()
    net.unlink() if net.is_symlink() else shutil.rmtree(net)
    net.symlink_to(net.name)
    r = results(health_judge.judge(collect.fast(str(root), profile, "n1"), profile, {})[0])[
        ("ib.netdev", f"{hca.device}/1")
    ]
    assert r.status == UNKNOWN and "Too many levels of symbolic links" in r.message
    net.unlink()
    r = results(health_judge.judge(collect.fast(str(root), profile, "n1"), profile, {})[0])[
        ("ib.netdev", f"{hca.device}/1")
    ]
    assert r.status == FAIL and real


def test_a_missing_port_still_fails(tmp_path):
    root = kit.tree(tmp_path / "root", "hdr")
    shutil.rmtree(root / IB / "mlx5_4/ports/1")
    r = results(
        health_judge.judge(collect.fast(str(root), kit.profile("hdr"), "n1"), kit.profile("hdr"), {})[0]
    )
    assert r[("ib.link", "mlx5_4/1")].status == FAIL


# ---- an unknown says what could not be read, in every output -------------------------------------------------


def test_an_unknown_verdict_names_what_could_not_be_read(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    root = kit.tree(tmp_path / "root", "hdr")
    (root / IB / "mlx5_1/ports/1/state").write_bytes(b"4: ACT\xffVE\n")
    prom, js = tmp_path / "h.prom", tmp_path / "h.json"
    env = dict(
        os.environ,
        STUNE_SYSFS_ROOT=str(root),
        SLURMD_NODENAME="n7",
        STUNE_HEALTH_PARTITION="hdr",
        STUNE_STATE_DIR=str(tmp_path / "st"),
        STUNE_HEALTH_PROM=str(prom),
        STUNE_HEALTH_JSON=str(js),
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
    )
    proc = subprocess.run([str(BIN / "stune-health"), "epilog"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(js.read_text())
    assert doc["status"] == "unknown" and doc["reason"].startswith(
        "mlx5_1/1: unreadable state '4: ACT\ufffdVE'"
    )
    (status,) = {f.name: f for f in text_string_to_metric_families(prom.read_text())}[
        "stune_health_status"
    ].samples
    assert status.value == 1 and status.labels["reason"] == doc["reason"]
    snap = tmp_path / "snap.json"
    subprocess.run(
        [str(BIN / "stune-health"), "capture", "-o", str(snap)], env=env, check=True, capture_output=True
    )
    out = subprocess.run(
        [str(BIN / "stune-health"), "check", "--snapshot", str(snap)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 4 and out.stdout.splitlines()[0].endswith(": UNKNOWN - " + doc["reason"])
    assert "mlx5_1/1: unreadable state" in (tmp_path / "st" / "health.log").read_text()


# ---- K runs with the same unknown: degraded, and cleared when reads recover -----------------------------------


class FakeSlurm:
    """Enough of the adapter for the periodic run: one node, its updates recorded."""

    def __init__(self, name="n7"):
        self.name, self.calls, self.features, self.comment = name, [], set(), ""

    def nodes(self):
        return [_node(self.name, self.features, self.comment)]

    def update_node(self, name, **fields):
        self.calls.append(fields)
        if "features" in fields:
            self.features = set(fields["features"])
        if "comment" in fields:
            self.comment = fields["comment"]


def _node(name, features, comment):
    from types import SimpleNamespace

    return SimpleNamespace(
        name=name,
        drain=False,
        reason="",
        reason_time=0,
        partitions=["hdr"],
        feature_set=set(features),
        active_feature_set=set(features),
        comment=comment,
    )


def test_k_runs_with_the_same_unknown_mark_the_node_degraded_until_reads_recover(tmp_path, monkeypatch):
    root = kit.tree(tmp_path / "root", "hdr")
    for k, v in {
        "STUNE_SYSFS_ROOT": str(root),
        "SLURMD_NODENAME": "n7",
        "STUNE_HEALTH_PARTITION": "hdr",
        "STUNE_STATE_DIR": str(tmp_path / "st"),
        "STUNE_GPU_SNAPSHOT": str(kit.gpu_file(tmp_path / "gpus.json")),
    }.items():
        monkeypatch.setenv(k, v)
    slurm = FakeSlurm()
    counter = root / IB / "mlx5_6/ports/1/counters/link_downed"
    assert health_node.run(health_node.settings({}), slurm)[1]["status"] == OK
    counter.write_text("9" * 30 + "\n")  # garbage that stays: unknown, run after run
    calls = len(slurm.calls)
    for run in (1, 2):
        code, doc = health_node.run(health_node.settings({}), slurm)
        assert (code, doc["status"], doc["action"]) == (0, UNKNOWN, "hold") and len(slurm.calls) == calls
        assert health_state.read(str(tmp_path / "st"))[0]["unknown_runs"] == {"ib.counters mlx5_6/1": run}
    code, doc = health_node.run(health_node.settings({}), slurm)
    assert (doc["status"], doc["action"]) == (DEGRADED, "degraded")
    assert doc["reason"].startswith("mlx5_6/1 unknown for 3 runs: unreadable link_downed '999")
    assert slurm.features == {"stune_degraded"} and slurm.comment.startswith(
        "stune: degraded: mlx5_6/1 unknown for 3 runs"
    )
    assert not any(c.get("state") == "DRAIN" for c in slurm.calls)  # degraded, never drained
    counter.write_text("0\n")
    code, doc = health_node.run(health_node.settings({}), slurm)
    assert doc["status"] == OK and slurm.features == set() and slurm.comment == ""
    assert health_state.read(str(tmp_path / "st"))[0]["unknown_runs"] == {}


def test_unknown_degrade_after_zero_never_marks(tmp_path):
    profile = kit.profile(
        "hdr",
        kit.profile_dir(
            tmp_path / "p",
            {"site.yaml": [("probe_timeout_s: 5\n", "probe_timeout_s: 5\n    unknown_degrade_after: 0\n")]},
        ),
    )
    assert profile.health.unknown_degrade_after == 0
    from slurm_tune.health.result import make_verdict, unknown

    state: dict = {}
    for _ in range(10):
        verdict = health_judge.escalate_unknowns(
            make_verdict([unknown("ib.rate", "mlx5_0/1", "unreadable rate")]), state, 0
        )
    assert verdict.status == UNKNOWN and state["unknown_runs"] == {"ib.rate mlx5_0/1": 10}
    assert (
        health_judge.escalate_unknowns(make_verdict([unknown("ib.rate", "mlx5_0/1", "x")]), state, 3).status
        == DEGRADED
    )
    assert (
        health_judge.escalate_unknowns(make_verdict([unknown("ib.rate", "mlx5_1/1", "x")]), state, 3).status
        == UNKNOWN
    )


# ---- the epilog of a CPU partition never touches NVML --------------------------------------------------------


def test_the_epilog_of_a_partition_without_gpus_imports_no_pynvml(tmp_path):
    directory = kit.profile_dir(
        tmp_path / "p", {"hdr.yaml": [("count: 8", "count: 0"), ("model: A100-SXM4-80GB", "model: ~")]}
    )
    root = kit.tree(tmp_path / "root", "hdr")
    env = dict(
        os.environ,
        STUNE_PARTITIONS=str(directory),
        STUNE_SYSFS_ROOT=str(root),
        SLURMD_NODENAME="n7",
        STUNE_HEALTH_PARTITION="hdr",
        STUNE_STATE_DIR=str(tmp_path / "st"),
    )
    env.pop("STUNE_GPU_SNAPSHOT", None)
    code = (
        "import sys; from slurm_tune.cli.health import main; rc = main(['epilog']); "
        "print(rc, 'pynvml' in sys.modules, 'slurm_tune.hw.nvml' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr
    doc = (
        json.loads((tmp_path / "st" / "last-epilog.json").read_text())
        if (tmp_path / "st" / "last-epilog.json").exists()
        else None
    )
    assert doc is None or doc["status"] == OK


# ---- --help shows every option and the exit codes -------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["capture", "check", "prolog", "epilog", "run", "status", "clear", "xids"]
)
def test_each_command_help_lists_every_option_and_the_exit_codes(command):
    from slurm_tune.cli import health as cli_health

    proc = subprocess.run([str(BIN / "stune-health"), command, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: stune-health {command} [options]")
    for option in cli_health.allowed_options(
        command
    ):  # the shared spellings (-p, --json...) and stune-health's own
        assert f"  {option}" in proc.stdout or f", {option}" in proc.stdout, (
            f"{command} --help lacks {option}"
        )
    assert "\nexit status: " in proc.stdout


def test_clear_unknown_forgets_the_counts(tmp_path):
    state_dir = tmp_path / "st"
    with health_state.Locked(str(state_dir)) as st:
        st.state["unknown_runs"] = {"ib.counters mlx5_6/1": 2}
        st.save()
    proc = subprocess.run(
        [str(BIN / "stune-health"), "clear", "--unknown", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "cleared unknown" in proc.stdout
    assert health_state.read(str(state_dir))[0]["unknown_runs"] == {}


def test_a_bug_that_one_subjects_data_triggers_stays_that_subjects_finding(down_tree, monkeypatch):
    """Per port, per HCA and per GPU, not per family: a crash on mlx5_0's data must not hide mlx5_3 DOWN."""
    from slurm_tune.health import gpu as health_gpu
    from slurm_tune.health import ib as health_ib

    root, profile, state, _, _ = down_tree
    real_link, real_fw, real_gpu = health_ib._check_link, health_versions._one_hca, health_gpu._check_device

    def boom(real, when):
        def wrapped(*args, **kw):
            if when(*args):
                raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
            return real(*args, **kw)

        return wrapped

    monkeypatch.setattr(
        health_ib, "_check_link", boom(real_link, lambda port, subject, fabric: subject == "mlx5_0/1")
    )
    monkeypatch.setattr(
        health_versions, "_one_hca", boom(real_fw, lambda name, devices, rules: name == "mlx5_1")
    )
    monkeypatch.setattr(health_gpu, "_check_device", boom(real_gpu, lambda dev, pos, spec, health: pos == 2))
    snap = kit.take(root, "hdr")
    verdict = health_judge.judge(snap, profile, state)[0]
    got = results(verdict)
    assert verdict.status == FAIL and verdict.reason == "mlx5_3/1 state DOWN"
    assert got[("ib.internal", "mlx5_0/1")].status == UNKNOWN
    assert got[("versions.internal", "mlx5_1")].status == UNKNOWN
    assert got[("gpu.internal", "gpu2")].status == UNKNOWN
    assert got[("ib.link", "mlx5_1/1")].status == OK and got[("versions.hca_firmware", "mlx5_0")].status == OK
    assert sum(1 for k in got if k[0] == "gpu.ecc") == 7  # the other seven GPUs are still judged
