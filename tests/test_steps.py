"""The steps file's summary (slurm_tune/usage/steps.py): good, bad and fuzzed bytes, the numbers on a known
series with its warm-up apart, the runs rule, the AdminComment tokens, and the memory bound."""

from __future__ import annotations

import json
import random
import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_tune.usage import steps, summary
from slurm_tune.usage.steps import WARMUP_STEPS, StepStats, parse, parse_tokens


def line(step, samples=1000, step_s=0.5, data_s=0.05, **extra) -> str:
    return json.dumps(dict({"step": step, "samples": samples, "step_s": step_s, "data_s": data_s}, **extra))


def lines_bytes(lines) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def fields(tokens: str) -> dict[str, str]:
    return dict(t.split("=", 1) for t in tokens.split(" "))


def known_series(shuffle_seed=None):
    """10 warm-up steps (2 s each, 1.5 s of it waiting), then 90 steady steps whose rates are exactly 1..90
    samples/s and whose data-wait shares are 1 %..90 %."""
    warm = [line(i, 1000, 2.0, 1.5) for i in range(WARMUP_STEPS)]
    rates = list(range(1, 91))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(rates)
    steady = [
        line(WARMUP_STEPS + k, 1000, 1000 / r, (1000 / r) * r / 100, t=1.7e9 + k) for k, r in enumerate(rates)
    ]
    return warm + steady


@pytest.mark.parametrize("seed", [None, 7])
def test_the_summary_of_a_known_series_with_its_warm_up_apart(seed):
    stats = parse(lines_bytes(known_series(seed)))
    assert (stats.steps, stats.warmup, stats.bad, stats.runs) == (90, 10, 0, 1)
    # linear interpolation between the sorted values: numpy's default percentile
    rates = np.arange(1, 91, dtype=float)
    assert stats.sps_p50 == pytest.approx(45.5) == pytest.approx(np.percentile(rates, 50))
    assert stats.sps_p10 == pytest.approx(9.9) == pytest.approx(np.percentile(rates, 10))
    assert stats.sps_p90 == pytest.approx(81.1) == pytest.approx(np.percentile(rates, 90))
    assert stats.sps_all == pytest.approx(90_000 / sum(1000 / r for r in range(1, 91)))
    assert stats.dwait_p50 == pytest.approx(0.455) and stats.dwait_p90 == pytest.approx(0.811)
    # the warm-up's 2 s steps at 500 samples/s are not in the steady figures
    assert stats.warm_s == pytest.approx(20.0) and stats.warm_sps == pytest.approx(500.0)
    assert stats.first_bad is None and stats.has_steps


def test_warm_up_is_at_most_half_of_a_short_run():
    stats = parse(lines_bytes([line(i, step_s=2.0 if i < 3 else 0.5) for i in range(6)]))
    assert (stats.steps, stats.warmup) == (3, 3)
    assert stats.sps_p10 == stats.sps_p90 == pytest.approx(2000.0)  # only the fast steps are steady
    one = parse(lines_bytes([line(0)]))
    assert (one.steps, one.warmup, one.runs) == (1, 0, 1)
    exact = parse(lines_bytes([line(i) for i in range(2 * WARMUP_STEPS + 1)]))
    assert (exact.steps, exact.warmup) == (WARMUP_STEPS + 1, WARMUP_STEPS)
    assert parse(lines_bytes([line(i) for i in range(30)]), warmup_steps=0).steps == 30


def test_a_restart_starts_a_run_with_its_own_warm_up():
    restarted = [line(i) for i in range(30)] + [line(i, step_s=3.0) for i in range(25, 30)]
    stats = parse(lines_bytes(restarted + [line(i) for i in range(30, 60)]))
    # the second run (steps 25..59, 35 records) begins with 10 slow-and-fast warm-up records
    assert stats.runs == 2 and stats.warmup == 2 * WARMUP_STEPS
    assert stats.steps == 30 + 35 - 2 * WARMUP_STEPS
    assert stats.sps_p10 == pytest.approx(2000.0)  # the restart's 3 s steps were its warm-up
    again = parse(lines_bytes([line(i) for i in range(30)] * 2))  # from step 0 again
    assert again.runs == 2 and again.warmup == 20 and again.steps == 40


def test_a_head_and_tail_joined_mid_line_is_one_run_and_one_bad_line():
    head = lines_bytes([line(i) for i in range(100)])
    tail = lines_bytes([line(i, step_s=0.25) for i in range(90_000, 90_100)])
    stats = parse(head[:-30] + tail[41:])  # the epilog's cap: head and tail, each cut mid-line
    assert stats.runs == 1 and stats.warmup == WARMUP_STEPS and stats.bad == 1
    assert stats.steps == 99 + 99 - WARMUP_STEPS
    assert stats.first_bad == "line 100: not JSON (cut, or garbled)"
    assert stats.sps_p90 == pytest.approx(4000.0) and stats.sps_p10 == pytest.approx(2000.0)


BAD_LINES = {
    '{"step": 1, "samples": 10, "step_s": 0.5': "not JSON (cut, or garbled)",
    '{"step": 1, "samples": 10, "step_s": 0.5, "data_s": 0.1}{"step": 2}': "text after the JSON object",
    '[{"step": 1}]': "not a JSON object",
    '"step"': "not a JSON object",
    '{"samples": 10, "step_s": 0.5, "data_s": 0.1}': "step: not a whole number >= 0",
    '{"step": true, "samples": 10, "step_s": 0.5, "data_s": 0.1}': "step: not a whole number >= 0",
    '{"step": -1, "samples": 10, "step_s": 0.5, "data_s": 0.1}': "step: not a whole number >= 0",
    '{"step": 1.0, "samples": 10, "step_s": 0.5, "data_s": 0.1}': "step: not a whole number >= 0",
    '{"step": 1, "samples": 0, "step_s": 0.5, "data_s": 0.1}': "samples: not a whole number > 0",
    '{"step": 1, "samples": "10", "step_s": 0.5, "data_s": 0.1}': "samples: not a whole number > 0",
    '{"step": 1, "samples": 1'
    + "0" * 300
    + ', "step_s": 0.5, "data_s": 0.1}': "samples: not a whole number > 0",
    '{"step": 1, "samples": 10, "step_s": 0, "data_s": 0}': "step_s: not a number of seconds in [1e-06, 1e+07]",
    '{"step": 1, "samples": 10, "step_s": NaN, "data_s": 0}': "step_s: not a number of seconds in [1e-06, 1e+07]",
    '{"step": 1, "samples": 10, "step_s": Infinity, "data_s": 0}': "step_s: not a number",
    '{"step": 1, "samples": 10, "step_s": 1e400, "data_s": 0}': "step_s: not a number",
    '{"step": 1, "samples": 10, "step_s": 1' + "0" * 400 + ', "data_s": 0}': "step_s: not a number",
    '{"step": 1, "samples": 10, "step_s": null, "data_s": 0}': "step_s: not a number",
    '{"step": 1, "samples": 10, "step_s": 0.5, "data_s": -0.1}': "data_s: not a number of seconds >= 0",
    '{"step": 1, "samples": 10, "step_s": 0.5, "data_s": NaN}': "data_s: not a number of seconds >= 0",
    '{"step": 1, "samples": 10, "step_s": 0.5, "data_s": 0.6}': "data_s is longer than step_s",
    '{"step": 1, "samples": 10, "step_s": 0.5, "data_s": 1' + "0" * 400 + "}": "data_s is longer than step_s",
    "[" * 3000: "not JSON (cut, or garbled)",
    '{"step": 1, "x": "' + "a" * 5000 + '"}': "longer than 4096 characters",
}


@pytest.mark.parametrize("bad", list(BAD_LINES))
def test_each_kind_of_bad_line_is_counted_named_and_skipped(bad):
    data = lines_bytes([line(0), line(1), bad, line(2)])
    stats = parse(data)
    assert (stats.steps + stats.warmup, stats.bad) == (3, 1)
    assert stats.first_bad.startswith("line 3: " + BAD_LINES[bad]), stats.first_bad


def test_what_is_no_bad_line():
    data = (
        b"\n   \n"
        + line(0, step_s=1, data_s=0).encode()  # whole seconds are numbers
        + b"\r\n  "  # CRLF, and leading blanks
        + line(1, t=1.7e9, host="n1").encode()  # `t` and unknown keys are ignored
        + b"\n"
        + line(2, step_s=0.5, data_s=0.5 + 1e-9).encode()  # data_s within rounding of step_s
        + b"\n\n"
    )
    stats = parse(data)
    assert (stats.steps + stats.warmup, stats.bad, stats.first_bad) == (3, 0, None)
    over = parse(lines_bytes([line(i, step_s=0.5, data_s=0.5 + 1e-9) for i in range(3)]))
    assert over.bad == 0 and over.dwait_p50 == 1.0  # the share is capped at the whole step


def test_non_utf8_and_garbage_give_no_steps_not_a_failure():
    for data in (
        b"",
        b"\n\n",
        b"\xff\xfe\x00garbage\x80\n\x00\x00\n",
        bytes(range(256)) * 40,
        b"{" * 100_000,
    ):
        stats = parse(data)
        assert not stats.has_steps and stats.sps_p50 is None and stats.runs == 0
        assert stats.first_bad is None or not stats.first_bad.startswith("internal error")
    assert parse(b"").tokens() == ""
    assert parse(b"junk\n").tokens() == "sps=-/-/-/- dwait=-/- steps=0/0/1/0 warm=0.0/-"
    # a good line with odd bytes in an ignored string is still a step
    assert parse(b'{"step": 0, "samples": 8, "step_s": 0.5, "data_s": 0.1, "note": "\xff\xfe"}\n').steps == 1


def test_bytes_like_inputs_and_chunk_boundaries_give_the_same_summary(monkeypatch):
    data = lines_bytes([*known_series(3), "garbage", *known_series(4)])
    expected = parse(data)
    assert parse(bytearray(data)) == expected and parse(memoryview(data)) == expected
    monkeypatch.setattr(steps, "CHUNK", 97)  # chunks cut every few lines, at newlines
    assert parse(data) == expected


def test_an_internal_error_is_an_empty_summary_that_says_so(monkeypatch):
    def broken(*_):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(steps, "_summary", broken)
    stats = parse(lines_bytes([line(0)]))
    assert not stats.has_steps and stats.first_bad == "internal error: ZeroDivisionError: boom"


def good_file(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return lines_bytes(
        line(i, rng.choice([256, 1024]), s := rng.uniform(0.1, 1.0), s * rng.uniform(0, 1)) for i in range(n)
    )


def check_consistent(stats: StepStats, data: bytes) -> None:
    assert isinstance(stats, StepStats)
    assert stats.first_bad is None or not stats.first_bad.startswith("internal error"), stats.first_bad
    assert stats.steps + stats.warmup + stats.bad <= data.count(b"\n") + 1
    assert stats.runs <= stats.steps + stats.warmup and (stats.runs > 0) == stats.has_steps
    if stats.steps:
        assert 0 < stats.sps_p10 <= stats.sps_p50 <= stats.sps_p90
        assert 0 <= stats.dwait_p50 <= stats.dwait_p90 <= 1
    round_trip = parse_tokens(fields(stats.tokens())) if stats.tokens() else None
    assert round_trip is None or round_trip.tokens() == stats.tokens()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_fuzz_random_bytes_never_raise(data):
    check_consistent(parse(data), data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 60),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=12),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)
def test_fuzz_a_good_file_flipped_cut_and_spliced_never_raises(n, flips, cut_head, cut_tail):
    data = bytearray(good_file(n, n))
    for at, value in flips:
        if data:
            data[at % len(data)] = value
    spliced = bytes(data[: cut_head % (len(data) + 1)]) + bytes(data[cut_tail % (len(data) + 1) :])
    check_consistent(parse(spliced), spliced)
    if not flips:
        whole = parse(bytes(data))
        assert whole.bad == 0 and whole.steps + whole.warmup == n


def test_tokens_round_trip_and_hold_no_separator_of_the_line():
    stats = parse(lines_bytes(known_series(1)))
    text = stats.tokens()
    assert text == "sps=45.5/9.9/81.1/17.708 dwait=45.5/81.1 steps=90/10/0/1 warm=20.0/500"
    assert re.fullmatch(r"(sps|dwait|steps|warm)=[-0-9./e+]+( (sps|dwait|steps|warm)=[-0-9./e+]+){3}", text)
    back = parse_tokens(fields(text))
    assert back.tokens() == text
    for name in ("sps_p50", "sps_p10", "sps_p90", "sps_all", "dwait_p50", "dwait_p90", "warm_s", "warm_sps"):
        assert getattr(back, name) == pytest.approx(getattr(stats, name), rel=1e-4, abs=1e-3), name
    assert (back.steps, back.warmup, back.bad, back.runs) == (90, 10, 0, 1)
    big = StepStats(3, 0, 0, 1, 123456.7, 0.000123, 1e9, 5.0, 0.0, 1.0, 0.0, None)
    assert parse_tokens(fields(big.tokens())).sps_p50 == pytest.approx(123460)


def test_the_tokens_live_beside_the_usage_summary_in_one_admin_comment():
    """The integrator appends the tokens to summary.encode()'s line: neither reader is confused by the other,
    and the keys do not collide."""
    captured = (
        "stune1 held=7200.0 used=6480.2 cov=7195.0 busy=0.0 busy_w=- gpus=2 nodes=1/1 "
        "per_gpu=n1/0:90.1:40.2:30517:250.3"  # job 1's AdminComment in tests/fixtures/slurm/*/sacct_dump_X.txt
    )
    stats = parse(lines_bytes(known_series()))
    line_ = captured + " " + stats.tokens()
    usage = summary.parse(line_)
    assert usage is not None and usage.held == 7200.0 and usage.per_gpu[0].sm == 90.1
    own = dict(t.split("=", 1) for t in line_[len(summary.PREFIX) :].split(" "))
    assert parse_tokens(own).tokens() == stats.tokens()
    assert not set(steps.KEYS) & set(fields(captured[len(summary.PREFIX) :]))
    assert parse_tokens(fields(captured[len(summary.PREFIX) :])) is None  # a job without a steps record


@pytest.mark.parametrize(
    "tokens",
    [
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0 warm=0/-",  # three counts
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0/x warm=0/-",
        "sps=1/1/1/1 dwait=1/1 steps=-1/0/0/1 warm=0/-",
        "sps=1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/-",
        "sps=nan/1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/-",
        "sps=inf/1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/-",
        "sps=-1/1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/-",
        "sps=1/1/1/1 dwait=101/1 steps=1/0/0/1 warm=0/-",
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0/1 warm=-/-",
        "sps=-/-/-/- dwait=-/- steps=1/0/0/1 warm=0/-",  # a steady step without its rate
        "sps=1/1/1/1 dwait=1/1 steps=0/0/0/0 warm=0/-",  # a rate without a step
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0/0 warm=0/-",  # steps without a run
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/" + "9" * 40,
        "sps=1/1/1/1 dwait=1/1 steps=1/0/0/1 warm=0/\u0661",
        "dwait=1/1 sps=1/1/1/1",  # no steps token
    ],
)
def test_unreadable_tokens_are_none(tokens):
    assert parse_tokens(fields(tokens)) is None


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*steps.KEYS, "held", "x"]), st.text(max_size=40), max_size=6))
def test_fuzz_tokens_never_raise(found):
    stats = parse_tokens(found)
    assert stats is None or parse_tokens(fields(stats.tokens())).tokens() == stats.tokens()


def test_memory_stays_below_the_bytes_read_plus_a_chunk():
    data = good_file(60_000, 5)  # ~5.5 MB
    tracemalloc.start()
    try:
        stats = parse(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.steps + stats.warmup == 60_000
    assert peak < len(data) + 3_500_000, (peak, len(data))
