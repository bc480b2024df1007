"""stune-admin doctor's pieces without a cluster: node facts from captures (--facts), homogeneity and the
version matrix, GRES counts, and a Slurm that does not answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

from slurm_tune.admin import doctor
from slurm_tune.admin.install import Layout
from slurm_tune.slurm import Node, Slurm

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"


def node(name, partitions, gres="gpu:8"):
    return Node(
        name=name,
        state="idle",
        flags=(),
        reason="",
        reason_user="",
        reason_time=0,
        features="",
        active_features="",
        comment="",
        partitions=tuple(partitions),
        gres=gres,
        gres_used="",
        tres="",
    )


def test_gres_gpu_counts():
    assert doctor.gres_gpus("gpu:4") == 4
    assert doctor.gres_gpus("gpu:a100:8(S:0-1)") == 8
    assert doctor.gres_gpus("gpu:a100:4,gpu:v100:2,shard:8") == 6
    assert doctor.gres_gpus("") == 0 and doctor.gres_gpus("(null)") == 0


def test_facts_name_the_node_whose_driver_and_firmware_differ(tmp_path):
    snap = json.loads((SNAPSHOTS / "dgx-a100-ib.json").read_text())
    for name in ("g1", "g2", "g3"):
        (tmp_path / f"{name}.json").write_text(json.dumps(snap))
    snap["gpus"]["driver_version"] = "550.54.14"
    for dev in snap["ib"]["devices"].values():
        dev["fw_ver"] = "20.28.1002"
    (tmp_path / "g3.json").write_text(json.dumps(snap))
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), str(tmp_path))
    nodes = [node(n, ["hdr"]) for n in ("g1", "g2", "g3", "g4")]
    doc.check_nodes(nodes)
    lines = [f.line() for f in doc.findings]
    assert any(
        line.startswith("error   partition hdr: mixed driver: majority 535.104.05, differs on g3 (550.54.14)")
        for line in lines
    ), lines
    assert any("mixed hca fw" in line and "g3 (20.28.1002)" in line for line in lines), lines
    assert any(line.startswith("warning node facts: nothing recorded for g4") for line in lines), lines
    table = doc.matrix_table()
    assert table.splitlines()[0].split() == [
        "node",
        "gpu_model",
        "driver",
        "cuda",
        "nccl",
        "hca_model",
        "hca_fw",
        "kernel",
    ]
    assert "g3" in table and "550.54.14" in table and "?" in table  # NCCL/kernel: not recorded, said so


def test_a_setuptools_pth_in_stunes_environment_is_a_warning_with_its_fix(tmp_path):
    clean, with_setuptools = tmp_path / "clean", tmp_path / "site-packages"
    clean.mkdir()
    with_setuptools.mkdir()
    (with_setuptools / "distutils-precedence.pth").write_text("import os; var = 'SETUPTOOLS_USE_DISTUTILS'\n")
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.check_python_start([str(clean)])
    doc.check_python_start([str(clean), str(with_setuptools)])
    ok, warned = doc.findings
    assert (ok.severity, ok.subject) == ("ok", "python start")
    assert (
        warned.severity == "warning" and str(with_setuptools / "distutils-precedence.pth") in warned.message
    )
    assert "-m pip uninstall setuptools" in warned.fix


def test_a_slurm_that_does_not_answer_is_one_finding(tmp_path):
    doc = doctor.Doctor(
        "/nonexistent",
        Layout(prefix=str(tmp_path)),
        None,
        Slurm(conf=str(tmp_path / "missing.conf"), timeout=5),
    )
    assert doc.check_cluster({}) == []
    assert [f.subject for f in doc.findings] == ["slurm"] and doc.findings[0].severity == "error"


class FakeAccounting:
    """sacct rows as the adapter returns them (the one Slurm read check_sampler makes)."""

    def __init__(self, rows):
        self.rows = rows

    def sacct(self, fields, **kwargs):
        return self.rows


def test_the_sampler_is_judged_by_the_last_gpu_job_on_each_node(tmp_path):
    from slurm_tune.usage import summary

    def comment(node_means):
        per_gpu = tuple(summary.GpuMeans(n, "0", sm, None, None, None) for n, sm in node_means)
        return summary.encode(
            summary.JobSummary(100.0, 50.0, 100.0, 0.0, None, 1, len(node_means), len(node_means), per_gpu)
        )

    rows = [
        {
            "JobIDRaw": "10",
            "End": "1000",
            "NodeList": "g[1-2]",
            "AllocTRES": "cpu=2,gres/gpu=2",
            "AdminComment": comment([("g1", 80.0), ("g2", None)]),
        },
        {
            "JobIDRaw": "11",
            "End": "900",
            "NodeList": "g2",
            "AllocTRES": "cpu=1,gres/gpu=1",
            "AdminComment": comment([("g2", 70.0)]),
        },  # older: the newer job 10 decides for g2
        {
            "JobIDRaw": "12",
            "End": "1200",
            "NodeList": "g3",
            "AllocTRES": "cpu=1,gres/gpu=1",
            "AdminComment": "",
        },
        {
            "JobIDRaw": "13",
            "End": "1300",
            "NodeList": "g4",
            "AllocTRES": "cpu=1",
            "AdminComment": "",
        },  # no GPU
        {"JobIDRaw": "14", "End": "Unknown", "NodeList": "g4", "AllocTRES": "gres/gpu=1", "AdminComment": ""},
    ]
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None, FakeAccounting(rows))
    doc.check_sampler([node(n, ["hdr"]) for n in ("g1", "g2", "g3", "g4")] + [node("c1", ["cpu"], gres="")])
    lines = [f.line() for f in doc.findings]
    assert any(line.startswith("warning sampler: not sampling on g2 (job 10)") for line in lines), lines
    assert any(
        line.startswith("warning sampler: no usage summary stored for the last GPU job on g3 (job 12)")
        for line in lines
    ), lines
    assert any(line.startswith("warning sampler: no GPU job ended on g4 within a day") for line in lines), (
        lines
    )
    assert any(line.startswith("ok      sampler: measured the last GPU job on g1") for line in lines), lines
    assert not any("c1" in line for line in lines)


def test_hardware_less_facts_come_from_per_node_snapshots_only(tmp_path):
    snap = json.loads((SNAPSHOTS / "vpc-a10g.json").read_text())
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "gpus.json").write_text(json.dumps(snap))
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.env = {
        "STUNE_GPU_SNAPSHOT": f"{tmp_path}/%n/gpus.json",
        "STUNE_SYSFS_ROOT": "/",
    }  # "/" is this host's
    assert doc.node_facts("v1")["driver"] == "535.104.05"
    assert doc.node_facts("v1")["hca_fw"] == "?"  # no per-node sysfs tree: not guessed from this host
    assert doc.node_facts("v2") is None  # no snapshot for v2: said, not guessed


class FakeCluster(FakeAccounting):
    def __init__(self, partitions, nodes, rows=()):
        super().__init__(list(rows))
        self._partitions, self._nodes = partitions, nodes

    def partitions(self):
        return self._partitions

    def nodes(self):
        return self._nodes


def test_gpu_count_0_skips_the_gres_comparison(tmp_path):
    """The schema says `gpu.count: 0` skips GPU checks: a profile without a count on GPU nodes is not an
    error (doctor exited 1 forever on a correct cluster); a wrong nonzero count still is."""
    from types import SimpleNamespace

    from slurm_tune.profiles import validate_directory

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "roce.yaml").write_text(
        "partition: roce\nfabric:\n  type: tcp\n  socket_ifname: eth0\n"
    )
    (tmp_path / "p" / "hdr.yaml").write_text(
        "partition: hdr\nfabric:\n  type: tcp\n  socket_ifname: eth0\ngpu:\n  count: 8\n"
    )
    profiles = validate_directory(str(tmp_path / "p"))
    assert profiles["roce"].gpu.count == 0
    nodes = [node("r1", ["roce"], gres="gpu:4"), node("h1", ["hdr"], gres="gpu:4")]
    doc = doctor.Doctor(
        "/nonexistent",
        Layout(prefix=str(tmp_path)),
        None,
        FakeCluster([SimpleNamespace(name="roce"), SimpleNamespace(name="hdr")], nodes),
    )
    doc.check_cluster(profiles)
    found = {f.subject: f for f in doc.findings}
    assert found["profile roce"].severity == "ok" and "GPU checks skipped" in found["profile roce"].message
    assert found["profile hdr"].severity == "error" and "h1 has 4" in found["profile hdr"].message


def unmeasured_rows(node_name: str):
    from slurm_tune.usage import summary

    text = summary.encode(
        summary.JobSummary(
            100.0, 0.0, 0.0, 0.0, None, 1, 1, 1, (summary.GpuMeans(node_name, "0", None, None, None, None),)
        )
    )
    return [
        {
            "JobIDRaw": "12",
            "End": "1200",
            "NodeList": node_name,
            "AllocTRES": "gres/gpu=1",
            "AdminComment": text,
        }
    ]


def test_the_sampler_finding_names_records_in_a_directory_the_sampler_does_not_read(tmp_path):
    """Job records in a literal %n directory (a prolog that does not expand %n): doctor names that, not
    'enable the sampler', which was running."""
    template = f"{tmp_path}/nodes/%n/usage"
    (tmp_path / "nodes/%n/usage/jobs").mkdir(parents=True)
    (tmp_path / "nodes/%n/usage/jobs/12").write_text("0\n")
    (tmp_path / "nodes/n1/usage/jobs").mkdir(parents=True)
    doc = doctor.Doctor(
        "/nonexistent", Layout(prefix=str(tmp_path)), None, FakeAccounting(unmeasured_rows("n1"))
    )
    doc.env = {"STUNE_USAGE_DIR": template}
    doc.check_sampler([node("n1", ["hdr"])])
    (finding,) = doc.findings
    assert finding.severity == "warning" and "not measuring on n1 (job 12)" in finding.message
    assert (
        f"{tmp_path}/nodes/%n/usage/jobs, a literal %n directory the sampler does not read" in finding.message
    )
    assert f"it reads {tmp_path}/nodes/n1/usage/jobs" in finding.message
    assert "enable" not in finding.fix and "stune-admin install" in finding.fix
    # nothing where the sampler of n1 reads, and no stray records: that is named too
    doc = doctor.Doctor(
        "/nonexistent", Layout(prefix=str(tmp_path)), None, FakeAccounting(unmeasured_rows("n2"))
    )
    doc.env = {"STUNE_USAGE_DIR": f"{tmp_path}/other/%n/usage"}
    doc.check_sampler([node("n2", ["hdr"])])
    assert f"{tmp_path}/other/n2/usage/jobs does not exist" in doc.findings[0].message


def test_the_cache_tier_is_checked_per_node_and_init_sets_it_up(tmp_path, monkeypatch):
    """A profile's %n cache tier: doctor names each node where `stune-stage init` has not run; after the
    shipped unit's command (`stune-stage init`, per node) it is set up there."""
    import subprocess
    import sys

    from slurm_tune.profiles import validate_directory

    monkeypatch.setenv("STUNE_PARTITIONS", str(tmp_path / "p"))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "hdr.yaml").write_text(
        f"partition: hdr\nfabric:\n  type: tcp\n  socket_ifname: eth0\n"
        f"cache:\n  path: {tmp_path}/nodes/%n/cache\n"
    )
    for n in ("n1", "n2"):
        (tmp_path / "nodes" / n).mkdir(parents=True)
    profiles = validate_directory(str(tmp_path / "p"))
    nodes = [node("n1", ["hdr"]), node("n2", ["hdr"])]
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.check_cache_tiers(profiles, nodes)
    (finding,) = doc.findings
    assert finding.severity == "warning" and finding.subject == "cache tier hdr"
    assert "not set up on n1 (" in finding.message and "n2 (" in finding.message
    assert "stune-stage-init" in finding.fix
    stage = [str(Path(sys.executable).parent / "stune-stage")]
    env = {**os.environ, "SLURMD_NODENAME": "n1"}
    assert subprocess.run([*stage, "init"], env=env, capture_output=True, timeout=120).returncode == 0
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.check_cache_tiers(profiles, nodes)
    lines = [f.line() for f in doc.findings]
    assert any(line.startswith("warning cache tier hdr: not set up on n2 (") for line in lines), lines
    assert any(line.startswith("ok      cache tier hdr: set up on n1") for line in lines), lines


def test_stage_init_with_no_tier_configured_is_nothing_to_do(tmp_path, monkeypatch):
    """stune-stage-init.service runs on every node at boot: no profile with cache.path is not a failure."""
    import subprocess
    import sys

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "hdr.yaml").write_text("partition: hdr\nfabric:\n  type: tcp\n  socket_ifname: eth0\n")
    env = {**os.environ, "STUNE_PARTITIONS": str(tmp_path / "p"), "SLURMD_NODENAME": "n1"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "stune-stage"), "init"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "no cache tier to set up" in proc.stdout
