"""`stune-sweep report --compare A B`: two partitions' stored results side by side (NVIDIA, AMD, Ascend, and
one partition before and after a version change), as a table, JSON and a PNG; an empty side is one line."""

from __future__ import annotations

import json
import time

import comparekit as kit
import pytest

from slurm_tune.active import compare
from slurm_tune.cli import sweep

NOW = time.time()


def run(capsys, store, *args):
    code = sweep.main(
        ["report", "--store", str(store), "--partitions-dir", str(kit.REPO / "partitions"), *args]
    )
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def two(tmp_path):
    """hdr: 6 NVIDIA nodes; ascend: 4 Ascend nodes, two of them on another CANN; both with validation
    layers and a multi-node scaling curve."""
    store = tmp_path / "store"
    start = NOW - 20000
    hdr = kit.sweeps(
        "hdr",
        [f"n{i}" for i in range(1, 7)],
        {"nccl_allreduce": 100.0, "disk_read": 2.0, "numeric": None},
        start,
    )
    other_cann = dict(kit.ASCEND, cann="8.0.RC3")
    asc = kit.sweeps(
        "ascend",
        ["a1", "a2", "a3", "a4"],
        {"hccl_allreduce": 50.0, "disk_read": 3.0},
        start,
        fp=kit.ASCEND,
        fps={"a3": other_cann, "a4": other_cann},
    )
    kit.put(
        store,
        "hdr",
        hdr,
        [
            kit.validate("hdr", "ops", f"n{i}", "pass", NOW - 100, ops=[kit.op("matmul", "bf16")])
            for i in (1, 2)
        ],
        [kit.curve("hdr", "nodes", {1: 1.0, 2: 0.95, 4: 0.9}, NOW - 50)],
    )
    bad = kit.op("softmax", "fp16", "fail", max_rel=0.3, tol_rel=0.01)
    kit.put(
        store,
        "ascend",
        asc,
        [
            kit.validate(
                "ascend", "ops", "a1", "fail", NOW - 90, kit.ASCEND, ops=[kit.op("matmul", "bf16"), bad]
            )
        ],
        [
            kit.curve(
                "ascend",
                "nodes",
                {1: 1.0, 2: 0.8, 4: 0.6},
                NOW - 40,
                "knee",
                {"n": 4, "efficiency": 0.6, "why": "switch uplink"},
                "hccl_allreduce",
                kit.ASCEND,
            )
        ],
    )
    return store


def test_nvidia_against_ascend_ratios_matrices_and_differing_nodes(capsys, two):
    code, out, err = run(capsys, two, "--compare", "hdr", "ascend", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"a", "b", "rows", "only_a", "only_b", "scaling", "validate"}
    rows = {r["metric"]: r for r in doc["rows"]}
    ar = rows["all-reduce busbw"]
    assert (ar["check_a"], ar["check_b"], ar["a"], ar["b"], ar["ratio"]) == (
        "nccl_allreduce",
        "hccl_allreduce",
        100.0,
        50.0,
        0.5,
    )
    assert (ar["subjects_a"], ar["subjects_b"]) == (6, 4)
    assert rows["disk read"]["ratio"] == 1.5 and doc["only_a"] == ["numeric"] and doc["only_b"] == []
    nv, asc = doc["a"]["matrix"], doc["b"]["matrix"]
    assert set(nv) == {"nvidia"} and nv["nvidia"]["nodes"] == 6 and nv["nvidia"]["differs"] == []
    assert nv["nvidia"]["parts"]["driver"] == {"535.104.05": 6}
    assert asc["ascend"]["parts"]["cann"] == {"8.0.RC2": 2, "8.0.RC3": 2}
    assert asc["ascend"]["differs"] == ["cann"] and asc["ascend"]["parts"]["npu_driver"] == {"24.1.rc2": 4}
    (sc,) = doc["scaling"]
    assert [(p["n"], p["a"], p["b"]) for p in sc["points"]] == [(1, 1.0, 1.0), (2, 0.95, 0.8), (4, 0.9, 0.6)]
    assert sc["verdict_b"] == "knee" and sc["knee_b"]["n"] == 4 and sc["knee_a"] is None
    (ops,) = doc["validate"]
    assert (ops["a"], ops["b"]) == ("pass", "fail")
    assert (
        ops["worst_b"]["op"] == "softmax"
        and ops["worst_b"]["node"] == "a1"
        and ops["worst_b"]["score"] == 30.0
    )

    code, out, err = run(capsys, two, "--compare", "hdr", "ascend")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("all-reduce busbw"))
    assert line.split() == [
        "all-reduce",
        "busbw",
        "GB/s",
        "nccl_allreduce",
        "100",
        "6",
        "hccl_allreduce",
        "50",
        "4",
        "0.5",
    ]
    assert "cann 8.0.RC2 (2 nodes) / 8.0.RC3 (2 nodes)" in out and "nodes differ in cann" in out
    assert "ascend (4 nodes" in out and "nvidia (6 nodes): driver 535.104.05" in out
    assert "softmax.fp16 on a1" in out and "n=4 eff 0.6" in out


def test_png_is_written(capsys, two, tmp_path):
    png = tmp_path / "cmp.png"
    code, _, err = run(capsys, two, "--compare", "hdr", "ascend", "--png", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_partition_before_and_after_a_driver_change(capsys, tmp_path):
    store = tmp_path / "store"
    nodes = [f"n{i}" for i in range(1, 5)]
    before = kit.sweeps("hdr", nodes, {"nccl_allreduce": 100.0}, NOW - 90000)
    after = kit.sweeps(
        "hdr", nodes[:3], {"nccl_allreduce": 90.0}, NOW - 20000, fp=dict(kit.NV, driver="550.54.15")
    )
    kit.put(store, "hdr", before + after)
    code, out, err = run(capsys, store, "--compare", "hdr@previous", "hdr", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["side"] == "hdr@previous" and doc["b"]["side"] == "hdr"
    (row,) = doc["rows"]
    assert (row["a"], row["b"], row["ratio"], row["subjects_a"], row["subjects_b"]) == (
        100.0,
        90.0,
        0.9,
        3,
        4,
    )
    assert doc["a"]["matrix"]["nvidia"]["parts"]["driver"] == {"535.104.05": 3}
    # n4 was never upgraded: the latest side's nodes differ in their driver, and the count says so
    assert doc["b"]["matrix"]["nvidia"]["parts"]["driver"] == {"550.54.15": 3, "535.104.05": 1}
    assert doc["b"]["matrix"]["nvidia"]["differs"] == ["driver"]


def test_amd_side_joins_the_all_reduce_metric(tmp_path):
    res = kit.sweeps("amd", ["m1", "m2"], {"rccl_allreduce": 80.0}, NOW - 5000, fp=kit.AMD)
    a = compare.side("hdr", "latest", kit.sweeps("hdr", ["n1"], {"nccl_allreduce": 100.0}, NOW - 5000))
    b = compare.side("amd", "latest", res)
    doc = compare.compare(a, b)
    assert [(r["metric"], r["ratio"]) for r in doc["rows"]] == [("all-reduce busbw", 0.8)]
    assert doc["b"]["matrix"]["amd"]["parts"]["rocm"] == {"6.2.0": 2}
    assert "amd (2 nodes): driver" not in compare.text(doc) and "rocm 6.2.0" in compare.text(doc)


def test_an_empty_side_is_one_line_naming_the_partition_and_the_store(capsys, two):
    code, out, err = run(capsys, two, "--compare", "hdr", "nosuch")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "nosuch" in err and str(two) in err and "Traceback" not in err
    code, _, err = run(capsys, two, "--compare", "hdr@previous", "hdr")
    assert code == 1 and "hdr@previous: no results under a fingerprint before the latest" in err
    code, _, err = run(capsys, two, "--compare", "hdr@latest", "hdr")
    assert code == 1 and "PARTITION@previous" in err
    code, _, err = run(capsys, two)
    assert code == 1 and "-p PARTITION (or --compare A B)" in err
