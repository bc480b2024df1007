"""The scaling curve (stune-sweep scaling) without Slurm: the points, efficiency and the knee, the multi-node gate,
who joined at the knee (nodes, switches from `scontrol show topology`, stored slow pairs), the record and its
validator, the per-vendor readings from the stand-ins and the real captures, and the whole run against a
stand-in Slurm that runs each job's agent at once (the same agent and stand-in tools as the cluster tests)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.active import parse, parse_accel, scaling, scaling_out, streams
from slurm_tune.active import scaling_judge as sj
from slurm_tune.active import store as active_store
from slurm_tune.active.judge import Verdict
from slurm_tune.errors import StuneError
from slurm_tune.profiles import load_profile
from slurm_tune.slurm.scontrol import parse_records

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "active_standins"
COMM = REPO / "tests" / "fixtures" / "comm"


def result(value, status="ok", **kw) -> dict:
    return dict({"status": status, "value": value, "detail": f"busbw {value}"}, **kw)


# ---- points, efficiency, the knee ----------------------------------------------------------------------
def test_device_points_are_capped_at_the_node_and_end_with_the_full_node():
    assert sj.device_points((1, 2, 4, 8), 4) == [1, 2, 4]
    assert sj.device_points((1, 2, 4, 8), 8) == [1, 2, 4, 8]
    assert sj.device_points((1, 2, 4, 8), 6) == [1, 2, 4, 6]
    assert sj.device_points((2, 4), 0) == [1]


def test_node_counts_are_powers_of_two_and_the_largest_count_allowed():
    assert sj.node_counts(3) == [1, 2, 3]
    assert sj.node_counts(8) == [1, 2, 4, 8]
    assert sj.node_counts(10, cap=6) == [1, 2, 4, 6]
    assert sj.node_counts(5, cap=2) == [1, 2]
    assert sj.node_counts(1) == [1] and sj.node_counts(0) == []


def node_curve(values: dict, vendor="nvidia", algbw=480.0) -> list[dict]:
    return [
        sj.point(n, ["n1"], None if v is None else result(v, algbw=algbw), vendor, n)
        for n, v in values.items()
    ]


def test_in_one_node_efficiency_is_against_the_first_multi_device_point_and_1_device_is_reference_only():
    points = node_curve({1: 0.0, 2: 180.0, 4: 175.0, 8: 120.0})
    judged = sj.judge_curve(points, sj.NODE, 0.8)
    assert judged["baseline"] == 180.0 and judged["baseline_n"] == 2
    assert [p["efficiency"] for p in points] == [None, 1.0, round(175 / 180, 4), round(120 / 180, 4)]
    assert points[0]["value"] == 480.0 and points[0]["metric"] == "algbw"  # the 1-device run's algbw
    assert judged["verdict"] == "knee" and points[judged["knee_at"]]["n"] == 8
    assert judged["detail"] == "knee at 8 devices: 120 GB/s is 67% of 180 GB/s at 2 devices (below 80%)"
    knee = sj.knee_of(points, judged, sj.NODE, None, [])
    assert knee["n"] == 8 and knee["nodes_added"] == [] and "within n1" in knee["why"]


def test_a_curve_that_holds_passes_and_one_exactly_at_the_knee_is_no_knee():
    points = node_curve({1: 0.0, 2: 100.0, 4: 80.0})
    judged = sj.judge_curve(points, sj.NODE, 0.8)
    assert judged["verdict"] == "pass" and judged["knee_at"] is None
    assert judged["detail"] == "every point at or above 80% of 100 GB/s (lowest 80%)"


def test_wrong_results_fail_the_curve_and_an_unmeasured_point_leaves_it_unknown():
    failing = [*node_curve({1: 0.0, 2: 180.0}), sj.point(4, ["n1"], result(None, "fail"), "nvidia", 4)]
    assert sj.judge_curve(failing, sj.NODE, 0.8)["verdict"] == "fail"
    gap = node_curve({1: 0.0, 2: 180.0, 4: None})
    judged = sj.judge_curve(gap, sj.NODE, 0.8)
    assert judged["verdict"] == "unknown" and judged["detail"].startswith("unknown at 4 devices: no result")
    no_ref = node_curve({1: 0.0, 2: None, 4: 170.0})
    judged = sj.judge_curve(no_ref, sj.NODE, 0.8)
    assert judged["verdict"] == "unknown" and judged["baseline"] is None
    assert all(p["efficiency"] is None for p in no_ref)
    lone = node_curve({1: 0.0})
    assert sj.judge_curve(lone, sj.NODE, 0.8)["verdict"] == "unknown"


def test_across_nodes_efficiency_is_against_the_single_node_figure_or_the_full_node_of_the_first_curve():
    nodes = [["n1"], ["n1", "n2"], ["n1", "n2", "n3"]]
    points = [
        sj.point(len(ns), ns, result(v), "nvidia", 4 * len(ns)) for ns, v in zip(nodes, (170.0, 160.0, 60.0))
    ]
    judged = sj.judge_curve(points, sj.NODES, 0.8)
    assert judged["baseline"] == 170.0 and points[0]["efficiency"] == 1.0
    assert judged["verdict"] == "knee" and points[judged["knee_at"]]["n"] == 3
    lost = [sj.point(1, ["n1"], None, "nvidia", 4), sj.point(2, nodes[1], result(150.0), "nvidia", 8)]
    judged = sj.judge_curve(lost, sj.NODES, 0.8, fallback=175.0)
    assert judged["baseline"] == 175.0 and lost[1]["efficiency"] == round(150 / 175, 4)
    assert judged["verdict"] == "unknown"  # the 1-node point itself has no result


def test_hccl_tests_algbw_becomes_the_bus_bandwidth_by_nccl_tests_definition():
    # nccl-tests' own 16-rank table (a real capture): busbw = algbw x 2(n-1)/n
    r = parse.nccl_tests((COMM / "nccltests-2node-h100-a3mega-ztan.txt").read_bytes())
    assert (r.status, r.value, r.extra["algbw"], r.extra["ranks"]) == ("ok", 338.82, 180.71, 16)
    assert sj.bus_bandwidth("ascend", r.extra["algbw"], 16) == pytest.approx(r.value, rel=1e-3)
    assert sj.bus_bandwidth("nvidia", 338.82, 16) == 338.82
    # HCCL Test's documentation example: the algbw at 64 MiB on 8 NPUs
    h = parse_accel.hccl_test((COMM / "hcclTest-allreduce-docexample.txt").read_bytes())
    p = sj.point(8, ["a1"], {"status": h.status, "value": h.value, "detail": h.detail}, "ascend", 8)
    assert p["value"] == round(h.value * 2 * 7 / 8, 4) and p["metric"] == "busbw"
    one = sj.point(1, ["a1"], {"status": h.status, "value": h.value, "detail": h.detail}, "ascend", 1)
    assert one["value"] == h.value and one["metric"] == "algbw"


# ---- who joined at the knee ----------------------------------------------------------------------------
TOPOLOGY = (
    "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
    "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[3-4]\n"
    "SwitchName=s2 Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=s[0-1]\n"
)


def knee_at_three():
    nodes = [["n1"], ["n1", "n2"], ["n1", "n2", "n3"]]
    points = [
        sj.point(len(ns), ns, result(v), "nvidia", 4 * len(ns)) for ns, v in zip(nodes, (170.0, 165.0, 60.0))
    ]
    return points, sj.judge_curve(points, sj.NODES, 0.8)


def verdict(subject, check="nccl_pair", status="outlier"):
    return Verdict(subject, check, status, f"{check} slow", 50.0, None, 2, 3, "")


def test_the_knee_names_the_node_that_joined_its_leaf_switch_the_spine_and_its_slow_pairs():
    points, judged = knee_at_three()
    topology = sj.parse_topology(parse_records(TOPOLOGY))
    pairs = [verdict("n3+n4/mlx5_0", "ib_write_bw"), verdict("n1+n2"), verdict("n2+n3", status="ok")]
    knee = sj.knee_of(points, judged, sj.NODES, topology, pairs)
    assert knee["n"] == 3 and knee["nodes_added"] == ["n3"] and knee["switches"] == ["s1", "s2"]
    assert knee["pairs"] == [
        {"check": "ib_write_bw", "subject": "n3+n4/mlx5_0", "value": 50.0, "reason": "ib_write_bw slow"}
    ]
    assert "joined: n3; switches: s1,s2; slow pairs: ib_write_bw n3+n4/mlx5_0" in knee["why"]
    # within one leaf: that leaf alone
    assert sj.switches_involved(topology, ["n1", "n2"], ["n2"]) == ["s0"]


def test_without_a_topology_plugin_the_knee_says_no_topology_is_known():
    points, judged = knee_at_three()
    knee = sj.knee_of(points, judged, sj.NODES, sj.parse_topology(parse_records("")), [])
    assert knee["switches"] == [] and knee["pairs"] == []
    assert knee["why"].endswith("joined: n3; no topology known (no topology plugin)")


# ---- the record --------------------------------------------------------------------------------------
def a_record() -> dict:
    points, judged = knee_at_three()
    knee = sj.knee_of(points, judged, sj.NODES, [], [verdict("n3+n1")])
    return sj.record(1.75e9, "hdr", "s1", sj.NODES, "nccl_allreduce", points, judged, knee, {"driver": "535"})


def test_the_record_has_the_agreed_keys_and_survives_the_store():
    r = a_record()
    assert set(r) >= {
        "at",
        "partition",
        "sweep",
        "scope",
        "check",
        "unit",
        "points",
        "baseline",
        "knee",
        "verdict",
        "fingerprint",
    }
    assert set(r["points"][0]) >= {"n", "nodes", "value", "status", "efficiency", "detail"}
    assert set(r["knee"]) == {"n", "efficiency", "nodes_added", "switches", "pairs", "why"}
    assert sj.valid_record(r) and sj.valid_record(
        sj.skipped(1.75e9, "hdr", "s1", "nccl_allreduce", "one node")
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.pop("verdict"),
        lambda r: r.update(verdict="great"),
        lambda r: r.update(scope="rack"),
        lambda r: r.update(at=float("nan")),
        lambda r: r.update(baseline=float("inf")),
        lambda r: r["points"][0].update(n=True),
        lambda r: r["points"][0].update(value=-1.0),
        lambda r: r["points"][0].update(status="slow"),
        lambda r: r["points"][0].update(nodes="n1"),
        lambda r: r["points"][1].update(efficiency=1e9),
        lambda r: r["knee"].update(nodes_added=[3]),
        lambda r: r["knee"].update(pairs=["n1+n2"]),
        lambda r: r.update(fingerprint=None),
        lambda r: r.update(points={}),
    ],
)
def test_a_record_stune_could_not_have_written_is_refused(change):
    r = a_record()
    change(r)
    assert not sj.valid_record(r)


def test_load_skips_invalid_and_unreadable_lines(tmp_path):
    active_store.append(str(tmp_path), "hdr", [a_record()], kind="scaling")
    month = next((tmp_path / "scaling" / "hdr").iterdir())
    with open(month, "ab") as fh:
        fh.write(b'{"at": 1.75e9, "scope": "nodes"}\n\xff\xfe garbage\n[1, 2]\n')
    assert [r["verdict"] for r in streams.load_scaling(str(tmp_path), "hdr")] == ["knee"]


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=6),
        max_leaves=30,
    )
)
def test_the_validator_never_raises_on_any_json(value):
    assert sj.valid_record(value) in (True, False)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_topology_and_nccl_tables_from_any_bytes_never_raise_nor_give_a_bad_number(data):
    text = data.decode("utf-8", "replace")
    topology = sj.parse_topology(parse_records(text))
    assert all(isinstance(s["nodes"], set) for s in topology)
    sj.switches_involved(topology, ["n1", "n2"], ["n2"])
    r = parse.nccl_tests(data)
    if r.status == "ok":
        assert math.isfinite(r.extra["algbw"]) and 0 <= r.extra["algbw"] <= 1e7


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=1500), st.integers(1, 64))
def test_a_point_from_any_tool_output_is_a_valid_point(data, ranks):
    for vendor, parser in (("nvidia", parse.nccl_tests), ("ascend", parse_accel.hccl_test)):
        reading = parser(data)
        r = {"status": reading.status, "value": reading.value, "detail": reading.detail, **reading.extra}
        assert sj._point_ok(sj.point(ranks, ["n1"], r, vendor, ranks))


# ---- the stand-ins print the real formats, per vendor --------------------------------------------------
CURVE = {
    "scaling": {"devices": {"1": 0, "2": 180, "4": 175, "8": 120}, "nodes": {"1": 170, "2": 160, "3": 60}}
}


def standin(tool: str, args: list[str], tmp_path: Path, **env) -> bytes:
    values = tmp_path / "values.json"
    values.write_text(json.dumps({"all_reduce_perf": CURVE, "all_reduce_test": CURVE}))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run(
        [str(STANDINS / tool), *args],
        capture_output=True,
        check=True,
        env=dict(clean, STUNE_STANDIN_VALUES=str(values), STUNE_STANDIN_STATE=str(tmp_path), **env),
    ).stdout


@pytest.mark.parametrize("g, busbw", [(2, 180), (4, 175), (8, 120)])
def test_the_nccl_standin_scales_with_its_devices_in_nccl_tests_format(tmp_path, g, busbw):
    out = standin("all_reduce_perf", ["-b", "1G", "-e", "8G", "-f", "2", "-g", str(g)], tmp_path)
    r = parse.nccl_tests(out)
    assert r.status == "ok" and r.extra["ranks"] == g and r.value == pytest.approx(busbw)


def test_the_nccl_standin_at_one_device_prints_busbw_0_and_its_algbw(tmp_path):
    r = parse.nccl_tests(standin("all_reduce_perf", ["-g", "1"], tmp_path))
    assert (r.status, r.value, r.extra["ranks"]) == ("ok", 0.0, 1) and r.extra["algbw"] == 500.0
    assert (
        sj.point(1, ["n1"], {"status": r.status, "value": r.value, "detail": "", **r.extra}, "nvidia", 1)[
            "value"
        ]
        == 500.0
    )


def test_the_nccl_standin_under_srun_scales_with_the_jobs_nodes(tmp_path):
    out = standin(
        "all_reduce_perf", ["-g", "1"], tmp_path,
        SLURM_STEP_NUM_TASKS="12", SLURM_JOB_NUM_NODES="3", SLURM_JOB_NODELIST="n[1-3]",
    )  # fmt: skip
    r = parse.nccl_tests(out)
    assert r.status == "ok" and r.extra["ranks"] == 12 and r.value == pytest.approx(60)
    assert b"on        n3 device  3" in out


def test_the_hccl_standin_scales_with_its_npus_in_hccl_tests_format(tmp_path):
    out = standin("all_reduce_test", ["-b", "8K", "-e", "1G", "-f", "2", "-p", "8"], tmp_path)
    r = parse_accel.hccl_test(out)
    assert r.status == "ok" and r.value == pytest.approx(120)  # algbw as printed
    assert (
        sj.point(8, ["a1"], {"status": "ok", "value": r.value, "detail": ""}, "ascend", 8)["value"] == 210.0
    )


def test_without_a_scaling_entry_the_standins_print_what_they_always_did(tmp_path):
    values = tmp_path / "v.json"
    values.write_text(json.dumps({"all_reduce_perf": {"*": 100.0}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    out = subprocess.run(
        [str(STANDINS / "all_reduce_perf"), "-g", "8"], capture_output=True, check=True,
        env=dict(env, STUNE_STANDIN_VALUES=str(values), SLURMD_NODENAME="n1"),
    ).stdout  # fmt: skip
    r = parse.nccl_tests(out)
    assert (r.status, r.value, r.extra["ranks"]) == ("ok", 100.0, 4)


# ---- the whole run against a stand-in Slurm -------------------------------------------------------------
PROFILE = f"""partition: hdr
fabric: {{type: tcp, socket_ifname: eth0}}
gpu: {{count: 4}}
active:
  checks:
    nccl_allreduce: {{time_limit: 2m}}
  tools:
    all_reduce_perf: {STANDINS}/all_reduce_perf
scaling:
  time_limit: 2m
  multinode_command: "all_reduce_perf -b 1G -e 8G -f 2 -g 1"
"""


class StandinSlurm:
    """Runs each submitted job's agent at once, as Slurm would start it on the job's nodes (a multi-node job's
    command stands for srun's tasks: SLURM_STEP_NUM_TASKS)."""

    def __init__(self, tmp_path: Path, names=("n1", "n2", "n3"), topology=""):
        self.tmp, self.names, self.submitted, self._topology = tmp_path, names, [], topology

    def nodes(self, names=None):
        return [SimpleNamespace(name=n, partitions=("hdr",), state="idle", drain=False) for n in self.names]

    def node_addresses(self):
        return {}

    def topology(self):
        return parse_records(self._topology)

    def jobs(self, job_ids=None):
        return []

    def submit(self, args, script=None):
        job = len(self.submitted) + 1
        self.submitted.append(args)
        nodes = args[args.index("--nodelist") + 1].split(",")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env.update(
            SLURM_JOB_ID=str(job), SLURM_JOB_NODELIST=",".join(nodes), SLURM_JOB_NUM_NODES=str(len(nodes))
        )
        if not args[args.index("--job-name") + 1].endswith(":node"):
            env["SLURM_STEP_NUM_TASKS"] = str(4 * len(nodes))
        out = args[args.index("--output") + 1].replace("%j", str(job))
        with open(out, "wb") as fh:
            subprocess.run(
                ["/bin/sh", "-c", script], stdout=fh, stderr=subprocess.STDOUT, env=env, check=False
            )
        return job


@pytest.fixture
def world(tmp_path, monkeypatch):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "hdr.yaml").write_text(PROFILE)
    monkeypatch.setenv("STUNE_STANDIN_VALUES", str(tmp_path / "values.json"))
    monkeypatch.setenv("STUNE_STANDIN_STATE", str(tmp_path))
    monkeypatch.setenv("STUNE_SYSFS_ROOT", str(tmp_path / "root"))

    def run(values, topology="", **kw):
        (tmp_path / "values.json").write_text(json.dumps({"all_reduce_perf": {"scaling": values}}))
        slurm = StandinSlurm(tmp_path, topology=topology)
        opts = scaling.Options("hdr", str(tmp_path / "store"), wait_s=5, **kw)
        out = scaling.run(slurm, load_profile("hdr", str(tmp_path / "p")), opts, log=lambda line: None)
        return out, slurm

    return run


def test_a_run_marks_the_knee_where_the_third_node_joins_under_another_switch(world, tmp_path):
    out, slurm = world(
        {"devices": {"1": 0, "2": 180, "4": 178}, "nodes": {"1": 170, "2": 165, "3": 60}},
        topology=TOPOLOGY,
    )
    node, nodes = out["curves"]
    assert node["verdict"] == "pass" and [p["n"] for p in node["points"]] == [1, 2, 4]
    assert nodes["verdict"] == "knee" and nodes["knee"]["nodes_added"] == ["n3"]
    assert nodes["knee"]["switches"] == ["s1", "s2"]
    assert len(slurm.submitted) == 4 and all(
        "--exclusive" in a and "--no-requeue" in a for a in slurm.submitted
    )
    assert scaling.exit_attention(out["curves"])
    text = scaling_out.text(out["curves"])
    assert (
        "<- knee" in text
        and "(algbw: reference only)" in text
        and "at the knee: joined: n3; switches: s1,s2" in text
    )
    scaling_out.png(str(tmp_path / "curve.png"), "hdr", out["curves"])
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert [r["scope"] for r in streams.load_scaling(str(tmp_path / "store"), "hdr")] == ["node", "nodes"]


def test_a_knee_inside_the_node_submits_no_multinode_job_and_says_why(world):
    out, slurm = world({"devices": {"1": 0, "2": 180, "4": 90}, "nodes": {"1": 170}})
    node, nodes = out["curves"]
    assert node["verdict"] == "knee" and len(slurm.submitted) == 1
    assert nodes["verdict"] == "skipped" and nodes["detail"].startswith(
        "not run: the single-node curve did not pass (knee"
    )
    assert scaling.exit_attention(out["curves"])


def test_a_curve_that_holds_everywhere_exits_0_and_max_nodes_caps_the_curve(world):
    out, slurm = world({"devices": {"1": 0, "2": 180, "4": 178}, "nodes": {"1": 170, "2": 165}}, max_nodes=2)
    assert [c["verdict"] for c in out["curves"]] == ["pass", "pass"] and len(slurm.submitted) == 3
    assert not scaling.exit_attention(out["curves"])


def test_a_missing_tool_is_unknown_and_gates_the_multinode_curve(world, tmp_path):
    (tmp_path / "p" / "hdr.yaml").write_text(
        PROFILE.replace(f"{STANDINS}/all_reduce_perf", "/nonexistent/all_reduce_perf")
    )
    out, slurm = world({"devices": {"2": 180}})
    node, nodes = out["curves"]
    assert node["verdict"] == "unknown" and node["points"][1]["status"] == "unavailable"
    assert nodes["verdict"] == "skipped" and len(slurm.submitted) == 1


def test_a_dry_run_submits_nothing_and_a_bad_placeholder_is_one_line(world, tmp_path):
    out, slurm = world({}, dry_run=True)
    assert out["dry_run"] and slurm.submitted == []
    (tmp_path / "p" / "hdr.yaml").write_text(PROFILE + '  command: "all_reduce_perf -g {devices}"\n')
    with pytest.raises(StuneError, match=r"hdr.yaml: scaling.command: unknown placeholder \{devices\}"):
        world({})


def test_the_cli_refuses_a_bad_max_nodes_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_tune.cli.sweep", "scaling", "-p", "hdr", "--max-nodes", "0", "--store", str(tmp_path)],
        capture_output=True, text=True, env=dict(os.environ, STUNE_PARTITIONS=str(REPO / "partitions")),
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "--max-nodes 0" in proc.stderr
