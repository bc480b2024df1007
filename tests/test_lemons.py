"""Lemon nodes (reliability/lemons.py): a planted lemon is found, a clean site flags nothing, the test holds
its family-wise error rate, a lemon's run-mates are not blamed for it, the numbers of a small history are the
ones worked out by hand, and the opt-in mark goes through the health hooks' marking."""

from __future__ import annotations

import json
import math
import random

import pytest
from reliability_history import T0, Site, generate

from slurm_tune.cli.health import main as health_main
from slurm_tune.health import apply
from slurm_tune.nodestate import DEGRADED_FEATURE, LEMON_COMMENT
from slurm_tune.reliability import causes, events, history, lemons, mark, stats
from slurm_tune.reliability.lemons import Policy
from slurm_tune.slurm import Node

HEADER = "|".join(history.FIELDS)


def run(site: Site, policy: Policy | None = None, with_events: bool = True) -> lemons.LemonReport:
    text, event_text = generate(site)
    runs = history.parse(text)
    found = causes.classify(runs, events.parse(event_text) if with_events else None)
    until = site.t0 + int(site.days * 86400)
    return lemons.score(runs, found, site.partition, site.t0, until, policy or Policy())


# ---- the planted lemon and the clean site ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(1, 7))
def test_a_planted_lemon_is_found_and_nothing_else(seed):
    site = Site(seed=seed, days=90, lemon="gpu017", lemon_ratio=10)
    report = run(site)
    assert [s.node for s in report.lemons] == ["gpu017"]
    (lemon,) = report.lemons
    assert lemon.ratio_low >= report.policy.margin  # flagged exactly when the bound clears the margin
    assert lemon.p_value <= lemon.threshold == pytest.approx(0.01 / report.nodes)
    assert lemon.ratio > 3 and lemon.failures >= lemon.localized > 0
    assert set(lemon.causes) <= {"hardware", "nccl", "node_failure"}
    failed = {j for j, culprit in site.planted.items() if culprit == "gpu017"}
    assert set(lemon.jobs) <= failed | set(site.planted)  # its evidence is failed runs it was in


@pytest.mark.parametrize("seed", range(1, 13))
def test_a_clean_site_flags_nothing(seed):
    report = run(Site(seed=seed, days=90))
    assert report.lemons == [] and report.nodes == 64 and report.failures > 100
    assert all(not s.lemon and s.p_value > s.threshold for s in report.closest)


def test_without_events_or_named_nodes_only_a_strong_lemon_shows():
    """Every failure laid on all its nodes (no events read, NCCL errors on every node): the evidence is
    thinner. A 20x lemon shows in most sites (its p-value is 1e-4 to 1e-10 against a level of 1.6e-4), never
    a wrong node; a 2x one does not (a margin of 1.5 on thin evidence)."""
    found = []
    for seed in range(1, 6):
        strong = run(
            Site(seed=seed, days=90, lemon="gpu030", lemon_ratio=20, localized=0.0), with_events=False
        )
        assert strong.localized == 0 and {s.node for s in strong.lemons} <= {"gpu030"}
        found += [s.node for s in strong.lemons]
    assert len(found) >= 4
    weak = run(Site(seed=4, days=90, lemon="gpu030", lemon_ratio=2, localized=0.0), with_events=False)
    assert weak.lemons == []


def test_run_mates_are_not_blamed_for_the_lemon():
    """Placed in fixed blocks, the lemon's neighbours share most of its failed runs; once it is explained
    away they are judged on the runs without it."""
    site = Site(seed=5, days=90, lemon="gpu033", lemon_ratio=15, sizes=(2, 4), localized=0.3)
    report = run(site)
    assert [s.node for s in report.lemons] == ["gpu033"]
    assert not {s.node for s in report.closest if s.lemon}


def test_the_false_lemon_rate_stays_below_alpha():
    """Holm at family-wise alpha: over many clean sites, the share with any lemon is at most alpha (here 0.2,
    so that a miscalibrated test shows in 60 sites; the bound is exceeded with probability < 1e-3 when the
    true rate is 0.2)."""
    policy = Policy(alpha=0.2, margin=1.0, min_failures=1)
    flagged = 0
    for seed in range(60):
        site = Site(seed=1000 + seed, nodes=16, days=20, jobs_per_day=20, sizes=(2, 4))
        flagged += bool(run(site, policy).lemons)
    assert flagged <= 22


def test_min_failures_and_the_window():
    site = Site(seed=2, days=90, lemon="gpu017", lemon_ratio=10)
    assert run(site, Policy(min_failures=10_000)).lemons == []
    text, _ = generate(site)
    runs = history.parse(text)
    found = causes.classify(runs)
    late = lemons.score(runs, found, "hdr", T0 + 200 * 86400, T0 + 230 * 86400, Policy())
    assert late.runs == 0 and late.nodes == 0 and late.lemons == [] and late.closest == []
    other = lemons.score(runs, found, "nope", T0, T0 + 90 * 86400, Policy())
    assert other.runs == 0 and other.lemons == []


# ---- a small history, by hand --------------------------------------------------------------------------------
def _small() -> tuple[history.Runs, causes.Causes]:
    rows, job = [HEADER], 100
    for hosts in ("a[1-2]", "c[1-2]"):
        for k in range(10):
            job += 1
            start = T0 + k * 2000
            state = (
                "NODE_FAIL"
                if (hosts == "a[1-2]" and k < 3) or (hosts == "c[1-2]" and k == 0)
                else "COMPLETED"
            )
            rows.append(f"{job}|{job}|u|p|{state}|{start}|{start + 1000}|1000|2|node=2|{hosts}|")
    text = "\n".join(rows) + "\n"
    ev = "".join(f"a1|{T0 + k * 2000 + 1000}|Unknown|DOWN|Not responding\n" for k in range(3))
    ev += f"c1|{T0 + 1000}|{T0 + 1500}|DOWN|Not responding\n"
    runs = history.parse(text)
    return runs, causes.classify(runs, events.parse(ev))


def test_the_numbers_of_a_small_history():
    """20 two-node runs of 1000 s (40,000 node-seconds), 4 NODE_FAILs each naming its node: 3 on a1, 1 on c1.
    lambda_B = 4 / 40,000 per node-second; a1 ran 10,000 s: its share is 1.0, at the margin 1.5, so
    p = P(Poisson(1.5) >= 3) = 1 - e^-1.5 (1 + 1.5 + 1.125); its ratio 3 (3 seen, 1 its share)."""
    runs, found = _small()
    assert [found.suspects[i] for i in sorted(found.suspects)] == [("a1",)] * 3 + [("c1",)]
    report = lemons.score(runs, found, "p", T0, T0 + 86400, Policy(min_failures=1))
    assert (report.runs, report.failures, report.localized, report.nodes) == (20, 4, 4, 4)
    assert report.node_hours == pytest.approx(40_000 / 3600)
    a1 = next(s for s in report.closest if s.node == "a1")
    assert a1.failures == 3 and a1.expected == pytest.approx(1.0) and a1.ratio == pytest.approx(3.0)
    assert a1.p_value == pytest.approx(1 - math.exp(-1.5) * 3.625, rel=1e-9)
    assert a1.threshold == pytest.approx(0.01 / 4) and not a1.lemon


def test_holm_steps_and_explaining_away_on_the_small_history():
    """With margin 1 and alpha 0.9: a1's p = P(Poisson(1) >= 3) = 1 - 2.5/e = 0.0803 <= 0.9/4 flags it; its
    runs leave the data; then c1 has 1 failure in 20,000 node-seconds, share 0.5: p = 1 - e^-0.5 = 0.393 >
    0.9/3, the procedure stops."""
    runs, found = _small()
    report = lemons.score(runs, found, "p", T0, T0 + 86400, Policy(alpha=0.9, margin=1.0, min_failures=1))
    assert [s.node for s in report.lemons] == ["a1"]
    assert report.lemons[0].p_value == pytest.approx(1 - 2.5 / math.e, rel=1e-9)
    c1 = next(s for s in report.closest if s.node == "c1")
    assert c1.p_value == pytest.approx(1 - math.exp(-0.5), rel=1e-9)
    assert c1.threshold == pytest.approx(0.9 / 3) and c1.expected == pytest.approx(0.5)
    assert {s.node for s in report.closest} == {"c1"}  # a2, c2 named in nothing: no failures


# ---- the statistics --------------------------------------------------------------------------------------------
def _exact_sf(k: int, mu: float) -> float:
    from fractions import Fraction

    # the upper tail summed exactly in rationals, for mu given as a rational
    m = Fraction(mu).limit_denominator(10**6)
    below = sum(m**i / math.factorial(i) for i in range(k))
    return float(1 - Fraction(math.exp(-float(m))) * below)


@pytest.mark.parametrize(
    "k, mu", [(1, 0.5), (3, 0.2), (10, 3.0), (10, 12.0), (5, 5.0), (30, 29.5), (2, 40.0)]
)
def test_the_poisson_tail_matches_exact_sums(k, mu):
    assert stats.poisson_sf(k, mu) == pytest.approx(_exact_sf(k, mu), rel=1e-9, abs=1e-15)


def test_the_poisson_tail_edges_and_bound():
    assert stats.poisson_sf(0, 3.0) == 1.0 and stats.poisson_sf(4, 0.0) == 0.0
    assert 0 < stats.poisson_sf(200, 10.0) < 1e-150  # tiny, not 0
    rng = random.Random(3)
    for _ in range(50):
        k, level = rng.randrange(1, 80), 10 ** -rng.uniform(1, 8)
        low = stats.poisson_lower_bound(k, level)
        assert 0 < low < k and stats.poisson_sf(k, low) == pytest.approx(level, rel=1e-6)
    assert stats.poisson_lower_bound(0, 0.01) == 0.0


def test_fisher_and_holm():
    assert stats.fisher([0.5]) == pytest.approx(0.5)
    p = 0.01 * 0.2
    assert stats.fisher([0.01, 0.2]) == pytest.approx(p * (1 - math.log(p)))  # chi2(4) tail, closed form
    assert stats.fisher([1.0, 1.0]) == 1.0 and stats.fisher([]) == 1.0
    assert [stats.holm_threshold(0.01, 4, s) for s in range(4)] == pytest.approx(
        [0.0025, 0.01 / 3, 0.005, 0.01]
    )


def test_the_policy_defaults_are_the_profile_schemas():
    from slurm_tune.profilecheck import PROFILE_SCHEMA
    from slurm_tune.schema import Where

    health = PROFILE_SCHEMA.fields["health"].complete({}, "health", Where("test"))
    assert Policy() == Policy.from_health(type("H", (), health))


# ---- marking -------------------------------------------------------------------------------------------------
def _node(name, comment="", features="", drain=False, reason=""):
    return Node(
        name,
        "idle",
        ("DRAIN",) if drain else (),
        reason,
        "root",
        0,
        features,
        features,
        comment,
        ("hdr",),
        "",
        "",
        "",
    )


class FakeSlurm:
    def __init__(self, nodes):
        self.table = {n.name: n for n in nodes}
        self.updates = []

    def nodes(self):
        return list(self.table.values())

    def update_node(self, name, **fields):
        self.updates.append((name, fields))


def _report(*names):
    scores = [lemons.NodeScore(n, 9, 2.0, 4.5, 2.1, 1e-6, 1e-4, True, 100.0, 40, 5, 2) for n in names]
    return lemons.LemonReport(
        "hdr", T0, T0 + 30 * 86400, Policy(mark=True), 100, 1e4, 20, 10, 10, 10, True, scores
    )


def test_marking_goes_through_the_hooks_plan_and_clears_only_its_own(tmp_path):
    import healthkit as kit

    profile = kit.profile("hdr")  # drain_max_fraction 0.1
    nodes = [_node(f"n{i}") for i in range(1, 21)]
    nodes[1] = _node("n2", comment=f"{LEMON_COMMENT}: 5 failed", features=f"gpu,{DEGRADED_FEATURE}")
    nodes[2] = _node("n3", comment="stune: degraded: mlx5_2/1 rate", features=DEGRADED_FEATURE)
    nodes[3] = _node("n4", drain=True, reason="stune: gpu3 Xid 79")
    nodes[4] = _node("n5", drain=True, reason="bad DIMM", features="gpu")
    slurm = FakeSlurm(nodes)
    lines = mark.apply_marks(slurm, _report("n1", "n3", "n4"), profile)
    updates = dict(slurm.updates)
    assert updates["n1"] == {"features": [DEGRADED_FEATURE], "comment": updates["n1"]["comment"]}
    assert updates["n1"]["comment"].startswith(f"{LEMON_COMMENT}: 9 failed multi-node runs in 30 d, 4.5x")
    assert updates["n2"] == {"features": ["gpu"], "comment": ""}  # no longer a lemon: its own mark cleared
    assert "n3" not in updates and "n4" not in updates  # marked or drained by another part of stune
    assert not any("state" in f for f in updates.values())  # never drains, never resumes
    assert any("n4: lemon, drained by stune" in line for line in lines)
    # an admin's drain is left, the node marked beside it; the cap is 10 % of 20 nodes: 2 marks
    slurm = FakeSlurm(nodes)
    lines = mark.apply_marks(slurm, _report("n5", "n6", "n7"), profile)
    assert [name for name, _ in slurm.updates] == ["n5", "n6", "n2"]
    assert any("at most 2 of 20 nodes are" in line and "n7" in line for line in lines)
    dry = FakeSlurm(nodes)
    assert mark.apply_marks(dry, _report("n1"), profile, dry_run=True) and dry.updates == []


def test_the_passive_run_leaves_a_lemon_mark_alone():
    marked = _node("n1", comment=f"{LEMON_COMMENT}: 9 failed", features=DEGRADED_FEATURE)
    fields, notes = apply.plan(marked, apply.Want(apply.CLEAR, ""), "none")
    assert fields == {} and "lemon" in notes[0]
    fields, _ = apply.plan(marked, apply.Want(apply.CLEAR, ""), "none", keep_active=False)
    assert fields == {"features": [], "comment": ""}


# ---- the command ---------------------------------------------------------------------------------------------
def test_the_command_on_a_dump(tmp_path, capsys, monkeypatch):
    import healthkit as kit

    monkeypatch.setenv("STUNE_PARTITIONS", str(kit.REPO / "partitions"))
    site = Site(seed=3, days=90, lemon="gpu017")
    text, event_text = generate(site)
    (tmp_path / "dump").write_text(text)
    (tmp_path / "events").write_text(event_text)
    argv = ["lemons", "--sacct-file", str(tmp_path / "dump"), "--events-file", str(tmp_path / "events")]
    assert health_main([*argv, "--window", "90d"]) == 3  # EXIT_ATTENTION: a person should look
    out = capsys.readouterr().out
    assert "1 lemon(s): gpu017" in out and out.splitlines()[3].split()[:2] == ["yes", "gpu017"]
    assert health_main([*argv, "--window", "90d", "--json", "-p", "hdr"]) == 3
    doc = json.loads(capsys.readouterr().out)
    (part,) = doc["partitions"]
    assert part["partition"] == "hdr" and [s["node"] for s in part["lemons"]] == ["gpu017"]
    clean, _ = generate(Site(seed=3, days=90))
    (tmp_path / "clean").write_text(clean)
    assert health_main(["lemons", "--sacct-file", str(tmp_path / "clean"), "--window", "90d"]) == 0
    assert "no lemon" in capsys.readouterr().out
    assert health_main([*argv, "--mark"]) == 1  # a dump marks nothing without --cluster
    assert "--cluster" in capsys.readouterr().err
