"""Per-job charges: Slurm's decay, eta and coverage rules, and the penalty (penalties only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.errors import ConfigError
from slurm_tune.fairshare import charges
from slurm_tune.fairshare.sacct import FIELDS, parse

HL = 7 * 86400.0


def slurm_decay_loop(jobs, as_of, half_life, period=60):
    """Slurm's decay thread, literally: every period, decay all usage by d^period, then add each running job's
    run_delta * d^run_delta * rate (priority_multifactor.c, _apply_new_usage)."""
    d = 1 - 0.693 / half_life
    t = min(s for s, _, _ in jobs) // period * period
    usage = 0.0
    while t < as_of:
        nxt = min(t + period, as_of)
        usage *= d ** (nxt - t)
        for s, e, rate in jobs:
            delta = min(e, nxt) - max(s, t)
            if delta > 0:
                usage += delta * d**delta * rate
        t = nxt
    return usage


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30 * 86400), st.integers(60, 3 * 86400), st.integers(1, 64)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 20 * 86400),
)
def test_decay_integral_matches_slurms_decay_loop(jobs, after):
    spans = [(s, s + length, rate) for s, length, rate in jobs]
    as_of = max(e for _, e, _ in spans) + after
    ours = sum(rate * float(charges.decayed_seconds(s, e, as_of, HL)) for s, e, rate in spans)
    assert ours == pytest.approx(slurm_decay_loop(spans, as_of, HL), rel=2e-3)


def test_no_half_life_means_no_decay():
    assert charges.decayed_seconds(100, 400, 10**9, 0).tolist() == 300.0
    assert charges.decay_to(5.0, 10**6, 0) == 5.0
    assert charges.decay_to(8.0, HL, HL) == pytest.approx(4.0, rel=1e-3)


def _table(rows):
    return parse("\n".join(["|".join(FIELDS), *rows]) + "\n")


def _row(job, gpus=2, billing=2, comment="", elapsed=3600, start=1000):
    return (
        f"{job}|{job}|u|a|p|normal|COMPLETED|{start}|{start + elapsed}|{elapsed}|"
        f"billing={billing},gres/gpu={gpus}|{comment}"
    )


def _summary(held, used, cov):
    return f"stune1 held={held} used={used} cov={cov} busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="


def test_eta_rules():
    t = _table(
        [
            _row(1, comment=_summary(7200, 720, 7200)),  # measured 10 %, full coverage
            _row(2),  # no summary: eta 1
            _row(3, comment=_summary(7200, 100, 1000)),  # 14 % coverage: not trusted, eta 1
            _row(4, gpus=0, comment=_summary(0, 0, 0)),  # no GPUs: eta 1
            _row(5, comment=_summary(7200, 9000, 7200)),  # over 100 %: out of range, unmeasured (eta 1)
            _row(6, comment="someone else's note"),
        ]
    )
    eta, seen, coverage, trusted, source = charges.measured_eta(t, coverage_min=0.8)
    assert eta.tolist() == pytest.approx([0.1, 1, 1, 1, 1, 1])
    assert trusted.tolist() == [True, False, False, False, False, False]
    assert t.bad_summary.tolist() == [False, False, False, False, True, False]
    assert source.tolist() == [1, 0, 0, 0, 0, 0]
    assert coverage[0] == 1.0 and coverage[2] == pytest.approx(1000 / 7200)
    assert seen[2] == pytest.approx(0.1)  # the report still shows what little was seen


def test_charge_is_slurms_times_the_idle_penalty():
    t = _table([_row(1, comment=_summary(7200, 720, 7200)), _row(2)])
    ch = charges.compute(t, np.array([True, True]), as_of=4600, half_life_s=0, alpha=2.0, coverage_min=0.8)
    assert ch.slurm.tolist() == [2 * 3600, 2 * 3600]
    assert ch.stune.tolist() == pytest.approx([2 * 3600 * (1 + 2.0 * 0.9), 2 * 3600])
    gpu_basis = charges.compute(
        t,
        np.array([True, True]),
        as_of=4600,
        half_life_s=0,
        alpha=2.0,
        coverage_min=0.8,
        basis="gpu",
        qos_usage_factor={"normal": 0.5},
    )
    assert gpu_basis.slurm.tolist() == [2 * 3600 * 0.5] * 2


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 8), st.integers(0, 100_000), st.floats(0, 2), st.floats(0, 1.2), st.booleans()
        ),
        min_size=1,
        max_size=20,
    ),
    st.floats(0, 10),
    st.floats(0, 1),
)
def test_penalties_only(rows, alpha, coverage_min):
    """Whatever the summaries say (even lies over 100 %), no job is charged less than Slurm charges it."""
    lines = []
    for i, (gpus, elapsed, util, cov, has) in enumerate(rows):
        held = gpus * elapsed
        comment = _summary(held, util * cov * held, cov * held) if has else ""
        lines.append(_row(i + 1, gpus=gpus, elapsed=elapsed, comment=comment))
    t = _table(lines)
    ch = charges.compute(
        t, np.ones(t.n, dtype=bool), as_of=200_000, half_life_s=HL, alpha=alpha, coverage_min=coverage_min
    )
    assert np.all(ch.stune >= ch.slurm)
    assert np.all((ch.eta >= 0) & (ch.eta <= 1))


def test_alpha_per_qos_partition_and_account_with_exemptions(tmp_path):
    """The first of QOS, partition, account that names the job sets its alpha; 0 exempts it."""
    from slurm_tune.usage.config import load_config

    config_file = tmp_path / "fs.yaml"
    config_file.write_text(
        "accountant:\n  alpha: 1.0\n  alpha_by:\n    qos: {debug: 0}\n"
        "    partition: {cheap: 0.5}\n    account: {bio: 3.0}\n"
    )
    config = load_config(str(config_file))
    header = "JobIDRaw|User|Account|Partition|QOS|State|Start|End|ElapsedRaw|AllocTRES|AdminComment"
    s = _summary(7200, 0, 7200)  # idle the whole time
    rows = [
        f"1|u|phys|gpu|normal|COMPLETED|0|3600|3600|billing=2,gres/gpu=2|{s}",
        f"2|u|phys|gpu|debug|COMPLETED|0|3600|3600|billing=2,gres/gpu=2|{s}",
        f"3|u|phys|cheap|normal|COMPLETED|0|3600|3600|billing=2,gres/gpu=2|{s}",
        f"4|u|bio|gpu|normal|COMPLETED|0|3600|3600|billing=2,gres/gpu=2|{s}",
        f"5|u|bio|cheap|debug|COMPLETED|0|3600|3600|billing=2,gres/gpu=2|{s}",
    ]
    t = parse("\n".join([header, *rows]) + "\n")
    ch = charges.compute(
        t,
        np.ones(5, dtype=bool),
        as_of=3600,
        half_life_s=0,
        alpha=config.accountant.alpha,
        coverage_min=0.8,
        alpha_by=config.accountant.alpha_by,
    )
    assert (ch.stune / ch.slurm).tolist() == pytest.approx([2.0, 1.0, 1.5, 4.0, 1.0])
    bad = tmp_path / "bad.yaml"
    bad.write_text("accountant:\n  alpha_by:\n    qos: {debug: -1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: accountant.alpha_by.qos.debug: -1 is below"):
        load_config(str(bad))
