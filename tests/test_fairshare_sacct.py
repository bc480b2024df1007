"""Reading sacct text (live or a dump) into columns: the formats Slurm 22.05 prints, and clear errors."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from slurm_tune.fairshare.sacct import FIELDS, SacctFormatError, parse, read_file

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
    assert [t.assoc_keys[a] for a in t.assoc] == [("physics", "stune-alice"), ("physics", "stune-alice"),
                                                 ("root", "root"), ("root", "root"), ("biology", "stune-bob")]
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
    text = "\n".join([
        header,
        "10|10|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4|",
        "10.batch|10.batch|||COMPLETED|100|1100|1000||cpu=00:00:01,gres/gpumem=1024M,gres/gpuutil=80,mem=1G",
        "10.0|10.0|||COMPLETED|200|700|500||cpu=00:00:01,gres/gpuutil=20",
        "11|11|u|a|COMPLETED|100|200|100|billing=1,gres/gpu=1|",
    ])
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
    rows = [f"{i}|{i}|u|a|p|normal|COMPLETED|100|200|100|billing=1,gres/gpu=1|{c}"
            for i, c in enumerate((good, reordered, "stune1 held=broken", ""), start=1)]
    t = parse("\n".join([HEADER, *rows]) + "\n")
    assert t.has_summary.tolist() == [True, True, False, False]
    assert (t.held_s[0], t.used_s[0], t.busy_w[0]) == (10.0, 5.0, 300.0)
    assert (t.held_s[1], t.used_s[1]) == (4.0, 2.0) and np.isnan(t.busy_w[1])
    fast = parse("\n".join([HEADER, rows[0], rows[0].replace("1|1|", "9|9|", 1)]) + "\n")
    assert fast.has_summary.tolist() == [True, True] and fast.covered_s.tolist() == [10.0, 10.0]


def test_mixed_epoch_and_iso_times_take_the_careful_path():
    start = 1795982612
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start + 60))
    rows = [f"1|1|u|a|p|normal|COMPLETED|{start}|{start + 5}|5|billing=1|",
            f"2|2|u|a|p|normal|COMPLETED|{iso}|Unknown||billing=1|"]
    t = parse("\n".join([HEADER, *rows]) + "\n")
    assert t.start.tolist() == [start, start + 60]
    assert t.end.tolist() == [start + 5, -1]
    assert t.elapsed.tolist() == [5, 0]


def test_a_shift_between_summaries_is_caught():
    summary = "stune1 held=1.0 used=1.0 cov=1.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="
    rows = [f"{i}|{i}|u|a|p|normal|COMPLETED|100|200|100|billing=1,gres/gpu=1|{summary}" for i in range(1, 5)]
    rows[0] += "|extra"                                      # one field too many...
    rows[2] = rows[2].replace("|normal|", "|", 1)             # ...and one too few, two lines later
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
    text = "\n".join([
        header,
        "20|20|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4||",
        "20.batch|20.batch|||COMPLETED|100|1100|1000|cpu=1,gres/gpu=4,node=1|1|cpu=00:00:01,gres/gpuutil=360",
        "21|21|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=4||",
        "21.0|21.0|||COMPLETED|100|1100|1000|cpu=4,gres/gpu=4,node=1|4|gres/gpuutil=90",
        "22|22|u|a|COMPLETED|100|1100|1000|billing=4,gres/gpu=2||",
        "22.0|22.0|||COMPLETED|100|1100|1000|cpu=1,gres/gpu=2,node=1|1|gres/gpuutil=900",  # impossible: 450 %
    ])
    t = parse(text)
    assert t.gpuutil[0] == pytest.approx(90.0) and t.gpuutil[1] == pytest.approx(90.0)
    assert np.isnan(t.gpuutil[2])  # not trusted


# ---- the byte-level fast path reads exactly what the general parser reads ----------------------------------
# sacct.parse/read_file take sacct_fast's numpy path for plain ASCII dumps and fall back to the general parser
# (sacct._parse_text) for anything it cannot prove it reads the same way. These dumps mix clean rows with every
# kind of damage the general parser copes with; the two paths must agree on every column.

import random  # noqa: E402

from slurm_tune.fairshare import sacct as sacct_mod  # noqa: E402
from slurm_tune.fairshare import columns, sacct_fast, words  # noqa: E402

_SUMMARY = ("stune1 held={h} used={u} cov={c} busy={b} busy_w={w} gpus={g} nodes=1/1 "
            "per_gpu=gpu{g}/0:40.0:1.0:10:60.0 drops=0 noproc=0.0 tl=-")


def _number(rng, clean: bool) -> str:
    if clean or rng.random() < 0.8:
        return f"{rng.choice((0, 1, 7, 250, 86400, 1382400, 38707200)) * rng.random():.1f}"
    return rng.choice(["1", "1.", ".5", "1.2.3", "-1.0", "nan", "inf", "1e5", "", "x", "12345678901234567.0",
                       "0.0 ", "1,5", "٣.0" if rng.random() < 0.1 else "3.0x"])


def _comment(rng, clean: bool) -> str:
    roll = rng.random()
    if roll < 0.35:
        return ""
    held = _number(rng, clean)
    fields = dict(h=held, u=_number(rng, clean), c=_number(rng, clean), b=_number(rng, clean),
                  w=rng.choice(["-", _number(rng, clean)]), g=rng.choice((1, 2, 8)))
    text = _SUMMARY.format(**fields)
    if clean or roll < 0.85:
        return text
    return rng.choice([
        text.replace("used=", "usex="), text.replace(" cov=", "  cov="), text.replace("held=", "held= "),
        text.replace(" gpus=", " gpu="), text[:rng.randrange(7, 40)], "stune1 ", "stune1 held=broken",
        "stune1 used=2.0 held=4.0 cov=4.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu=",
        text.replace("busy_w=", "busy_w=-"), "a note | with pipes", "stune1x held=1.0", text + "|x|y",
        text.replace("held=", "held=1e"), "stune1 held=1.0 used=1.0 cov=1.0 busy=0.0 busy_w=-5 gpus=1"])


def _time(rng, base: int, clean: bool) -> str:
    if clean or rng.random() < 0.85:
        return str(base)
    return rng.choice(["Unknown", "None", "N/A", "", "unknown", "+5", "0", "0000001795982612",
                       str(1 << 41), "1795982612 ", "2026-11-30T12:00:00", "2026-13-45T99:00:00", "1.5", "-1"])


def _row(rng, job: int, clean: bool) -> str:
    start = 1_795_000_000 + rng.randrange(10**6)
    elapsed = rng.randrange(0, 10**5)
    running = rng.random() < 0.05
    user = rng.choice(["stune-alice", "stune-bob", "root", "u" * 33, "x"])
    account = rng.choice(["physics", "biology", "root", "a"])
    tres = rng.choice(["billing=4,cpu=4,gres/gpu=4,node=1", "billing=1,cpu=1,node=1", "",
                       "billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=16000M,node=1",
                       "billing=2K,cpu=2,gres/gpu=abc", "billing=" + "9" * 40])
    state = rng.choice(["COMPLETED", "RUNNING", "CANCELLED by 0", "FAILED", "PENDING", "NODE_FAIL"])
    job_id = str(job) if clean or rng.random() < 0.9 else rng.choice(["", "x", "007", str(job - 1), f"{job}_3"])
    elapsed_text = str(elapsed) if clean or rng.random() < 0.9 else rng.choice(["", "x", "9" * 14, "+3", "00"])
    end = "Unknown" if running else _time(rng, start + elapsed, clean)
    return "|".join([job_id, f"{job}_{rng.randrange(3)}" if rng.random() < 0.1 else str(job), user, account,
                     rng.choice(["hdr", "vpc", "gpu,cpu"]), rng.choice(["normal", "debug"]), state,
                     _time(rng, start, clean), end, elapsed_text, tres, _comment(rng, clean)])


def _dump(seed: int, rows: int, garbage: float) -> str:
    rng = random.Random(seed)
    lines = ["|".join(FIELDS)]
    for job in range(1, rows + 1):
        lines.append(_row(rng, job, rng.random() >= garbage))
        if rng.random() < 0.02:  # the same run again (overlapping exports)
            lines.append(lines[-1])
    return "\n".join(lines) + ("\n" if seed % 3 else "")


def _columns_of(table) -> dict:
    out = {}
    for name, value in vars(table).items():
        if isinstance(value, np.ndarray):
            out[name] = (str(value.dtype), value.tolist())
        elif isinstance(value, (list, columns.Texts, columns.Coded)):
            out[name] = list(value)
        else:
            out[name] = value
    out["state"], out["keys"] = table.state, table.keys()
    return out


def _same(fast, general) -> None:
    a, b = _columns_of(fast), _columns_of(general)
    assert a.keys() == b.keys()
    for name in a:
        if name in ("held_s", "used_s", "covered_s", "busy_s", "busy_w", "gpuutil"):
            np.testing.assert_array_equal(np.array(a[name][1]), np.array(b[name][1]), err_msg=name)
            assert a[name][0] == b[name][0], name
        else:
            assert a[name] == b[name], name


def _fast(text: str):
    if not text.isascii():
        return None  # (parse() sends it to the general parser)
    data = text.encode("ascii")
    return sacct_fast.parse_bytes(sacct_fast.padded(len(data), data), len(data), "sacct")


@pytest.mark.parametrize("seed", range(12))
def test_the_fast_path_reads_clean_dumps_like_the_general_parser(seed):
    text = _dump(seed, 400, garbage=0.0)
    fast = _fast(text)
    assert fast is not None, "a clean dump must take the fast path"
    _same(fast, sacct_mod._parse_text(text))
    _same(sacct_mod.parse(text), sacct_mod._parse_text(text))


@pytest.mark.parametrize("seed", range(50))
def test_garbage_rows_read_the_same_on_either_path(seed):
    text = _dump(100 + seed, 300, garbage=0.15 if seed < 40 else 0.01)
    general = sacct_mod._parse_text(text)
    _same(sacct_mod.parse(text), general)
    fast = _fast(text)
    if fast is not None:
        _same(fast, general)


def test_most_garbage_stays_on_the_fast_path_column_by_column():
    """Damage in one column (an ISO time, an odd number) sends that column, not the dump, to the general
    helpers: across the garbage dumps most still return from the fast path."""
    taken = sum(_fast(_dump(100 + seed, 300, garbage=0.15)) is not None for seed in range(40))
    assert taken >= 10, taken


def _decimal_text(rng) -> str:
    """A plain decimal of 1-15 characters in the forms a summary (or a hand-edited one) may hold."""
    digits = rng.randrange(1, 15)
    text = "".join(rng.choice("0123456789") for _ in range(digits))
    roll = rng.random()
    if roll < 0.6:
        at = rng.randrange(0, digits + 1)  # ".5", "5.", "00.000123", "12345678901.234"
        text = text[:at] + "." + text[at:]
    elif roll < 0.8:
        text = repr(rng.random() * 10 ** rng.randrange(0, 8))[:15].rstrip("e-+")
    return text


@pytest.mark.parametrize("seed", range(8))
def test_summary_numbers_in_every_plain_form_read_exactly_on_the_fast_path(seed):
    """The fast path reads a head's numbers by digit arithmetic: it must give the very doubles the general
    parser's strtod gives, for any 1-15 character decimal (many fraction digits, leading zeros, a bare dot at
    either end), and take the general path for 16 characters or more."""
    rng = random.Random(900 + seed)
    lines = ["|".join(FIELDS)]
    for job in range(1, 301):
        held = _decimal_text(rng)
        used, busy, cov = sorted((_decimal_text(rng) for _ in range(3)), key=float)  # sane: cov the largest
        busy_w = "-" if rng.random() < 0.3 else _decimal_text(rng)
        comment = _SUMMARY.format(h=held, u=used, c=cov, b=busy, w=busy_w, g=1)
        lines.append(f"{job}|{job}|u|a|p|normal|COMPLETED|1795000000|1795000100|100|billing=1,gres/gpu=1|{comment}")
    text = "\n".join(lines) + "\n"
    fast = _fast(text)
    assert fast is not None, "plain decimals must stay on the fast path"
    general = sacct_mod._parse_text(text)
    _same(fast, general)
    assert fast.has_summary.all() and np.isfinite(fast.held_s).all()  # every head read, none distrusted
    wide = text.replace("held=", "held=1234567890123456", 1)  # 16+ characters: the general helper reads them
    assert sacct_fast._summaries(*_comment_spans(wide)) is None
    _same(_fast(wide), sacct_mod._parse_text(wide))


_FIELD_CHARS = st.sampled_from("0123456789" * 3 + ".:-/ aZ\x00\x7f")


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.text(_FIELD_CHARS, max_size=17), min_size=1, max_size=40))
def test_plain_numbers_read_eight_digits_at_a_time_as_python_reads_them(fields):
    """The fast path reads integer fields inside 64-bit words (eight digits per step): a field is plain when it
    is 1-13 ASCII digits, and then its value is exactly int()'s, whatever the bytes around it."""
    data = ("JobIDRaw|JobID|Start|" + "|".join(fields) + "|").encode("ascii")  # (a header comes first)
    buf = sacct_fast.padded(len(data), data)
    bars = [i for i, byte in enumerate(data) if byte == ord("|")][2:]
    start, end = np.array(bars[:-1]) + 1, np.array(bars[1:])
    values, plain = words.plain_numbers(buf, len(data), start, end)
    for field, value, is_plain in zip(fields, values.tolist(), plain.tolist()):
        expected = 1 <= len(field) <= 13 and all(c in "0123456789" for c in field)
        assert is_plain == expected, field
        assert value == (int(field) if expected else 0), field


@st.composite
def _decimal_tokens(draw):
    """1-15 character numbers: digits with a '.' anywhere or none (a bare '.' too, which is not a number)."""
    digits = draw(st.text(st.sampled_from("0123456789"), max_size=15))
    if draw(st.booleans()) or not digits:
        digits = digits[:14]
        at = draw(st.integers(0, len(digits)))
        digits = digits[:at] + "." + digits[at:]
    return digits


_ENCODER_TOKENS = st.floats(0, 1e13, allow_nan=False).map(lambda v: f"{v:.1f}")  # usage/summary.encode's form


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.lists(_decimal_tokens(), min_size=1, max_size=30),
                 st.lists(_ENCODER_TOKENS, min_size=1, max_size=30)), st.data())
def test_decimals_read_in_words_give_strtods_doubles(tokens, data):
    """A summary's numbers are read two words at a time: digits with at most one '.' (anywhere, and a digit
    besides it) give the very double float() gives; any other token declines the whole batch (None). A
    batch all in the encoder's own form ("%.1f") takes a shorter way, to the same doubles."""
    if data.draw(st.booleans()):  # damage one token: a second dot, or a byte that is no digit
        k = data.draw(st.integers(0, len(tokens) - 1))
        at = data.draw(st.integers(0, len(tokens[k]) - 1))
        tokens[k] = tokens[k][:at] + data.draw(st.sampled_from(".x-:/")) + tokens[k][at + 1:]
    text = ("x" * 16 + " " + " ".join(tokens) + " ").encode("ascii")
    buf = sacct_fast.padded(len(text), text)
    ends = np.array([i for i, byte in enumerate(text) if byte == ord(" ")][1:], dtype=np.int64)
    word_at = words.gather(buf, len(text), 8)
    got = words.decimals(word_at[ends - 16], word_at[ends - 8], np.array([len(t) for t in tokens]))
    valid = all(set(t) <= set("0123456789.") and t.count(".") <= 1 and t != "." for t in tokens)
    if not valid:
        assert got is None
    else:
        assert got is not None and got.tolist() == [float(t) for t in tokens]


def _comment_spans(text: str):
    """(buf, size, start, end, n) of the AdminComment fields (the last) of a one-line-per-row dump."""
    data = text.encode("ascii")
    buf = sacct_fast.padded(len(data), data)
    starts, ends, at = [], [], data.index(b"\n") + 1
    while at < len(data):
        stop = data.index(b"\n", at)
        starts.append(data.rindex(b"|", at, stop) + 1)
        ends.append(stop)
        at = stop + 1
    return buf, len(data), np.array(starts), np.array(ends), len(starts)


@pytest.mark.parametrize("change", ["ragged", "blank", "crlf", "steps", "non-ascii", "pipes", "short"])
def test_what_the_fast_path_declines_is_still_read_right(tmp_path, change):
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
    with open(path, encoding="utf-8", errors="replace") as fh:  # what read_file always did: text mode
        general = sacct_mod._parse_text(fh.read(), str(path))
    _same(sacct_mod.read_file(str(path)), general)


@pytest.mark.parametrize("seed", range(6))
def test_read_file_with_damaged_bytes_matches_a_text_mode_read(tmp_path, seed):
    rng = random.Random(seed)
    data = bytearray(_dump(200 + seed, 200, garbage=0.1).encode())
    for _ in range(20):  # flip bytes anywhere: invalid UTF-8, NULs, stray '|' and newlines
        data[rng.randrange(len(data))] = rng.choice([0, 0xff, 0xc3, ord("|"), ord("\n"), ord("\r"), ord("7")])
    path = tmp_path / "dump.txt"
    path.write_bytes(bytes(data))
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    try:
        general = sacct_mod._parse_text(text, str(path))
    except SacctFormatError as exc:
        with pytest.raises(SacctFormatError) as got:
            sacct_mod.read_file(str(path))
        assert str(got.value) == str(exc)
        return
    _same(sacct_mod.read_file(str(path)), general)


@pytest.mark.parametrize("seed", range(8))
def test_a_dump_read_in_many_pieces_is_read_like_one(monkeypatch, seed):
    """The fast path reads a big dump in pieces of ROWS rows (and finds delimiters in pieces of _CHUNK bytes,
    and multiplies digits in pieces of ROWS rows); small pieces here make every join show."""
    monkeypatch.setattr(sacct_fast, "ROWS", 37)
    monkeypatch.setattr(sacct_fast, "_CHUNK", 61)
    text = _dump(300 + seed, 400, garbage=0.0 if seed < 4 else 0.02)
    general = sacct_mod._parse_text(text)
    fast = _fast(text)
    if seed < 4:
        assert fast is not None
    if fast is not None:
        _same(fast, general)
    _same(sacct_mod.parse(text), general)


def test_a_hash_collision_between_groups_is_caught_not_merged(monkeypatch):
    """The repeated strings (user, account, ..., AllocTRES) are grouped by a 64-bit hash of their bytes and
    every row is checked against its group's first row: with every hash forced equal, different rows must
    not be merged; the dump goes to the general parser and reads the same."""
    text = _dump(77, 200, garbage=0.0)
    assert _fast(text) is not None
    monkeypatch.setattr(sacct_fast, "ROWS", 37)  # the check runs in pieces too
    monkeypatch.setattr(words, "hash_rows", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    assert _fast(text) is None
    _same(sacct_mod.parse(text), sacct_mod._parse_text(text))


def test_groups_sharing_a_value_are_decoded_right_even_when_values_collide(monkeypatch):
    """Each run of grouped columns is decoded once per distinct value among the groups (found by a hash of
    its words); when two values share a hash, every group's own row is decoded instead."""
    text = _dump(78, 300, garbage=0.0)
    rows = text.count("\n") - 1
    real_hash = words.hash_rows
    # the dump's rows keep their real hashes (one piece of `rows` rows); the groups' values all collide
    monkeypatch.setattr(words, "hash_rows", lambda keys: real_hash(keys) if len(keys) >= rows
                        else np.zeros(len(keys), dtype=np.uint64))
    fast = _fast(text)
    assert fast is not None
    _same(fast, sacct_mod._parse_text(text))


_BASE_DUMP = _dump(9, 60, garbage=0.0)
_ASCII_BYTES = st.sampled_from(list(b"|\n .-=0123456789eEnN+:/_,abcdlsuwy") + [0, 9, 127])


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_BASE_DUMP) - 1), _ASCII_BYTES, st.sampled_from(["set", "insert",
                                                                                                "delete"])),
                min_size=1, max_size=8))
def test_byte_level_damage_reads_the_same_on_either_path(edits):
    """Near-valid ASCII dumps (a digit, a '|', a newline, a space... set, inserted or deleted anywhere): the fast
    path must refuse or read exactly what the general parser reads, including its errors."""
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
    try:
        general = sacct_mod._parse_text(text)
    except SacctFormatError as exc:
        with pytest.raises(SacctFormatError) as got:
            sacct_mod.parse(text)
        assert str(got.value) == str(exc)
        return
    _same(sacct_mod.parse(text), general)
    fast = _fast(text)
    if fast is not None:
        _same(fast, general)


_CAPTURES = sorted((Path(__file__).parent / "fixtures" / "slurm").glob("*/sacct_dump_*.txt"))


@pytest.mark.parametrize("path", _CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_sacct_captures_read_the_same_on_either_path(path):
    """Dumps real Slurm releases printed: `-X` allocation dumps take the fast path, step dumps the general one."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    general = sacct_mod._parse_text(text, str(path))
    _same(sacct_mod.read_file(str(path)), general)
    assert (_fast(text) is not None) == path.name.endswith("_X.txt")


def test_a_newline_turned_pipe_reads_as_the_general_parser_reads_it():
    """Found by the byte-level test: a '|' where a row's newline was leaves the field count a multiple of the
    width, and the general parser reads two rows there. The fast path must not take the extra pipes as free
    text in the first row's AdminComment (it hands such a dump to the general parser)."""
    lines = _BASE_DUMP.split("\n")
    text = "\n".join([lines[0], lines[1] + "|" + lines[2]] + lines[3:])
    general = sacct_mod._parse_text(text)
    assert list(general.job_id_raw)[:2] == [lines[1].split("|")[0], lines[2].split("|")[0]]
    assert _fast(text) is None
    _same(sacct_mod.parse(text), general)


def test_stune_fairshare_keeps_freed_memory_in_its_own_process_only(monkeypatch, capsys):
    """Reading a month of sacct frees and reallocates big arrays many times; the command's process sets
    glibc's malloc to reuse that memory instead of faulting it in again (fairshare/heap.py). It takes effect
    here (glibc), and only where stune-fairshare is the process, not where a caller runs its main()."""
    import platform
    import subprocess
    import sys

    from slurm_tune.cli import fairshare as fairshare_cli
    from slurm_tune.fairshare import heap

    done = subprocess.run([sys.executable, "-c", "from slurm_tune.fairshare.heap import keep_freed_memory; "
                           "print(keep_freed_memory())"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(platform.libc_ver()[0] == "glibc")
    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(True) or True)
    monkeypatch.setattr(sys, "argv", ["stune-fairshare", "--help"])
    with pytest.raises(SystemExit):
        fairshare_cli.main()
    assert calls == [True]
    with pytest.raises(SystemExit):
        fairshare_cli.main(["--help"])
    assert calls == [True]
