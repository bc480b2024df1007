"""Baselines, outliers, k-of-n, fingerprints, pair blame and bisection: the pure judging functions."""

from __future__ import annotations

import random

from slurm_tune.active import judge as active_judge
from slurm_tune.active import report

FP = {"driver": "535.104.05", "cuda": "12.2", "nccl": "2.19.3", "hca_fw": "20.31.1014", "kernel": "5.15.0"}
SETTINGS = active_judge.Settings(k=2, n=3, mad_factor=3.0, min_drop=0.10, min_peers=3, floors={})


def result(subject, value, sweep, at, check="nccl_allreduce", fp=FP, status="ok"):
    return {
        "at": at,
        "sweep": sweep,
        "check": check,
        "subject": subject,
        "status": status,
        "value": value,
        "unit": "GB/s",
        "detail": "",
        "fingerprint": dict(fp),
    }


def fleet(values_by_node: dict, sweeps=1, runs=3, start=1000.0, fp=FP):
    """values_by_node: node -> list of values per run (len = runs*sweeps) or a constant."""
    rng = random.Random(7)
    out, at = [], start
    for s in range(sweeps):
        for node, vals in values_by_node.items():
            for r in range(runs):
                v = vals[s * runs + r] if isinstance(vals, list) else vals * (1 + rng.uniform(-0.01, 0.01))
                out.append(result(node, v, f"s{s}", at, fp=fp))
                at += 1
    return out


def verdict(verdicts, subject):
    return next(v for v in verdicts if v.subject == subject)


def test_two_of_three_slow_runs_is_an_outlier_with_reason():
    nodes = {f"n{i}": 100.0 for i in range(1, 10)}
    nodes["n7"] = [70.0, 100.0, 70.0]
    _bases, verdicts = active_judge.judge(fleet(nodes), SETTINGS)
    v = verdict(verdicts, "n7")
    assert v.status == active_judge.OUTLIER and v.slow == 2 and v.runs == 3
    assert "70 GB/s vs partition median 99." in v.reason or "partition median 100" in v.reason
    assert "2 of 3 runs slow" in v.reason
    assert all(x.status == active_judge.OK for x in verdicts if x.subject != "n7")


def test_one_slow_run_marks_nothing():
    nodes = {f"n{i}": 100.0 for i in range(1, 10)}
    nodes["n3"] = [100.0, 70.0, 100.0]
    _, verdicts = active_judge.judge(fleet(nodes), SETTINGS)
    assert verdict(verdicts, "n3").status == active_judge.OK and verdict(verdicts, "n3").slow == 1


def test_a_passing_later_sweep_clears():
    nodes = {f"n{i}": 100.0 for i in range(1, 6)}
    nodes["n2"] = [70.0, 70.0, 70.0, 100.0, 100.0, 100.0]
    _, verdicts = active_judge.judge(fleet(nodes, sweeps=2), SETTINGS)
    v = verdict(verdicts, "n2")
    assert v.status == active_judge.OK
    # and the first sweep alone made it an outlier
    _, first = active_judge.judge([r for r in fleet(nodes, sweeps=2) if r["sweep"] == "s0"], SETTINGS)
    assert verdict(first, "n2").status == active_judge.OUTLIER


def test_floor_applies_without_peers_and_below_the_median():
    rows = fleet({"a": [50.0, 50.0, 50.0]})
    s = SETTINGS._replace(floors={"nccl_allreduce": 80.0})
    assert verdict(active_judge.judge(rows, s)[1], "a").status == active_judge.OUTLIER
    assert verdict(active_judge.judge(rows, SETTINGS)[1], "a").status == active_judge.UNKNOWN


def test_noise_within_mad_margin_is_not_slow():
    rng = random.Random(1)
    nodes = {f"n{i}": [100 * (1 + rng.uniform(-0.05, 0.05)) for _ in range(3)] for i in range(50)}
    _, verdicts = active_judge.judge(fleet(nodes), SETTINGS)
    assert all(v.status == active_judge.OK for v in verdicts)


def test_changed_driver_starts_a_new_baseline():
    old = fleet({f"n{i}": 100.0 for i in range(1, 6)})
    new_fp = dict(FP, driver="550.54.15")
    # after the upgrade the whole partition runs at 80: judged against the old baseline all would be slow
    new = fleet({f"n{i}": 80.0 for i in range(1, 6)}, start=5000.0, fp=new_fp)
    bases, verdicts = active_judge.judge(old + new, SETTINGS)
    assert all(v.status == active_judge.OK for v in verdicts)
    (base,) = bases.values()  # only the new fingerprint's group: the old results no longer judge anyone
    assert round(base.median) == 80 and "driver=550.54.15" in base.fingerprint
    assert all(v.fingerprint["driver"] == "550.54.15" for v in verdicts)
    drift = report.drift(old + new)
    assert len(drift) == 5 and drift[0]["changed"] == "driver 535.104.05 -> 550.54.15"
    assert drift[0]["before"] > 99 and drift[0]["after"] < 81


def test_one_upgraded_node_alone_is_not_judged_against_the_old_driver():
    rows = fleet({f"n{i}": 100.0 for i in range(1, 6)})
    rows += fleet({"n1": 60.0}, start=9000.0, fp=dict(FP, driver="550.54.15"))
    v = verdict(active_judge.judge(rows, SETTINGS)[1], "n1")
    assert v.status == active_judge.UNKNOWN and "no baseline" in v.reason


def test_tool_failure_counts_as_slow_for_pass_fail_checks():
    rows = [result(f"n{i}", None, "s0", 10 + i, check="dcgm_diag") for i in range(5)]
    rows += [result("n9", None, "s0", 20 + r, check="dcgm_diag", status="fail") for r in range(2)]
    _, verdicts = active_judge.judge(rows, SETTINGS)
    assert verdict(verdicts, "n9").status == active_judge.OUTLIER
    assert verdict(verdicts, "n1").status == active_judge.OK


def test_pair_blame_names_a_node_slow_with_two_partners():
    nodes = [f"n{i}" for i in range(1, 9)]
    pairs = [
        ("n1", "n2"),
        ("n3", "n4"),
        ("n5", "n6"),
        ("n7", "n8"),
        ("n2", "n3"),
        ("n4", "n5"),
        ("n6", "n7"),
        ("n8", "n1"),
    ]
    values = {f"{a}+{b}": (60.0 if "n5" in (a, b) else 190.0) for a, b in pairs}
    _, verdicts = active_judge.judge(fleet(values), SETTINGS)
    named, still_open = active_judge.blame_pairs(verdicts)
    assert set(named) == {"n5"} and not still_open
    assert nodes


def test_bisection_plan_and_verdict():
    slow = active_judge.Verdict("n1+n2", "ib_write_bw", active_judge.OUTLIER, "", 60.0, None, 3, 3, FP)
    plan = active_judge.bisect_plan([slow], ["n3", "n4", "n5"])
    assert plan == [("n1", "n3"), ("n2", "n4")]
    members, why = active_judge.bisect_verdict(
        "n1+n2", {"n1": (False, "n3", "190"), "n2": (True, "n4", "60")}
    )
    assert members == ["n2"] and "n2: slow with known-good n4" in why
    members, why = active_judge.bisect_verdict("n1+n2", {"n1": (False, "n3", ""), "n2": (False, "n4", "")})
    assert members == [] and "path between" in why


def test_report_rows_show_node_against_baseline():
    nodes = {f"n{i}": 100.0 for i in range(1, 6)}
    nodes["n4"] = [70.0, 70.0, 100.0]
    data = report.rows(fleet(nodes), SETTINGS)
    row = next(d for d in data if d["subject"] == "n4")
    assert (
        row["status"] == active_judge.OUTLIER
        and abs(row["baseline"] - 100) < 1.5
        and abs(row["ratio"] - 0.7) < 0.02
    )
    text = report.table(data, report.COLUMNS)
    assert "n4" in text and "outlier" in text
    prom = report.prometheus("hdr", data)
    assert 'stune_active_outlier{partition="hdr",check="nccl_allreduce",subject="n4"} 1' in prom
    assert report.to_csv(data, report.COLUMNS).splitlines()[0].startswith("check,subject,status")


def test_per_hca_pair_subjects_name_the_node_and_its_hca():
    pairs = [
        ("n1", "n2"),
        ("n3", "n4"),
        ("n5", "n6"),
        ("n7", "n8"),
        ("n2", "n3"),
        ("n4", "n5"),
        ("n6", "n7"),
        ("n8", "n1"),
    ]
    values = {}
    for a, b in pairs:
        for hca in ("mlx5_0", "mlx5_3"):
            values[f"{a}+{b}/{hca}"] = 90.0 if "n5" in (a, b) and hca == "mlx5_3" else 190.0
    rows = [dict(r, check="ib_write_bw") for r in fleet(values)]
    _, verdicts = active_judge.judge(rows, SETTINGS)
    named, still_open = active_judge.blame_pairs(verdicts)
    assert list(named) == ["n5"] and not still_open
    assert named["n5"].startswith("active ib_write_bw: slow on mlx5_3 with 2 partners")
    members, why = active_judge.bisect_verdict(
        "n1+n2/mlx5_3", {"n1": (True, "n4", "90 Gb/s"), "n2": (False, "n6", "")}
    )
    assert members == ["n1"] and why.startswith("n1 mlx5_3: slow with known-good n4")


def test_report_lists_checks_that_could_not_run():
    rows = fleet({f"n{i}": 100.0 for i in range(1, 4)})
    rows.append(
        dict(
            result("n1", None, "s0", 5000, check="dcgm_diag", status="unavailable"),
            detail="dcgmi not found: install DCGM",
        )
    )
    data = report.rows(rows, SETTINGS)
    row = next(d for d in data if d["check"] == "dcgm_diag")
    assert row["status"] == "unavailable" and "install DCGM" in row["reason"]
    assert 'stune_active_outlier{partition="p",check="dcgm_diag",subject="n1"} -1' in report.prometheus(
        "p", data
    )


def test_bisection_runs_are_never_judged_as_subjects_of_their_own():
    """Sweep s0: pair n3+n1 slow; the bisection measured n3+n2 (slow: n3 is at fault) and n1+n2 once. Sweep s1
    (n3 repaired): every regular pair passes. The one-off n3+n2 is never measured again: judged as a subject
    it would stay an outlier for the whole window and be re-bisected every sweep (a 'faulty cable' between two
    good nodes); and its n1+n2 run must not count for the regular pair n1+n2."""
    rows = fleet({"n1+n2": 190.0, "n3+n1": [60.0] * 3 + [190.0] * 3}, sweeps=2)
    rows = [dict(r, check="nccl_pair") for r in rows]
    at = max(r["at"] for r in rows if r["sweep"] == "s0") + 0.5
    for subject, value in (("n3+n2", 60.0), ("n1+n2", 60.0)):
        for _run in range(3):
            rows.append(dict(result(subject, value, "s0-bisect", at, check="nccl_pair"), bisect=True))
            at += 0.01
    rows.sort(key=lambda r: r["at"])
    _, verdicts = active_judge.judge(
        rows, active_judge.Settings(k=2, n=3, mad_factor=3.0, min_drop=0.10, min_peers=2, floors={})
    )
    assert {v.subject for v in verdicts} == {"n1+n2", "n3+n1"}
    assert all(v.status == active_judge.OK for v in verdicts), verdicts
    assert verdict(verdicts, "n1+n2").runs == 3 and verdict(verdicts, "n1+n2").slow == 0
    named, still_open = active_judge.blame_pairs(verdicts)
    assert not named and not still_open


def test_a_node_named_through_its_pairs_is_cleared_when_its_pairs_pass():
    from slurm_tune.active.sweep import node_verdicts

    def pair(subject, status, check="iperf3"):
        return active_judge.Verdict(subject, check, status, "", 9.0, None, 0, 3, FP)

    passing = [pair("n1+n2", active_judge.OK), pair("n3+n1", active_judge.OK)]
    wants = node_verdicts(passing, {})
    assert wants["n3"] == ("ok", "", frozenset({"iperf3"})) and wants["n1"][0] == "ok"
    # one of its pairs still slow (and not resolved): left as it is, neither marked nor cleared
    wants = node_verdicts([pair("n1+n2", active_judge.OK), pair("n3+n1", active_judge.OUTLIER)], {})
    assert "n3" not in wants and "n1" not in wants and wants["n2"][0] == "ok"
    # named through its pairs: degraded, whatever its other pairs say
    wants = node_verdicts(passing, {"n3": "active iperf3: slow with 2 partners"})
    assert wants["n3"] == ("degraded", "active iperf3: slow with 2 partners", None)
    # a node check's verdict decides for the node (its outlier is never cleared by passing pairs)
    node_outlier = active_judge.Verdict(
        "n3", "nccl_allreduce", active_judge.OUTLIER, "active nccl_allreduce: slow", 70.0, None, 2, 3, FP
    )
    assert node_verdicts([*passing, node_outlier], {})["n3"][0] == "degraded"
