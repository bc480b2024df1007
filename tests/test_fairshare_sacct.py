"""Reading sacct text (live or a dump) into columns: the formats Slurm 22.05 prints, and clear errors."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.fairshare import sacct as sacct_mod
from slurm_tune.fairshare import sacct_values
from slurm_tune.fairshare.sacct import FIELDS, SacctFormatError, parse, read_file
from slurm_tune.usage.summary import parse_head

HEADER = "|".join(FIELDS)
# Rows as `SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert` prints them on the devcluster.
ROWS = [
    "1|1|stune-alice|physics|hdr|normal|COMPLETED|1795982612|1795982614|2|billing=2,cpu=2,gres/gpu=4,node=2|",
    "4|4|stune-alice|physics|hdr|normal|COMPLETED|1795982686|1795982688|2|billing=2,cpu=2,gres/gpu=4,node=2|"
    "stune1 held=8.0 used=3.2 cov=7.9 busy=0.0 busy_w=- gpus=4 nodes=2/2 per_gpu=n1/0:40.0:1.0:10:60.0",
    "5|5|root|root|hdr|normal|RUNNING|1795982890|Unknown|2|billing=1,cpu=1,node=1|",
    "7|7|root|root|hdr|normal|PENDING|Unknown|Unknown|0||",
    "9|8_1|stune-bob|biology|vpc|normal|CANCELLED by 0|1795982900|1795983000|100|"
    "billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=16000M,node=1|a note | with pipes",
]


def test_columns_from_a_devcluster_dump():
    t = parse("\n".join([HEADER, *ROWS]) + "\n")
    assert t.n == 5
    assert t.job_id_raw == ["1", "4", "5", "7", "9"]
    assert t.job_id[4] == "8_1"
    assert [t.assoc_keys[a] for a in t.assoc] == [
        ("physics", "stune-alice"),
        ("physics", "stune-alice"),
        ("root", "root"),
        ("root", "root"),
        ("biology", "stune-bob"),
    ]
    assert t.state == ["COMPLETED", "COMPLETED", "RUNNING", "PENDING", "CANCELLED"]
    assert t.start.tolist() == [1795982612, 1795982686, 1795982890, -1, 1795982900]
    assert t.end.tolist() == [1795982614, 1795982688, -1, -1, 1795983000]
    assert t.billing.tolist() == [2, 2, 1, 0, 8]
    assert t.gpus.tolist() == [4, 4, 0, 0, 2]  # the typed gres/gpu:a100 entry is the same GPUs again
    assert t.has_summary.tolist() == [False, True, False, False, False]
    assert (t.held_s[1], t.used_s[1], t.covered_s[1]) == (8.0, 3.2, 7.9)
    assert np.isnan(t.held_s[0])
    assert t.admin_comment[4] == "a note | with pipes"  # free text keeps its '|'
    assert t.keys()[0] == "1@1795982612"


def test_column_order_is_free_but_admin_comment_must_be_last():
    fields = ["User", "JobIDRaw", "Account", "State", "ElapsedRaw", "Start", "End", "AllocTRES"]
    t = parse("|".join(fields) + "\nbob|3|bio|COMPLETED|60|100|160|billing=1,gres/gpu=1\n")
    assert t.assoc_keys == [("bio", "bob")] and t.elapsed.tolist() == [60] and t.gpus.tolist() == [1]
    with pytest.raises(SacctFormatError, match="AdminComment must be the last column"):
        parse("AdminComment|" + "|".join(fields) + "\n")
    with pytest.raises(SacctFormatError, match="a column is named twice"):  # which State would be read?
        parse("|".join([*fields, "State"]) + "\n")


def test_iso_times_are_local_wall_clock():
    start = 1795982612
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))
    t = parse(f"{HEADER}\n1|1|u|a|p|normal|COMPLETED|{iso}|None|5|billing=1|\n")
    assert t.start.tolist() == [start]
    assert t.end.tolist() == [-1]


def test_bad_dumps_name_file_and_line(tmp_path):
    missing = tmp_path / "short.txt"
    missing.write_text("JobIDRaw|User\n1|u\n")
    with pytest.raises(SacctFormatError, match=r"short.txt:1: header lacks Account, State"):
        read_file(str(missing))
    ragged = tmp_path / "ragged.txt"
    ragged.write_text(f"{HEADER}\n{ROWS[0]}\n1|2|3\n")
    t = read_file(str(ragged))  # one cut line is skipped and named, never fatal
    assert t.n == 1 and t.skipped == 1
    assert t.skip_reasons == [f"{ragged}:3: 3 fields, the header has 12"]
    only_bad = tmp_path / "bad.txt"
    only_bad.write_text(f"{HEADER}\n1|2|3\n4|5\n")
    with pytest.raises(SacctFormatError, match=r"bad.txt:2: 3 fields, the header has 12 \(and 1 more"):
        read_file(str(only_bad))
    with pytest.raises(SacctFormatError, match=r"nope.txt: cannot read"):
        read_file(str(tmp_path / "nope.txt"))
    with pytest.raises(SacctFormatError, match="empty"):
        parse("\n\n")


def test_slurm_gpuutil_from_steps_is_joined_to_its_job():
    # Slurm >= 23.02 with NVML records gres/gpuutil per step in TRESUsageInAve.
    header = "JobIDRaw|JobID|User|Account|State|Start|End|ElapsedRaw|AllocTRES|TRESUsageInAve"
    text = "\n".join(
        [
            header,
            "10|10|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4|",
            "10.batch|10.batch|||COMPLETED|100|1100|1000||cpu=00:00:01,gres/gpumem=1024M,gres/gpuutil=80,mem=1G",
            "10.0|10.0|||COMPLETED|200|700|500||cpu=00:00:01,gres/gpuutil=20",
            "11|11|u|a|COMPLETED|100|200|100|billing=1,gres/gpu=1|",
        ]
    )
    t = parse(text)
    assert t.n == 2
    assert t.gpuutil[0] == pytest.approx((80 * 1000 + 20 * 500) / 1500)
    assert t.gpuutil_cover[0] == 1.0
    assert np.isnan(t.gpuutil[1])


def test_pipes_that_add_up_across_lines_do_not_misalign_columns():
    # line 2's comment holds one '|' too many, line 3 lacks a field: the totals match a clean dump
    text = "\n".join([HEADER, ROWS[0][:-1] + "x|y", "2|2|u|a|p|normal|COMPLETED|1|2|billing=1|"]) + "\n"
    t = parse(text)
    assert t.job_id_raw == ["1"] and t.admin_comment == ["y"]
    assert t.skipped == 1 and t.skip_reasons == ["sacct:3: 11 fields, the header has 12"]


def test_summaries_in_another_order_or_damaged_still_parse_row_by_row():
    good = "stune1 held=10.0 used=5.0 cov=10.0 busy=1.0 busy_w=300.0 gpus=1 nodes=1/1 per_gpu="
    reordered = "stune1 used=2.0 held=4.0 cov=4.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="
    rows = [
        f"{i}|{i}|u|a|p|normal|COMPLETED|100|200|100|billing=1,gres/gpu=1|{c}"
        for i, c in enumerate((good, reordered, "stune1 held=broken", ""), start=1)
    ]
    t = parse("\n".join([HEADER, *rows]) + "\n")
    assert t.has_summary.tolist() == [True, True, False, False]
    assert (t.held_s[0], t.used_s[0], t.busy_w[0]) == (10.0, 5.0, 300.0)
    assert (t.held_s[1], t.used_s[1]) == (4.0, 2.0) and np.isnan(t.busy_w[1])
    fast = parse("\n".join([HEADER, rows[0], rows[0].replace("1|1|", "9|9|", 1)]) + "\n")
    assert fast.has_summary.tolist() == [True, True] and fast.covered_s.tolist() == [10.0, 10.0]


def test_mixed_epoch_and_iso_times_take_the_careful_path():
    start = 1795982612
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start + 60))
    rows = [
        f"1|1|u|a|p|normal|COMPLETED|{start}|{start + 5}|5|billing=1|",
        f"2|2|u|a|p|normal|COMPLETED|{iso}|Unknown||billing=1|",
    ]
    t = parse("\n".join([HEADER, *rows]) + "\n")
    assert t.start.tolist() == [start, start + 60]
    assert t.end.tolist() == [start + 5, -1]
    assert t.elapsed.tolist() == [5, 0]


def test_a_shift_between_summaries_is_caught():
    summary = "stune1 held=1.0 used=1.0 cov=1.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="
    rows = [f"{i}|{i}|u|a|p|normal|COMPLETED|100|200|100|billing=1,gres/gpu=1|{summary}" for i in range(1, 5)]
    rows[0] += "|extra"  # one field too many...
    rows[2] = rows[2].replace("|normal|", "|", 1)  # ...and one too few, two lines later
    t = parse("\n".join([HEADER, *rows]) + "\n")
    assert t.job_id_raw == ["1", "2", "4"] and t.skip_reasons == ["sacct:4: 11 fields, the header has 12"]
    assert t.has_summary.tolist() == [True, True, True]  # row 1's "|extra" lands after its numbers
    assert not t.bad_summary.any() and t.covered_s.tolist() == [1.0, 1.0, 1.0]


# The 25.05.8 capture's `sacct` step dump (/work/shared/slurm-outputs/25.05.8/sacct_dump_steps.txt): its
# fake GPUs have no NVML, so TRESUsageInAve holds energy=0 and no gres/gpuutil; the rows are the real format.
CAPTURE_25_05 = """JobIDRaw|JobID|User|Account|Partition|QOS|State|Start|End|ElapsedRaw|AllocTRES|TRESUsageInAve|AdminComment
2|2|stune-bob|biology|roce|normal|COMPLETED|1796046501|1796046503|2|billing=2,cpu=2,gres/gpu=2,node=2||
2.batch|2.batch||biology|||COMPLETED|1796046501|1796046503|2|cpu=1,gres/gpu=1,mem=0,node=1|energy=0|
2.0|2.0||biology|||COMPLETED|1796046501|1796046501|0|cpu=2,gres/gpu=2,mem=0,node=2|energy=0|
"""


def test_a_25_05_step_dump_without_gpuutil_leaves_jobs_unmeasured():
    t = parse(CAPTURE_25_05)
    assert t.job_id_raw == ["2"] and np.isnan(t.gpuutil[0]) and t.gpuutil_cover[0] == 0


def test_gpuutil_is_a_sum_over_each_tasks_gpus_and_is_read_per_gpu():
    """Slurm's gpu/nvml adds up a task's utilization over the GPUs it drives; TRESUsageInAve is the mean over
    tasks. One task on 4 GPUs at 90 % reads 360; 4 tasks, one GPU each, read 90: both mean 90 % per GPU."""
    header = "JobIDRaw|JobID|User|Account|State|Start|End|ElapsedRaw|AllocTRES|NTasks|TRESUsageInAve"
    text = "\n".join(
        [
            header,
            "20|20|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4||",
            "20.batch|20.batch|||COMPLETED|100|1100|1000|cpu=1,gres/gpu=4,node=1|1|cpu=00:00:01,gres/gpuutil=360",
            "21|21|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4||",
            "21.0|21.0|||COMPLETED|100|1100|1000|cpu=4,gres/gpu=4,node=1|4|gres/gpuutil=90",
            "22|22|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=2||",
            "22.0|22.0|||COMPLETED|100|1100|1000|cpu=1,gres/gpu=2,node=1|1|gres/gpuutil=900",  # impossible: 450 %
        ]
    )
    t = parse(text)
    assert t.gpuutil[0] == pytest.approx(90.0) and t.gpuutil[1] == pytest.approx(90.0)
    assert np.isnan(t.gpuutil[2])  # not trusted


# ---- every row is read as it reads alone --------------------------------------------------------------------
# The parser reads a dump in blocks, and each column with one check over the whole block (every value a plain
# number, every summary in encode()'s form) before it falls back to reading rows one by one. Whatever the dump
# holds, each row must come out as it does when it is the dump's only row, and the skips and duplicates must
# add up. These dumps mix clean rows with every kind of damage.


_SUMMARY = (
    "stune1 held={h} used={u} cov={c} busy={b} busy_w={w} gpus={g} nodes=1/1 "
    "per_gpu=gpu{g}/0:40.0:1.0:10:60.0 drops=0 noproc=0.0 tl=-"
)


def _number(rng, clean: bool) -> str:
    if clean or rng.random() < 0.8:
        return f"{rng.choice((0, 1, 7, 250, 86400, 1382400, 38707200)) * rng.random():.1f}"
    return rng.choice(
        [
            "1",
            "1.",
            ".5",
            "1.2.3",
            "-1.0",
            "nan",
            "inf",
            "1e5",
            "",
            "x",
            "12345678901234567.0",
            "0.0 ",
            "1,5",
            "٣.0" if rng.random() < 0.1 else "3.0x",
        ]
    )


def _comment(rng, clean: bool) -> str:
    roll = rng.random()
    if roll < 0.35:
        return ""
    held = _number(rng, clean)
    fields = {
        "h": held,
        "u": _number(rng, clean),
        "c": _number(rng, clean),
        "b": _number(rng, clean),
        "w": rng.choice(["-", _number(rng, clean)]),
        "g": rng.choice((1, 2, 8)),
    }
    text = _SUMMARY.format(**fields)
    if clean or roll < 0.85:
        return text
    return rng.choice(
        [
            text.replace("used=", "usex="),
            text.replace(" cov=", "  cov="),
            text.replace("held=", "held= "),
            text.replace(" gpus=", " gpu="),
            text[: rng.randrange(7, 40)],
            "stune1 ",
            "stune1 held=broken",
            "stune1 used=2.0 held=4.0 cov=4.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu=",
            text.replace("busy_w=", "busy_w=-"),
            "a note | with pipes",
            "stune1x held=1.0",
            text + "|x|y",
            text.replace("held=", "held=1e"),
            "stune1 held=1.0 used=1.0 cov=1.0 busy=0.0 busy_w=-5 gpus=1",
        ]
    )


def _time(rng, base: int, clean: bool) -> str:
    if clean or rng.random() < 0.85:
        return str(base)
    return rng.choice(
        [
            "Unknown",
            "None",
            "N/A",
            "",
            "unknown",
            "+5",
            "0",
            "0000001795982612",
            str(1 << 41),
            "1795982612 ",
            "2026-11-30T12:00:00",
            "2026-13-45T99:00:00",
            "1.5",
            "-1",
        ]
    )


def _row(rng, job: int, clean: bool) -> str:
    start = 1_795_000_000 + rng.randrange(10**6)
    elapsed = rng.randrange(0, 10**5)
    running = rng.random() < 0.05
    user = rng.choice(["stune-alice", "stune-bob", "root", "u" * 33, "x"])
    account = rng.choice(["physics", "biology", "root", "a"])
    tres = rng.choice(
        [
            "billing=4,cpu=4,gres/gpu=4,node=1",
            "billing=1,cpu=1,node=1",
            "",
            "billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=16000M,node=1",
            "billing=2K,cpu=2,gres/gpu=abc",
            "billing=" + "9" * 40,
        ]
    )
    state = rng.choice(["COMPLETED", "RUNNING", "CANCELLED by 0", "FAILED", "PENDING", "NODE_FAIL"])
    job_id = (
        str(job) if clean or rng.random() < 0.9 else rng.choice(["", "x", "007", str(job - 1), f"{job}_3"])
    )
    elapsed_text = (
        str(elapsed) if clean or rng.random() < 0.9 else rng.choice(["", "x", "9" * 14, "+3", "00"])
    )
    end = "Unknown" if running else _time(rng, start + elapsed, clean)
    return "|".join(
        [
            job_id,
            f"{job}_{rng.randrange(3)}" if rng.random() < 0.1 else str(job),
            user,
            account,
            rng.choice(["hdr", "vpc", "gpu,cpu"]),
            rng.choice(["normal", "debug"]),
            state,
            _time(rng, start, clean),
            end,
            elapsed_text,
            tres,
            _comment(rng, clean),
        ]
    )


def _dump(seed: int, rows: int, garbage: float) -> str:
    rng = random.Random(seed)
    lines = ["|".join(FIELDS)]
    for job in range(1, rows + 1):
        lines.append(_row(rng, job, rng.random() >= garbage))
        if rng.random() < 0.02:  # the same run again (overlapping exports)
            lines.append(lines[-1])
    return "\n".join(lines) + ("\n" if seed % 3 else "")


def _rows_of(table) -> list[tuple]:
    """Each row of the table, with its association and QOS by name and NaN as None."""
    numbers = [
        table.start,
        table.end,
        table.elapsed,
        table.billing,
        table.gpus,
        table.has_summary,
        table.bad_summary,
        table.held_s,
        table.used_s,
        table.covered_s,
        table.busy_s,
        table.busy_w,
        table.gpuutil,
        table.gpuutil_cover,
    ]
    rows = []
    for i in range(table.n):
        values = [
            None if isinstance(v, float) and math.isnan(v) else v for v in (c[i].item() for c in numbers)
        ]
        rows.append(
            (
                table.job_id_raw[i],
                table.job_id[i],
                table.assoc_keys[table.assoc[i]],
                table.partition[i],
                table.qos_names[table.qos[i]],
                table.state_raw[i],
                table.state[i],
                table.admin_comment[i],
                *values,
            )
        )
    return rows


def _alone(text: str) -> tuple[list[tuple], tuple[int, int], int]:
    """(rows, (cut lines, rows with unreadable times), duplicates) that parse(text) must give, from each line parsed as a dump of its own: a
    line that is refused alone (a cut line) is skipped; of the runs that appear more than once (JobIDRaw and
    Start) the most finished row is kept (ended, then longest, then the last)."""
    lines = text.replace("\r\n", "\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line)
    header = lines[first]
    sacct_mod.parse(header)  # a bad header: the caller expects its error
    rows, cut, bad_times, any_read = [], 0, 0, False
    for line in lines[first + 1 :]:
        if not line:
            continue
        try:
            table = sacct_mod.parse(f"{header}\n{line}\n")
        except SacctFormatError:
            cut += 1
            continue
        any_read = True
        bad_times += table.skipped
        rows += _rows_of(table)
    if cut and not any_read:
        raise SacctFormatError("no readable row")
    best: dict = {}
    for k, row in enumerate(rows):
        run, rank = (row[0], row[8]), (row[9] >= 0, row[9], row[10], k)
        best[run] = max(best.get(run, rank), rank)
    kept = [row for k, row in enumerate(rows) if best[(row[0], row[8])][3] == k]
    return kept, (cut, bad_times), len(rows) - len(kept)


def _reads_as_alone(text: str) -> None:
    try:
        expected, skipped, duplicates = _alone(text)
    except SacctFormatError:
        with pytest.raises(SacctFormatError):
            sacct_mod.parse(text)
        return
    table = sacct_mod.parse(text)
    assert _rows_of(table) == expected
    assert (table.skipped, table.duplicates) == (sum(skipped), duplicates)
    cut, bad_times = skipped  # the first five of each kind are named
    reasons = table.skip_reasons
    assert len(reasons) == min(cut, 5) + min(bad_times, 5)
    assert all(" fields, the header has " in r for r in reasons[: min(cut, 5)])
    assert all("unreadable Start/End" in r for r in reasons[min(cut, 5) :])


@pytest.mark.parametrize("seed", range(12))
def test_clean_dumps_read_every_row_as_it_reads_alone(seed):
    text = _dump(seed, 400, garbage=0.0)
    _reads_as_alone(text)
    table = sacct_mod.parse(text)
    assert not table.skipped and table.has_summary.any()


@pytest.mark.parametrize("seed", range(50))
def test_garbage_rows_read_as_they_read_alone(seed):
    _reads_as_alone(_dump(100 + seed, 300, garbage=0.15 if seed < 40 else 0.01))


@pytest.mark.parametrize("seed", range(8))
def test_a_dump_read_in_many_blocks_is_read_like_one(monkeypatch, seed):
    """Blocks end anywhere, mid-line too (here every 61 characters): the lines they cut are joined again."""
    text = _dump(300 + seed, 400, garbage=0.0 if seed < 4 else 0.02)
    whole = _rows_of(sacct_mod.parse(text))
    monkeypatch.setattr(sacct_mod, "BLOCK", 61)
    assert _rows_of(sacct_mod.parse(text)) == whole
    _reads_as_alone(text)


@pytest.mark.parametrize("change", ["ragged", "blank", "crlf", "steps", "non-ascii", "pipes", "short"])
def test_unusual_dumps_read_as_their_rows_read_alone(tmp_path, change):
    text = _dump(7, 200, garbage=0.05)
    lines = text.split("\n")
    if change == "ragged":
        lines[5] = "1|2|3"
    elif change == "blank":
        lines.insert(9, "")
    elif change == "steps":
        lines.insert(3, "2.batch|2.batch|||||COMPLETED|1795000000|1795000100|100|cpu=1||")
    elif change == "non-ascii":
        lines[4] = lines[4].replace("stune-", "stüne-")
    elif change == "pipes":
        lines[6] += "|with|pipes"
    elif change == "short":
        lines = lines[:2]
    text = "\n".join(lines)
    if change == "crlf":
        text = text.replace("\n", "\r\n")
    path = tmp_path / "dump.txt"
    path.write_bytes(text.encode("utf-8"))
    _reads_as_alone(text)
    assert _rows_of(sacct_mod.read_file(str(path))) == _rows_of(sacct_mod.parse(text))


@pytest.mark.parametrize("seed", range(6))
def test_read_file_with_damaged_bytes_reads_as_a_text_mode_read(tmp_path, seed):
    rng = random.Random(seed)
    data = bytearray(_dump(200 + seed, 200, garbage=0.1).encode())
    for _ in range(20):  # flip bytes anywhere: invalid UTF-8, NULs, stray '|' and newlines
        data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0xC3, ord("|"), ord("\n"), ord("\r"), ord("7")])
    path = tmp_path / "dump.txt"
    path.write_bytes(bytes(data))
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    _reads_as_alone(text)
    try:
        expected = sacct_mod.parse(text, str(path))
    except SacctFormatError as exc:
        with pytest.raises(SacctFormatError) as got:
            sacct_mod.read_file(str(path))
        assert str(got.value) == str(exc)
        return
    got = sacct_mod.read_file(str(path))
    assert _rows_of(got) == _rows_of(expected) and got.skip_reasons == expected.skip_reasons


_BASE_DUMP = _dump(9, 60, garbage=0.0)
_ASCII_BYTES = st.sampled_from([*b"|\n .-=0123456789eEnN+:/_,abcdlsuwy", 0, 9, 127])


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(_BASE_DUMP) - 1), _ASCII_BYTES, st.sampled_from(["set", "insert", "delete"])
        ),
        min_size=1,
        max_size=8,
    )
)
def test_byte_level_damage_reads_as_the_rows_read_alone(edits):
    """Near-valid ASCII dumps (a digit, a '|', a newline, a space... set, inserted or deleted anywhere): every
    row reads as it reads alone, and a dump is refused only where its rows are."""
    data = bytearray(_BASE_DUMP.encode())
    for at, byte, how in edits:
        at = min(at, len(data) - 1)
        if how == "set":
            data[at] = byte
        elif how == "insert":
            data.insert(at, byte)
        else:
            del data[at]
    text = data.decode("ascii")
    if not text.strip("\n"):
        with pytest.raises(SacctFormatError, match="empty"):
            sacct_mod.parse(text)
        return
    lines = text.split("\n")
    try:  # the text up to its header line (blank lines before it count)
        sacct_mod.parse("\n".join(lines[: next(i for i, line in enumerate(lines) if line) + 1]))
    except SacctFormatError as exc:  # the header itself is damaged: that is the error
        with pytest.raises(SacctFormatError) as got:
            sacct_mod.parse(text)
        assert str(got.value) == str(exc)
        return
    _reads_as_alone(text)


_CAPTURES = sorted((Path(__file__).parent / "fixtures" / "slurm").glob("*/sacct_dump_*.txt"))


@pytest.mark.parametrize("path", _CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_sacct_captures_read_as_their_rows_read_alone(path):
    """Dumps real Slurm releases printed (`-X` allocation dumps; step dumps, whose rows join their jobs)."""
    table = sacct_mod.read_file(str(path))
    assert table.n and not table.skipped
    if path.name.endswith("_X.txt"):
        with open(path, encoding="utf-8", errors="replace") as fh:
            _reads_as_alone(fh.read())


def test_a_newline_turned_pipe_is_one_row_too_long_not_two_rows():
    """A '|' where a row's newline was: the line has 23 fields; its last 12 are free text in the AdminComment
    of the first row (the last column keeps any further '|'), which is then no summary."""
    lines = _BASE_DUMP.split("\n")
    text = "\n".join([lines[0], lines[1] + "|" + lines[2], *lines[3:]])
    table = sacct_mod.parse(text)
    assert table.job_id_raw[:2] == [lines[1].split("|")[0], lines[3].split("|")[0]]
    assert table.admin_comment[0].endswith("|" + lines[2])
    _reads_as_alone(text)


_PLAIN_NUMBERS = st.floats(0, 1e7, allow_nan=False).map(lambda v: f"{v:.1f}")
_ODD_NUMBERS = st.sampled_from(
    ["-", "-1.0", "nan", "inf", "1e5", "1_0", "", " ", "x", "1.2.3", "٣.0", "0.5\r", "9" * 400]
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.lists(_PLAIN_NUMBERS, min_size=5, max_size=5), min_size=1, max_size=4), st.data())
def test_summary_heads_read_as_the_summary_format_reads_them(heads, data):
    """The heads in encode()'s form are read by one pattern over the column; each must give what
    usage/summary.parse_head gives for it alone (the format's own reader), before the range checks. One
    number or key of one head may be odd."""
    keys = ["held=", "used=", "cov=", "busy=", "busy_w="]
    odd = data.draw(st.integers(0, len(heads) - 1)) if data.draw(st.booleans()) else None
    comments = []
    for k, numbers in enumerate(heads):
        head_keys = list(keys)
        if k == odd:
            at = data.draw(st.integers(0, 4))
            if data.draw(st.booleans()):
                numbers[at] = data.draw(_ODD_NUMBERS)
            else:
                head_keys[at] = data.draw(st.sampled_from(["x=", "used=", " held=", "busy_w=-"]))
        comments.append(
            "stune1 "
            + " ".join(f"{key}{value}" for key, value in zip(head_keys, numbers))
            + " gpus=1 nodes=1/1 per_gpu="
        )
    numbers, read = sacct_values._heads(comments)
    got = [row if ok else None for row, ok in zip(numbers.tolist(), read.tolist())]
    assert [None if g is None else [None if v is None or v != v else v for v in g] for g in got] == [
        None if p is None else [None if v is None or v != v else v for v in p]
        for p in map(parse_head, comments)
    ]


def test_plain_numbers_are_ascii_digits_below_two_to_the_forty():
    """A column of plain numbers is read in one conversion; any other value (a sign, a space, '_', other
    digits, an empty field, 2**40 and up) is read as the per-row reader reads it: a count as 0, a time as bad."""
    odd = ["+5", " 5", "5_0", "٣", "", "5 ", str(1 << 40), "9" * 5000]
    for value in odd:
        assert sacct_values.counts(["7", value]).tolist() == [7, 0], value
        assert sacct_values.epochs(["7", value]).tolist() == [7, -1 if value == "" else sacct_values.BAD_TIME]
    assert sacct_values.counts(["0007", str((1 << 40) - 1)]).tolist() == [7, (1 << 40) - 1]
    assert sacct_values.epochs(["5", "Unknown", "None", "N/A"]).tolist() == [5, -1, -1, -1]
