"""durations: one rule set for config keys, command-line options and Slurm's own duration text."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fairshare_accountant import HEADER, _cli, row, summary

from slurm_tune import durations as stune_durations
from slurm_tune.errors import ConfigError, StuneError
from slurm_tune.schema import Duration, Where

SECONDS = st.integers(min_value=0, max_value=10**12)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("300", 300),
        (" 42 ", 42),
        ("0.5", 0),
        ("90s", 90),
        ("90 S", 90),
        ("10m", 600),
        ("1.5h", 5400),
        ("7d", 604800),
        ("2w", 1209600),
        ("1d12h", 129600),
        ("1d 12h", 129600),
        ("1w2d3h4m5s", 788645),
        ("7-00:00:00", 604800),
        ("01:30:00", 5400),
        ("5:00", 300),
        ("1-0", 86400),
        ("2-3:04", 183840),
        ("2-3:04:05", 183845),
        (3600, 3600),
        (1.5, 1),
    ],
)
def test_the_one_rule_set(text, seconds):
    assert stune_durations.parse(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "2x",
        "1e3",
        "inf",
        "nan",
        "1h30",
        "h",
        "1 2",
        "1m1h",
        "1hh",
        "1.2.3",
        "1-",
        "1-2-3",
        "1:2:3:4",
        "a-1",
        "1:x",
        "\u0661",
        "1_000",
        "+5",
        "0x10",
        None,
        True,
        [],
        float("nan"),
        float("inf"),
    ],
)
def test_garbage_is_refused(text):
    with pytest.raises(stune_durations.DurationError, match=r"not a duration|positive"):
        stune_durations.parse(text)


@pytest.mark.parametrize("text", ["-5", "-1-0", -3])
def test_negative_durations_are_refused(text):
    with pytest.raises(stune_durations.DurationError, match="must be a positive duration"):
        stune_durations.parse(text)


def test_slurm_text_counts_bare_numbers_in_minutes_and_knows_its_keywords():
    assert stune_durations.parse_slurm("7-00:00:00") == 604800
    assert stune_durations.parse_slurm("5") == 300 and stune_durations.parse_slurm("5", bare_unit=1) == 5
    assert stune_durations.parse_slurm("300 sec") == 300 and stune_durations.parse_slurm("10 SEC") == 10
    assert (
        stune_durations.parse_slurm("NONE")
        == stune_durations.parse_slurm("(null)")
        == stune_durations.parse_slurm("")
        == stune_durations.parse_slurm(None)
        == 0
    )
    assert (
        stune_durations.parse_slurm("INFINITE") is None and stune_durations.parse_slurm("UNLIMITED") is None
    )
    with pytest.raises(stune_durations.DurationError):
        stune_durations.parse_slurm("soon")


def test_sbatch_time_limits_follow_slurms_rules():
    from slurm_tune.sbatch.recovery import time_limit_seconds

    assert [time_limit_seconds(t) for t in ("7", "7:30", "1:00:00", "2-0", "2-3:04:05", " 10 ")] == [
        420,
        450,
        3600,
        172800,
        183845,
        600,
    ]
    assert [time_limit_seconds(t) for t in ("0", "00:00:00", "INFINITE", "UNLIMITED", "", None, "soon")] == [
        None
    ] * 7


def test_formats():
    assert (
        stune_durations.compact(0) == "0s"
        and stune_durations.compact(90) == "1m30s"
        and stune_durations.compact(1209600) == "2w"
    )
    assert stune_durations.compact(129600) == "1d12h"
    assert (
        stune_durations.clock(600) == "0:10:00"
        and stune_durations.clock(3725) == "1:02:05"
        and stune_durations.clock(90000) == "25:00:00"
    )


@settings(max_examples=3000, deadline=None)
@given(SECONDS)
def test_format_parse_round_trip(seconds):
    assert stune_durations.parse(stune_durations.compact(seconds)) == seconds
    assert stune_durations.parse(stune_durations.clock(seconds)) == seconds
    assert stune_durations.parse_slurm(stune_durations.clock(seconds)) == seconds


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 10**5), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_slurms_day_form_round_trips(d, h, m, s):
    text = f"{d}-{h:02d}:{m:02d}:{s:02d}"
    assert (
        stune_durations.parse_slurm(text) == stune_durations.parse(text) == d * 86400 + h * 3600 + m * 60 + s
    )


GARBAGE = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.from_regex(r"[0-9smhdw:. -]{1,20}", fullmatch=True),
    st.integers(min_value=10**20, max_value=10**400).map(str),
)


@settings(max_examples=5000, deadline=None)
@given(GARBAGE)
def test_garbage_is_a_number_or_a_one_line_error_naming_the_key(text):
    try:
        value = stune_durations.option(text, "--half-life")
    except stune_durations.DurationError as exc:
        assert isinstance(exc, StuneError) and str(exc).startswith("--half-life: ")
        assert len(str(exc).splitlines()) == 1  # repr() escapes the user's newlines
    else:
        assert isinstance(value, int) and value >= 0
    try:
        value = stune_durations.parse_slurm(text)
    except stune_durations.DurationError as exc:
        assert len(str(exc).splitlines()) == 1
    else:
        assert value is None or (isinstance(value, int) and value >= 0)
    try:
        value = Duration().check(text, "usage.window", Where("fs.yaml"))
    except ConfigError as exc:
        assert str(exc).startswith("fs.yaml: usage.window: ") and len(str(exc).splitlines()) == 1
    else:
        assert isinstance(value, int) and value >= 0


def test_config_key_errors_name_file_line_and_key():
    where = Where("/etc/stune/fairshare.yaml")
    where.lines["usage.window"] = 7
    assert Duration().check("2w", "usage.window", where) == 1209600
    with pytest.raises(ConfigError) as exc:
        Duration().check("fortnight", "usage.window", where)
    assert str(exc.value) == (
        f"/etc/stune/fairshare.yaml:7: usage.window: 'fortnight' is not a duration (e.g. {stune_durations.EXAMPLES})"
    )


def test_half_life_takes_what_since_takes(tmp_path):
    from slurm_tune.cli.fairshare import _offline_settings, _since

    now = 1_700_000_000
    for text in ("2w", "14d", "1209600", "14-00:00:00", "1w7d"):
        args = argparse.Namespace(
            sacct_file="dump", cluster=False, algorithm="fair_tree", half_life=text, weight_fairshare=10000
        )
        assert _offline_settings(args).half_life_s == 1209600
        assert _since(text, now) == now - 1209600
    assert _since("@1600000000", now) == 1600000000
    with pytest.raises(StuneError, match=r"^--since: 'soon' is not a duration"):
        _since("soon", now)


def test_half_life_2w_on_the_command_line(tmp_path):
    t = 1_700_000_000
    dump = tmp_path / "dump.txt"
    dump.write_text(
        "\n".join(
            [
                HEADER,
                row(1, "stune-alice", t, 3600, comment=summary(7200, 6480, 7200)),
                row(2, "stune-bob", t + 86400 * 10, 3600, comment=summary(7200, 720, 7200)),
            ]
        )
        + "\n"
    )
    cfg = tmp_path / "fs.yaml"
    cfg.write_text(f"accountant:\n  state_dir: {tmp_path / 'state'}\n")

    def report(*extra):
        proc = _cli(
            [
                "report",
                "--sacct-file",
                str(dump),
                "--config",
                str(cfg),
                "--format",
                "json",
                "--algorithm",
                "classic",
                *extra,
            ],
            tmp_path=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        return {(u["account"], u["user"]): u["fairshare_stune"] for u in json.loads(proc.stdout)["users"]}

    two_weeks = report("--half-life", "2w", "--since", "2w")
    assert (
        two_weeks
        == report("--half-life", "14-00:00:00", "--since", "14d")
        == report("--half-life", "1209600")
    )
    assert two_weeks != report("--half-life", "1h")  # the option reaches the decay
    bad = _cli(
        ["report", "--sacct-file", str(dump), "--config", str(cfg), "--half-life", "2 weeks"],
        tmp_path=tmp_path,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines() == [
        f"stune-fairshare: --half-life: '2 weeks' is not a duration (e.g. {stune_durations.EXAMPLES})"
    ]


def test_slurms_half_life_reaches_the_accountant_and_garbage_names_the_key():
    from slurm_tune.fairshare.accountant import AccountantError, PrioritySettings

    base = {"PriorityType": "priority/multifactor"}
    assert (
        PrioritySettings.from_config(dict(base, PriorityDecayHalfLife="14-00:00:00")).half_life_s == 1209600
    )
    assert PrioritySettings.from_config(dict(base, PriorityDecayHalfLife="00:00:00")).half_life_s == 0
    assert PrioritySettings.from_config(dict(base)).half_life_s == 604800
    with pytest.raises(AccountantError, match=r"^scontrol show config: PriorityDecayHalfLife: 'soon' is not"):
        PrioritySettings.from_config(dict(base, PriorityDecayHalfLife="soon"))
