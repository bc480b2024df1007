"""stune-admin doctor's pieces without a cluster: node facts from captures (--facts), homogeneity and the
version matrix, GRES counts, and a Slurm that does not answer."""
from __future__ import annotations

import json
from pathlib import Path

from slurm_tune.admin import doctor
from slurm_tune.admin.install import Layout
from slurm_tune.slurm import Node, Slurm

SNAPSHOTS = Path(__file__).parent / "fixtures" / "snapshots"


def node(name, partitions, gres="gpu:8"):
    return Node(name=name, state="idle", flags=(), reason="", reason_user="", reason_time=0, features="",
                active_features="", comment="", partitions=tuple(partitions), gres=gres, gres_used="", tres="")


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
    assert any(l.startswith("error   partition hdr: mixed driver: majority 535.104.05, differs on g3 (550.54.14)")
               for l in lines), lines
    assert any("mixed hca fw" in l and "g3 (20.28.1002)" in l for l in lines), lines
    assert any(l.startswith("warning node facts: nothing recorded for g4") for l in lines), lines
    table = doc.matrix_table()
    assert table.splitlines()[0].split() == ["node", "gpu_model", "driver", "cuda", "nccl", "hca_model", "hca_fw",
                                             "kernel"]
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
    assert warned.severity == "warning" and str(with_setuptools / "distutils-precedence.pth") in warned.message
    assert "-m pip uninstall setuptools" in warned.fix


def test_a_slurm_that_does_not_answer_is_one_finding(tmp_path):
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None,
                        Slurm(conf=str(tmp_path / "missing.conf"), timeout=5))
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
        return summary.encode(summary.JobSummary(100.0, 50.0, 100.0, 0.0, None, 1, len(node_means),
                                                 len(node_means), per_gpu))

    rows = [
        {"JobIDRaw": "10", "End": "1000", "NodeList": "g[1-2]", "AllocTRES": "cpu=2,gres/gpu=2",
         "AdminComment": comment([("g1", 80.0), ("g2", None)])},
        {"JobIDRaw": "11", "End": "900", "NodeList": "g2", "AllocTRES": "cpu=1,gres/gpu=1",
         "AdminComment": comment([("g2", 70.0)])},           # older: the newer job 10 decides for g2
        {"JobIDRaw": "12", "End": "1200", "NodeList": "g3", "AllocTRES": "cpu=1,gres/gpu=1", "AdminComment": ""},
        {"JobIDRaw": "13", "End": "1300", "NodeList": "g4", "AllocTRES": "cpu=1", "AdminComment": ""},  # no GPU
        {"JobIDRaw": "14", "End": "Unknown", "NodeList": "g4", "AllocTRES": "gres/gpu=1", "AdminComment": ""},
    ]
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None, FakeAccounting(rows))
    doc.check_sampler([node(n, ["hdr"]) for n in ("g1", "g2", "g3", "g4")] + [node("c1", ["cpu"], gres="")])
    lines = [f.line() for f in doc.findings]
    assert any(l.startswith("warning sampler: not sampling on g2 (job 10)") for l in lines), lines
    assert any(l.startswith("warning sampler: no usage summary stored for the last GPU job on g3 (job 12)")
               for l in lines), lines
    assert any(l.startswith("warning sampler: no GPU job ended on g4 within a day") for l in lines), lines
    assert any(l.startswith("ok      sampler: measured the last GPU job on g1") for l in lines), lines
    assert not any("c1" in l for l in lines)


def test_hardware_less_facts_come_from_per_node_snapshots_only(tmp_path):
    snap = json.loads((SNAPSHOTS / "vpc-a10g.json").read_text())
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "gpus.json").write_text(json.dumps(snap))
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None)
    doc.env = {"STUNE_GPU_SNAPSHOT": f"{tmp_path}/%n/gpus.json", "STUNE_SYSFS_ROOT": "/"}  # "/" is this host's
    assert doc.node_facts("v1")["driver"] == "535.104.05"
    assert doc.node_facts("v1")["hca_fw"] == "?"     # no per-node sysfs tree: not guessed from this host
    assert doc.node_facts("v2") is None               # no snapshot for v2: said, not guessed
