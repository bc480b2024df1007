"""One bad summary or row never stops the accountant or skews it: generated summaries (finite, NaN, inf,
negative, out of range, truncated, byte garbage) and damaged sacct rows, thousands of cases each.

Properties: parsing never raises; a summary is trusted only when its numbers are finite and in range, and
then eta is its used / covered; every other summary is unmeasured (eta = 1, charged as Slurm charges) and
counted; a row with an unreadable Start/End is skipped and counted; every charge is finite and at least
Slurm's own."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.fairshare import accountant, charges
from slurm_tune.fairshare.sacct import FIELDS, parse
from slurm_tune.usage.config import load_config

HEADER = "|".join(FIELDS)
SUMMARY_CASES = 2500
ROW_CASES = 2000

numbers = st.one_of(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["nan", "inf", "-inf", "-1.0", "1e400", "", "-", "0x10", "1,5", "9" * 5000, "١٢"]),
)


def _text(value) -> str:
    return value if isinstance(value, str) else repr(float(value))


def _reads_as(text: str):
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


@st.composite
def summaries(draw):
    held, used, cov, busy = (draw(numbers) for _ in range(4))
    busy_w = draw(st.one_of(st.just("-"), numbers))
    text = (
        f"stune1 held={_text(held)} used={_text(used)} cov={_text(cov)} busy={_text(busy)} "
        f"busy_w={_text(busy_w)} gpus=2 nodes=1/1 per_gpu=n1/0:50.0:1.0:10:60.0"
    )
    cut = draw(st.one_of(st.none(), st.integers(min_value=7, max_value=len(text))))
    if cut is not None:
        text = text[:cut]
    junk = draw(st.one_of(st.none(), st.binary(min_size=1, max_size=12)))
    if junk is not None:  # bytes as a dump read with errors="replace" would give them
        at = draw(st.integers(min_value=7, max_value=len(text)))
        text = text[:at] + junk.decode("utf-8", "replace").replace("|", "/").replace("\n", " ") + text[at:]
    text = (
        text.replace("\r", " ")
        .replace("\x0b", " ")
        .replace("\x0c", " ")
        .replace("\x1c", " ")
        .replace("\x1d", " ")
        .replace("\x1e", " ")
        .replace("\x85", " ")
        .replace("\u2028", " ")
        .replace("\u2029", " ")
    )
    return text, cut is not None or junk is not None


def _expected_trust(text: str) -> bool:
    """Trusted iff the five head numbers read as finite, non-negative, used and busy within covered."""
    fields = dict(token.split("=", 1) for token in text[7:].split(" ") if "=" in token)
    values = [_reads_as(fields.get(k, "")) for k in ("held", "used", "cov", "busy")]
    if any(v is None or not math.isfinite(v) or v < 0 for v in values):
        return False
    _held, used, cov, busy = values
    watts = fields.get("busy_w", "-")
    if watts not in ("-", ""):  # '-' (and NaN) mean "no busy time"; otherwise a finite, non-negative mean
        w = _reads_as(watts)
        if w is None or math.isinf(w) or w < 0:
            return False
    return used <= cov * 1.001 + 0.1 and busy <= cov * 1.001 + 0.1


def _row(job: int, comment: str, start="1000", end="4600", elapsed="3600") -> str:
    return (
        f"{job}|{job}|u{job % 3}|acct{job % 2}|gpu|normal|COMPLETED|{start}|{end}|{elapsed}|"
        f"billing=2,gres/gpu=2|{comment}"
    )


@settings(max_examples=SUMMARY_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(summaries(), min_size=1, max_size=4))
def test_generated_summaries_are_trusted_only_when_sane(cases):
    texts = [text for text, _ in cases]
    table = parse("\n".join([HEADER, *(_row(i, t) for i, t in enumerate(texts, start=1))]) + "\n")
    assert table.n == len(texts)
    eta, _seen, _coverage, trusted, _source = charges.measured_eta(table, coverage_min=0.0)
    assert np.isfinite(eta).all() and ((eta >= 0) & (eta <= 1)).all()
    for i, text in enumerate(texts):
        if table.has_summary[i]:
            # trusted summaries are sane (the per-row parser may also read damaged tails: that is fine)
            assert np.isfinite([table.held_s[i], table.used_s[i], table.covered_s[i]]).all()
            assert table.used_s[i] >= 0 and table.covered_s[i] >= 0
            assert not table.bad_summary[i]
        else:
            assert table.bad_summary[i]
            assert eta[i] == 1.0 and not trusted[i]
        if not cases[i][1]:  # undamaged text: trusted exactly when its numbers are sane
            assert bool(table.has_summary[i]) == _expected_trust(text), text
            if table.has_summary[i] and table.covered_s[i] > 0:
                assert eta[i] == pytest.approx(min(table.used_s[i] / table.covered_s[i], 1.0))
    ch = charges.compute(
        table, np.ones(table.n, dtype=bool), as_of=5000, half_life_s=86400, alpha=1.0, coverage_min=0.0
    )
    assert np.isfinite(ch.stune).all() and (ch.stune >= ch.slurm - 1e-9).all()


garbage_time = st.one_of(
    st.sampled_from(
        [
            "",
            "Unknown",
            "None",
            "2024-13-45T99:99:99",
            "yesterday",
            "-5",
            "1" * 30,
            "9" * 5000,
            "١٢٣",
            "2024-01-01T00:00:00",
            "1e9",
            "1700000000",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_characters="|\n\r", codec="utf-8"), max_size=12),
)


@settings(max_examples=ROW_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(garbage_time, garbage_time, st.sampled_from(["3600", "0", "x", "9" * 40, ""])),
        min_size=1,
        max_size=5,
    )
)
def test_unreadable_start_or_end_skips_only_that_row(rows):
    good = _row(100, "stune1 held=7200.0 used=720.0 cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu=")
    lines = [good] + [_row(i, "", s, e, el) for i, (s, e, el) in enumerate(rows, start=1)]
    table = parse("\n".join([HEADER, *lines]) + "\n")
    assert "100" in table.job_id_raw  # the good row is always there, and measured
    at = table.job_id_raw.index("100")
    assert table.has_summary[at] and table.start[at] == 1000
    assert table.n + table.skipped == len(lines)
    assert ((table.start >= -1) & (table.end >= -1) & (table.elapsed >= 0)).all()
    ch = charges.compute(
        table, table.ran, as_of=2_000_000_000, half_life_s=86400, alpha=1.0, coverage_min=0.8
    )
    assert np.isfinite(ch.slurm).all() and np.isfinite(ch.stune).all()


def test_a_truncated_summary_and_a_nan_one_are_unmeasured_and_counted(tmp_path):
    """The exact cases of #10: `used=` cut off, used=nan, inf, negative: eta 1, counted in the report."""
    rows = [
        _row(1, "stune1 held=14400.0 used="),
        _row(2, "stune1 held=7200.0 used=nan cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="),
        _row(3, "stune1 held=7200.0 used=inf cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="),
        _row(4, "stune1 held=7200.0 used=-50.0 cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="),
        _row(5, "stune1 held=7200.0 used=720.0 cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="),
        _row(6, "", start="yesterday"),
        _row(7, "", end="Friday"),
    ]
    dump = tmp_path / "dump.txt"
    dump.write_text("\n".join([HEADER, *rows]) + "\n")
    config = load_config(str(_config(tmp_path)))
    result = accountant.run(config, sacct_file=str(dump), now=5000)
    t = result.table
    assert t.job_id_raw == ["1", "2", "3", "4", "5"] and t.skipped == 2
    assert t.bad_summary.tolist() == [True, True, True, True, False]
    assert result.charges.eta.tolist() == pytest.approx([1, 1, 1, 1, 0.1])
    assert all(math.isfinite(v) for v in result.usage_stune.values())
    assert any("2 unreadable sacct row(s) skipped" in w and "'yesterday'" in w for w in result.warnings)
    assert any("4 damaged or out-of-range usage summary" in w for w in result.warnings)
    from slurm_tune.fairshare import report, report_render

    rep = report.build(result, config, None)
    assert rep.data_quality == {"bad_summaries": 4, "skipped_rows": 2, "duplicate_rows": 0}
    assert "nan" not in report_render.to_json(rep).lower().replace('"nan"', "")
    # and the CLI run exits 0, saying so
    proc = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "stune-fairshare"),
            "report",
            "--sacct-file",
            str(dump),
            "--format",
            "table",
            "--config",
            str(_config(tmp_path)),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "STUNE_ENV_FILE": "/nonexistent"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 damaged or out-of-range usage summaries" in proc.stdout
    assert "2 unreadable sacct rows skipped" in proc.stdout


def _config(tmp_path):
    path = tmp_path / "fairshare.yaml"
    path.write_text(f"accountant:\n  state_dir: {tmp_path / 'state'}\n  coverage_min: 0.5\n")
    return path


def test_duplicate_rows_of_one_run_count_once(tmp_path):
    """Two overlapping exports concatenated: the same runs twice (one still running in the first export).
    Charges equal the single export's; a requeued job (same id, new Start) is a separate run."""
    s = "stune1 held=7200.0 used=720.0 cov=7200.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 per_gpu="
    first = [_row(1, s), _row(2, "", end="Unknown", elapsed="1000"), _row(3, "", start="1000")]
    second = [_row(2, s), _row(3, "", start="1000"), _row(3, "", start="5000", end="8600")]
    config = load_config(str(_config(tmp_path)))
    once, twice = tmp_path / "once.txt", tmp_path / "twice.txt"
    once.write_text("\n".join([HEADER, first[0], *second]) + "\n")
    twice.write_text("\n".join([HEADER, *first, HEADER.replace("JobIDRaw", "JobIDRaw"), *second]) + "\n")
    # a concatenation repeats the header line too: that line is skipped, not fatal
    a = accountant.run(config, sacct_file=str(once), now=9000)
    b = accountant.run(config, sacct_file=str(twice), now=9000)
    assert b.table.duplicates == 2 and b.table.n == 4
    assert sorted(zip(b.table.job_id_raw, b.table.start.tolist(), b.table.end.tolist())) == [
        ("1", 1000, 4600),
        ("2", 1000, 4600),
        ("3", 1000, 4600),
        ("3", 5000, 8600),
    ]
    assert b.usage_slurm == pytest.approx(a.usage_slurm) and b.usage_stune == pytest.approx(a.usage_stune)
    assert any("2 duplicate row(s)" in w for w in b.warnings)
