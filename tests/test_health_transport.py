"""The transport family (health/transport.py): a node whose multi-node jobs keep falling back is degraded,
with the jobs as evidence; passing jobs and time clear it; a garbled record is never trusted."""

from __future__ import annotations

import math

from healthkit import profile

from slurm_tune.health import judge, result, transport

NOW = 1_800_000_000.0
DAY = 86400.0


def state_with(*jobs, users: int = 2) -> dict:
    state: dict = {}
    for i, (status, age) in enumerate(jobs):
        why = f"NET/Socket over eth0 (job {100 + i})"
        transport.record(state, str(100 + i), 1000 + i % users, status, why, NOW - age)
    return state


def one(state: dict, **kw) -> result.Result | None:
    found, _ = transport.check({}, profile("hdr"), state, now=NOW)
    assert len(found) <= 1
    return found[0] if found else None


def test_three_fallbacks_within_the_window_degrade_the_node():
    r = one(
        state_with(("fallback", 3600), ("ok", 3000), ("fallback", 2000), ("no_gdr", 1000), ("fallback", 10))
    )
    # the ok job at -3000 s clears the one before it: three after it
    assert r is not None and r.status == result.DEGRADED
    assert "fell back to sockets and ran without GPUDirect RDMA" in r.message
    assert "in 3 multi-node jobs" in r.message and "jobs 102, 103, 104" in r.message
    assert "expected at most 2" in r.message and r.reason == "NCCL fell back to sockets in 3 jobs (last 104)"


def test_a_passing_job_after_the_fallbacks_clears_it():
    r = one(state_with(("fallback", 300), ("fallback", 200), ("fallback", 100), ("ok", 50)))
    assert r is not None and r.status == result.OK and r.message.startswith("0 of 4")


def test_old_fallbacks_drop_out_of_the_window():
    r = one(state_with(("fallback", 8 * DAY), ("fallback", 7.5 * DAY), ("fallback", 10)))
    assert r is not None and r.status == result.OK and r.message.startswith("1 of 1")


def test_jobs_not_judged_count_for_nothing():
    r = one(state_with(("not_judged", 30), ("unknown", 20), ("errors", 10), ("fallback", 5)))
    assert r is not None and r.status == result.OK and r.message.startswith("1 of 4")


def test_nothing_recorded_nothing_said_and_zero_disables(tmp_path):
    assert one({}) is None
    from healthkit import profile_dir

    off = profile_dir(tmp_path / "p", {"hdr.yaml": [("health:\n", "health:\n  comm_degrade_after: 0\n")]})
    state = state_with(("fallback", 3), ("fallback", 2), ("fallback", 1))
    found, _ = transport.check({}, profile("hdr", off), state, now=NOW)
    assert found == []


def test_the_record_is_bounded_and_a_job_recorded_twice_is_one():
    state: dict = {}
    for i in range(50):
        transport.record(state, str(i), 1000, "fallback", "x" * 1000, NOW)
    transport.record(state, "49", 1000, "ok", "passed", NOW)
    assert len(state["comm_jobs"]) == transport.COMM_JOBS_KEPT
    assert state["comm_jobs"][-1] == ["49", NOW, "ok", "passed", 1000]
    assert all(len(j[3]) <= transport.WHY_MAX for j in state["comm_jobs"])


def test_a_garbled_record_is_dropped_never_trusted():
    bad = [
        ["1", math.nan, "fallback", "", 1],
        ["2", math.inf, "fallback", "", 2],
        ["3", "yesterday", "fallback", "", 3],
        [4, NOW, "fallback", "", 4],
        ["5", NOW, "fallback", 5],
        "fallback",
        None,
        ["6", -1, "fallback", "", 6],
        ["7", NOW, "fallback", "", "root"],
        ["8", NOW, "fallback", ""],
    ]
    assert one({"comm_jobs": bad}) is None
    assert one({"comm_jobs": "not a list"}) is None


def test_the_family_runs_in_the_judge_and_its_finding_is_the_verdicts():
    state = state_with(("fallback", 30), ("fallback", 20), ("fallback", 10))
    verdict, _ = judge.judge({}, profile("hdr"), state)
    assert any(r.check == "transport.fallback" and r.status == result.DEGRADED for r in verdict.results)


def test_the_periodic_runs_metrics_count_the_fallbacks():
    from slurm_tune.health import outputs

    state = state_with(("fallback", 300), ("ok", 200), ("fallback", 100), ("no_gdr", 50), ("not_judged", 10))
    counts = transport.counts(state, profile("hdr"), NOW)
    assert counts == {"fallbacks": 2, "judged": 5}
    verdict, _ = judge.judge({}, profile("hdr"), {})
    text = outputs.prometheus(outputs.report("n3", "hdr", "p", "run", NOW, verdict, {"transport": counts}))
    assert 'stune_health_transport_fallbacks{node="n3",partition="hdr"} 2' in text
    assert 'stune_health_transport_judged{node="n3",partition="hdr"} 5' in text


def test_one_users_jobs_alone_never_mark_the_node():
    """The logs are the users' own files: one user could write fallbacks into them."""
    r = one(state_with(("fallback", 30), ("fallback", 20), ("fallback", 10), ("fallback", 5), users=1))
    assert r is not None and r.status == result.OK and "one user's jobs only" in r.message
