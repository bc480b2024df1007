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


def test_a_slurm_that_does_not_answer_is_one_finding(tmp_path):
    doc = doctor.Doctor("/nonexistent", Layout(prefix=str(tmp_path)), None,
                        Slurm(conf=str(tmp_path / "missing.conf"), timeout=5))
    assert doc.check_cluster({}) == []
    assert [f.subject for f in doc.findings] == ["slurm"] and doc.findings[0].severity == "error"
