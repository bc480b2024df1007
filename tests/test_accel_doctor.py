"""stune-admin doctor on AMD and Ascend partitions (issue 26), from captures built here by hand (the `accel`
section's format: hw/accel.py): the devices the nodes have against the profile's accelerator and gpu.count,
gres.conf against those devices, and the version matrix per vendor (a node whose CANN differs is named)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_admin_doctor import FakeCluster, node

from slurm_tune.admin import doctor, doctor_nodes
from slurm_tune.admin.doctor_accel import accel_facts
from slurm_tune.admin.doctor_gres import file_kind, read_gres_conf
from slurm_tune.admin.install import Layout
from slurm_tune.admin.slurmconf import SlurmConf
from slurm_tune.profiles import validate_directory

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"


def ascend(n=8, driver="24.1.rc2", firmware="7.5.0.1.129", cann="8.0.RC3", **system):
    return accel_snapshot(
        "ascend",
        [{"index": i, "chip": 0, "minor": i, "name": "910B3", "health": "OK"} for i in range(n)],
        dict(
            driver_version=driver, firmware_version=firmware, cann_version=cann, rocm_version=None, **system
        ),
    )


def amd(n=8, rocm="6.2.0", driver="6.8.5", minors=None):
    devices = [
        {"index": i, "chip": 0, "minor": m, "name": "AMD Instinct MI300X", "health": None}
        for i, m in enumerate(minors if minors is not None else range(n))
    ]
    return accel_snapshot(
        "amd", devices, {"driver_version": driver, "firmware_version": None, "rocm_version": rocm}
    )


def accel_snapshot(vendor, devices, system, answered=True):
    return {
        "node": "x",
        "kernel": {"release": "5.10.0-182"},
        "ib": {"answered": True, "devices": {}},
        "gpus": {"answered": False, "devices": [], "error": "not captured"},
        "accel": {
            "answered": answered,
            "vendor": vendor,
            "source": "replay",
            "elapsed_s": 0.1,
            "system": dict(system, tool_version=None, errors={}),
            "devices": devices if answered else [],
            **({} if answered else {"error": "npu-smi: timed out after 5 s"}),
        },
    }


def nvidia():
    return json.loads((SNAPSHOTS / "vpc-a10g.json").read_text())


def setup(tmp_path, profile: str, snaps: dict, gres="npu:8", conf="GresTypes=gpu,npu\n", gres_conf=None):
    """A Doctor with the captures `snaps` (node -> snapshot) as --facts, the profile `profile`, slurm.conf
    `conf` and gres.conf `gres_conf` (None: none) beside it, and nodes of partition p with GRES `gres`."""
    facts = tmp_path / "facts"
    facts.mkdir(parents=True)
    for name, snap in snaps.items():
        (facts / f"{name}.json").write_text(json.dumps(snap))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text(
        "partition: p\nfabric: {type: tcp, socket_ifname: eth0}\n" + profile
    )
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(conf)
    if gres_conf is not None:
        (etc / "gres.conf").write_text(gres_conf)
    profiles = validate_directory(str(tmp_path / "profiles"))
    nodes = [node(name, ["p"], gres=gres) for name in snaps]
    doc = doctor.Doctor(
        "/nonexistent",
        Layout(prefix=str(tmp_path)),
        str(facts),
        FakeCluster([SimpleNamespace(name="p")], nodes),
    )
    return doc, profiles, nodes, SlurmConf(str(etc / "slurm.conf"))


def run_checks(doc, profiles, nodes, conf) -> list[str]:
    doc.check_cluster(profiles)
    doc.check_nodes(nodes)
    doc.check_accel(profiles, nodes, conf)
    return [f.line() for f in doc.findings]


ASCEND = "accelerator: ascend\ngpu: {count: 8}\n"
AMD = "accelerator: amd\ngpu: {count: 8}\n"
GOOD_NPU = "NodeName=n[1-3] Name=npu File=/dev/davinci[0-7]\n"


# ---- the version matrix -------------------------------------------------------------------------------------
def test_a_node_whose_cann_differs_from_its_partitions_is_named(tmp_path):
    """The issue's done-when: doctor flags a node whose CANN version differs from its partition's."""
    snaps = {"n1": ascend(), "n2": ascend(cann="8.0.RC2"), "n3": ascend()}
    lines = run_checks(*setup(tmp_path, ASCEND, snaps, gres_conf=GOOD_NPU))
    assert (
        "error   partition p: mixed CANN: 8.0.RC2 on n2, 8.0.RC3 on n[1,3]  -> one CANN per partition: "
        "upgrade or move n2 (driver, firmware and CANN/ROCm are validated together)" in lines
    ), lines
    assert not any("homogeneous" in line for line in lines)
    assert not any(line.startswith("error") and "CANN" not in line for line in lines), lines


def test_every_part_of_the_ascend_matrix_is_compared_and_frameworks_warn(tmp_path):
    snaps = {
        "n1": ascend(torch_npu_version="2.1.0.post6"),
        "n2": ascend(driver="24.1.rc3", firmware="7.5.0.2.220", torch_npu_version="2.1.0.post8"),
        "n3": ascend(torch_npu_version="2.1.0.post6"),
        "n4": ascend(driver="24.1.rc3"),
    }
    lines = run_checks(*setup(tmp_path, ASCEND, snaps, gres_conf="Name=npu File=/dev/davinci[0-7]\n"))
    mixed = [line for line in lines if "mixed" in line]
    assert mixed[0].startswith(
        "error   partition p: mixed NPU driver: 24.1.rc2 on n[1,3], 24.1.rc3 on n[2,4]"
    )
    assert mixed[1].startswith(
        "error   partition p: mixed NPU firmware: 7.5.0.2.220 on n2, 7.5.0.1.129 on n[1,3-4]"
    )
    assert mixed[2].startswith(
        "warning partition p: mixed torch_npu: 2.1.0.post8 on n2, 2.1.0.post6 on n[1,3]"
    )
    assert len(mixed) == 3  # CANN is one; torch is in no capture: not compared, not asked for


def test_an_unrecorded_cann_is_said_not_guessed(tmp_path):
    snaps = {"n1": ascend(), "n2": ascend(cann=None)}
    lines = run_checks(*setup(tmp_path, ASCEND, snaps, gres_conf=GOOD_NPU))
    assert "warning partition p: not recorded: cann (said, not guessed)" in lines, lines
    assert not any("mixed" in line for line in lines)


def test_amd_matrix_and_the_table_shows_each_vendors_columns(tmp_path):
    snaps = {"n1": amd(), "n2": amd(rocm="6.1.2"), "n3": amd()}
    doc, profiles, nodes, conf = setup(
        tmp_path,
        AMD,
        snaps,
        gres="gpu:8",
        conf="GresTypes=gpu\n",
        gres_conf="Name=gpu File=/dev/dri/renderD[128-135]\n",
    )
    lines = run_checks(doc, profiles, nodes, conf)
    assert any(
        line.startswith("error   partition p: mixed ROCm: 6.1.2 on n2, 6.2.0 on n[1,3]") for line in lines
    )
    header = doc.matrix_table().splitlines()[0]
    assert header.split() == [
        "node", "gpu_model", "driver", "cuda", "nccl", "hca_model", "hca_fw", "kernel", "accelerator", "rocm",
        "amdgpu_driver",
    ]  # fmt: skip
    assert doc.matrix_table().splitlines()[2].split()[-3:] == ["amd", "6.1.2", "6.8.5"]  # n2's row
    n2 = doc.matrix["n2"]
    assert (n2["gpu_model"], n2["driver"], n2["cuda"], n2["npu_driver"]) == (
        "AMD Instinct MI300X",
        "-",
        "-",
        "-",
    )


def test_the_table_of_a_mixed_cluster_has_both_vendors_and_json_has_every_part(tmp_path):
    doc, _, nodes, _ = setup(tmp_path, ASCEND, {"n1": ascend(), "g1": nvidia()}, gres_conf=GOOD_NPU)
    doc.check_nodes(nodes)
    header = doc.matrix_table().splitlines()[0].split()
    assert header[-6:] == ["accelerator", "npu_driver", "npu_firmware", "cann", "torch_npu", "torch"]
    assert doc.matrix_table().splitlines()[1].split()[-6:] == ["nvidia", "-", "-", "-", "-", "-"]  # g1
    assert doc.matrix_table().splitlines()[2].split()[-6:] == [
        "ascend",
        "24.1.rc2",
        "7.5.0.1.129",
        "8.0.RC3",
        "?",
        "?",
    ]
    matrix = json.loads(doctor.as_json(doc))["matrix"]
    assert (
        matrix["n1"]["cann"] == "8.0.RC3"
        and matrix["n1"]["rocm"] == "-"
        and matrix["g1"]["driver"] == "535.104.05"
    )


# ---- the accelerator against the profile --------------------------------------------------------------------
def test_nvidia_gpus_on_an_ascend_partition_and_npus_on_an_nvidia_one(tmp_path):
    lines = run_checks(*setup(tmp_path, ASCEND, {"n1": nvidia(), "n2": ascend()}, gres_conf=GOOD_NPU))
    assert (
        "error   accelerator p: n1: NVML found 4 NVIDIA GPU(s) (4 x NVIDIA A10G) and no Ascend NPU, but the "
        "partition's accelerator is ascend  -> set `accelerator: nvidia` in the partition's profile, or move the node"
    ) in lines, lines
    assert "ok      accelerator p: n2: 8 Ascend NPU(s) found" in lines
    other = tmp_path / "other"
    other.mkdir()
    lines = run_checks(*setup(other, "gpu: {count: 8}\n", {"g1": ascend()}, gres="gpu:8"))
    assert any(
        line.startswith(
            "error   accelerator p: g1: 8 Ascend NPU(s) (8 x 910B3) and no NVIDIA GPU, but the partition's "
            "accelerator is nvidia  -> set `accelerator: ascend`"
        )
        for line in lines
    ), lines


def test_a_partition_without_a_gpu_count_over_npu_nodes_is_no_mismatch(tmp_path):
    """gpu.count 0 skips GPU checks: a CPU partition over Ascend nodes (the default accelerator, nvidia)."""
    lines = run_checks(*setup(tmp_path, "", {"n1": ascend()}, gres="npu:8"))
    assert not any("accelerator" in line or "gres.conf" in line for line in lines), lines


def test_another_vendors_devices_missing_devices_and_unreadable_ones(tmp_path):
    snaps = {
        "n1": amd(),
        "n2": ascend(n=7),
        "n3": ascend(n=7),
        "n4": accel_snapshot("ascend", [], {}, answered=False),
        "n5": {"kernel": {"release": "5.10"}},  # a capture without the accel section
    }
    lines = run_checks(*setup(tmp_path, ASCEND, snaps, gres_conf=GOOD_NPU))
    assert any(
        line.startswith(
            "error   accelerator p: n1: 8 AMD GPU(s) (8 x AMD Instinct MI300X), but the partition's accelerator is ascend"
        )
        for line in lines
    ), lines
    assert any(
        line.startswith("error   accelerator p: n[2-3]: found 7 Ascend NPU(s), gpu.count is 8")
        for line in lines
    )
    assert any(
        line.startswith(
            "warning accelerator p: n4: its Ascend NPUs could not be read: npu-smi: timed out after 5 s"
        )
        for line in lines
    )
    assert any(
        line.startswith(
            "warning accelerator p: n5: no Ascend NPUs recorded (its capture has no `accel` section)"
        )
        for line in lines
    )


def test_the_profiles_gres_count_is_its_own_gres(tmp_path):
    doc, profiles, _, _ = setup(tmp_path, ASCEND, {"n1": ascend(), "n2": ascend()}, gres="gpu:8")
    doc.check_cluster(profiles)
    (found,) = [f for f in doc.findings if f.subject == "profile p"]
    assert (
        found.severity == "error"
        and found.message == "gpu.count is 8 but n1 has 0, n2 has 0 npu device(s) in GRES"
    )
    doc.findings.clear()
    doc.slurm._nodes = [node(n, ["p"], gres="gpu:4,npu:8(S:0-1)") for n in ("n1", "n2")]
    doc.check_cluster(profiles)
    assert [f.line() for f in doc.findings] == [
        "ok      profile p: partition exists; GRES npu count 8 on every node"
    ]


# ---- gres.conf ----------------------------------------------------------------------------------------------
def gres_lines(tmp_path, snaps, gres_conf, profile=ASCEND, **kw) -> list[str]:
    doc, profiles, nodes, conf = setup(tmp_path, profile, snaps, gres_conf=gres_conf, **kw)
    doc.check_nodes(nodes)
    doc.check_accel(profiles, nodes, conf)
    return [f.line() for f in doc.findings if f.subject.startswith(("gres.conf", "slurm.conf"))]


def test_gres_conf_that_matches_the_npus_found(tmp_path):
    lines = gres_lines(tmp_path, {n: ascend() for n in ("n1", "n2", "n3")}, "AutoDetect=off\n" + GOOD_NPU)
    assert lines == ["ok      gres.conf p: n[1-3]: Name=npu File=/dev/davinci[0-7], as the capture found"]


def test_gres_conf_with_another_vendors_device_files(tmp_path):
    lines = gres_lines(tmp_path, {"n1": ascend()}, "NodeName=n1 Name=npu File=/dev/nvidia[0-7]\n")
    assert lines == [
        f"error   gres.conf p: n1: Name=npu is /dev/nvidia[0-7] ({tmp_path}/etc/gres.conf:1): Ascend NPU device "
        f"files are /dev/davinciN  -> in {tmp_path}/etc/gres.conf: NodeName=n1 Name=npu File=/dev/davinci[0-7]"
    ]


def test_gres_conf_short_of_the_npus_found_and_of_slurm_conf(tmp_path):
    snaps = {"n1": ascend(), "n2": ascend()}
    lines = gres_lines(tmp_path, snaps, "NodeName=n[1-2] Name=npu Type=910b File=/dev/davinci[0-3]\n")
    path = f"{tmp_path}/etc/gres.conf"
    assert lines == [
        "error   gres.conf p: n[1-2]: 4 Name=npu file(s) in gres.conf, Gres=npu:8 in slurm.conf: Slurm drains a node "
        "whose devices fall short of its Gres= count  -> make gres.conf and slurm.conf's NodeName Gres= agree "
        f"(in {path}: NodeName=n[1-2] Name=npu File=/dev/davinci[0-7])",
        "error   gres.conf p: n[1-2]: gres.conf gives /dev/davinci[0-3], the capture found 8 Ascend NPU(s) at "
        f"/dev/davinci[0-7]  -> in {path}: NodeName=n[1-2] Name=npu File=/dev/davinci[0-7]",
    ]


def test_gres_conf_numbers_must_be_the_devices_own(tmp_path):
    """The node lost davinci3: its files must say which seven remain, in the directory gres.conf uses."""
    lost = ascend(n=7)
    for i, dev in enumerate(lost["accel"]["devices"]):
        dev["minor"] = i if i < 3 else i + 1
    lines = gres_lines(
        tmp_path, {"n1": lost}, "NodeName=n1 Name=npu File=/srv/dev/n1/davinci[0-6]\n", gres="npu:7",
        profile="accelerator: ascend\ngpu: {count: 7}\n",
    )  # fmt: skip
    assert lines == [
        "error   gres.conf p: n1: gres.conf gives /srv/dev/n1/davinci[0-6], the capture found 7 Ascend NPU(s) at "
        f"/srv/dev/n1/davinci[0-2,4-7]  -> in {tmp_path}/etc/gres.conf: NodeName=n1 Name=npu "
        "File=/srv/dev/n1/davinci[0-2,4-7]"
    ]


def test_gres_conf_without_the_gres_or_without_files_or_missing(tmp_path):
    for i, (text, want) in enumerate(
        [
            ("NodeName=n1 Name=gpu File=/dev/nvidia[0-3]\n", "n1: no Name=npu line in "),
            ("NodeName=n1 Name=npu Count=8\n", "n1: Name=npu without File= ("),
            (None, "cannot read "),
        ]
    ):
        (tmp_path / str(i)).mkdir()
        (line,) = gres_lines(tmp_path / str(i), {"n1": ascend()}, text)
        assert line.startswith(f"error   gres.conf p: {want}"), line
        assert "NodeName=n1 Name=npu File=/dev/davinci[0-7]" in line


def test_gres_types_must_name_the_partitions_gres(tmp_path):
    lines = gres_lines(tmp_path, {"n1": ascend()}, GOOD_NPU, conf="GresTypes=gpu\n")
    assert lines[0] == (
        f"error   slurm.conf GresTypes: gpu at {tmp_path}/etc/slurm.conf:1 lacks npu: the npu GRES of partition p's "
        "nodes is not schedulable  -> GresTypes=gpu,npu"
    )


def test_amd_render_nodes_autodetect_and_card_files(tmp_path):
    good = gres_lines(tmp_path / "a", {"n1": amd()}, "Name=gpu File=/dev/dri/renderD[128-135]\n", **AMD_KW)
    assert good == ["ok      gres.conf p: n1: Name=gpu File=/dev/dri/renderD[128-135], as the capture found"]
    auto = gres_lines(tmp_path / "b", {"n1": amd()}, "AutoDetect=rsmi\n", **AMD_KW)
    assert auto == ["ok      gres.conf p: n1: AutoDetect=rsmi: Slurm finds the AMD GPUs itself"]
    cards = gres_lines(
        tmp_path / "c", {"n1": amd()}, "NodeName=n1 Name=gpu File=/dev/dri/card[0-7]\n", **AMD_KW
    )
    assert len(cards) == 1 and cards[0].startswith(
        "error   gres.conf p: n1: Name=gpu is /dev/dri/card[0-7] ("
    ) and cards[0].endswith("AMD GPU device files are /dev/dri/renderD<128+N>  -> in "
        f"{tmp_path}/c/etc/gres.conf: NodeName=n1 Name=gpu File=/dev/dri/renderD[128-135]")  # fmt: skip


AMD_KW = {"profile": AMD, "gres": "gpu:8", "conf": "GresTypes=gpu\n"}


def test_gres_conf_reading(tmp_path):
    path = tmp_path / "gres.conf"
    path.write_text(
        "# comment\nAutoDetect=off\nnodename=n[1-2],m3 name=NPU file=/dev/davinci[0-1],/dev/davinci7 # x\n"
        "Name=gpu MultipleFiles=/dev/dri/card1,/dev/dri/renderD128\n"
    )
    lines, problem = read_gres_conf(str(path))
    assert problem == "" and len(lines) == 3 and lines[0].autodetect == "off"
    assert lines[1].nodes == ("n1", "n2", "m3") and lines[1].name == "npu"
    assert lines[1].files == ("/dev/davinci0", "/dev/davinci1", "/dev/davinci7")
    assert lines[2].nodes is None and lines[2].files == ("/dev/dri/card1", "/dev/dri/renderD128")
    assert [file_kind(f) for f in ("/dev/davinci3", "/x/renderD129", "/dev/nvidia0", "/dev/davinci_manager")] == [
        ("ascend", 3), ("amd", 1), ("nvidia", 0), None,
    ]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=1024))
def test_garbage_gres_conf_never_raises(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("g") / "gres.conf"
    path.write_bytes(blob)
    lines, problem = read_gres_conf(str(path))
    assert problem == "" and all(isinstance(g.files, tuple) for g in lines)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    accel=st.fixed_dictionaries(
        {},
        optional={
            "answered": JSONISH,
            "vendor": st.sampled_from(["ascend", "amd", "nvidia", ""]) | JSONISH,
            "system": JSONISH,
            "devices": JSONISH,
            "error": JSONISH,
        },
    ),
    gpus=JSONISH,
)
def test_a_damaged_capture_reads_as_facts_never_a_crash(accel, gpus):
    snap = {"accel": accel, "gpus": gpus}
    facts = doctor_nodes.facts_from_snapshot(snap)
    assert all(isinstance(v, str) and v for v in facts.values())
    assert accel_facts(snap)["accelerator"] in ("nvidia", "amd", "ascend", "?")


def test_hardware_less_capture_of_an_ascend_node_is_taken_with_its_profile(tmp_path, monkeypatch):
    """The capture of a node of an AMD or Ascend partition gets that partition's profile (collect.full reads
    the vendor's devices by it); other nodes' none, as before."""
    seen = {}

    def full(root, profile, node, gpu_file, **kw):
        seen[node] = profile
        return ascend() if profile is not None else nvidia()

    monkeypatch.setattr(doctor_nodes, "full", full)
    monkeypatch.setattr(doctor_nodes, "add_drift", lambda snap, *a, **k: snap)
    for n in ("a1", "g1"):
        (tmp_path / n / "sysfs").mkdir(parents=True)
    doc, profiles, _, _ = setup(tmp_path, ASCEND, {})
    doc.facts_dir = None
    doc.env = {"STUNE_SYSFS_ROOT": f"{tmp_path}/%n/sysfs"}
    doc.node_profiles = {"a1": profiles["p"]}
    assert doc.node_facts("a1")["cann"] == "8.0.RC3" and doc.node_facts("g1")["accelerator"] == "nvidia"
    assert seen == {"a1": profiles["p"], "g1": None}
