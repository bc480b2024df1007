"""Byte-level fuzzing of parse() and judge(): mutations of every capture, and garbage.

What "garbage alone" means for a status: a failure status (fallback, no_gdr, plugin_failed, errors) needs a
line that says so, whole. Damage to a log can hide such a line (the verdict gets milder), never make one: so
every mutation of a capture may lose findings the capture has, and gains none, under every expectation. A
capture whose verdict is ok stays free of findings however it is damaged; bytes that are not a log at all
are unknown. And nothing raises: parse's `error` field stays empty (a caught internal error would show there).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_tune.comm import Expectation, judge, parse
from slurm_tune.comm.cap import join_head_tail

FIX = Path(__file__).parent / "fixtures" / "comm"
NAMES = sorted(p.name for p in FIX.glob("*.txt"))
EXPECTS = (
    Expectation("ib", gdr=True, gdr_level="PHB", socket_ifname="ib0"),
    Expectation("ib"),
    Expectation("roce", gdr=True, gdr_level="SYS"),
    Expectation("tcp"),
)
FAILURES = {"fallback", "no_gdr", "plugin_failed", "errors"}


def data_of(name: str) -> bytes:
    return (FIX / name).read_bytes()


def findings(data: bytes) -> list[set[str]]:
    log = parse(data)
    assert log.error == "", log.error
    out = []
    for expect in EXPECTS:
        v = judge([log], expect)
        assert "parser_error" not in v.notes
        assert (v.status in FAILURES) == bool(v.findings)
        out.append(set(v.findings))
    return out


def check_no_new_findings(name: str, mutants) -> int:
    base = findings(data_of(name))
    n = 0
    for how, mutant in mutants:
        got = findings(mutant)
        for expect, before, after in zip(EXPECTS, base, got):
            assert after <= before, f"{name} {how} under {expect}: {after - before} from damage alone"
        n += 1
    return n


def bit_flips(data: bytes, rng: random.Random, rounds: int = 60):
    for r in range(rounds):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(mutant))
            mutant[i] ^= 1 << rng.randrange(8)
        yield f"flips#{r}", bytes(mutant)


def truncations(data: bytes, step: int = 3):
    for i in range(0, len(data), step):
        yield f"head[:{i}]", data[:i]
        yield f"tail[{i}:]", data[i:]


def insertions(data: bytes, rng: random.Random, rounds: int = 40):
    for r in range(rounds):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutant.insert(rng.randrange(len(mutant) + 1), rng.choice((0x00, 0xFF)))
        yield f"insert#{r}", bytes(mutant)


def line_edits(data: bytes, rng: random.Random, rounds: int = 15):
    lines = data.splitlines(keepends=True)
    for r in range(rounds):
        shuffled = lines[:]
        rng.shuffle(shuffled)
        yield f"shuffle#{r}", b"".join(shuffled)
        doubled = [line for line in lines for _ in range(rng.randint(1, 3))]
        yield f"duplicate#{r}", b"".join(doubled)
    yield "huge line", b"".join(lines[:1]) + b"A" * (1 << 20) + b"\n" + b"".join(lines[1:])
    yield "huge NCCL line", b"n1:1:1 [0] NCCL INFO Channel " + b"9" * 100_000 + b"\n" + data
    yield "no line ends", data.replace(b"\n", b" ")
    yield "CR line ends", data.replace(b"\n", b"\r")
    yield "NUL runs", data.replace(b"\n", b"\n" + b"\x00" * 64, 3)
    yield "latin-1 noise", data.replace(b" ", b" \xe9", 5)


def joins(data: bytes, rng: random.Random, rounds: int = 40):
    for r in range(rounds):
        a = rng.randrange(len(data) + 1)
        b = rng.randrange(a, len(data) + 1)
        yield f"join#{r}", join_head_tail(data[:a], data[b:])


@pytest.mark.parametrize("name", NAMES)
def test_damage_to_a_capture_makes_no_finding(name):
    rng = random.Random(name)
    data = data_of(name)
    n = check_no_new_findings(
        name,
        [
            *bit_flips(data, rng),
            *truncations(data),
            *insertions(data, rng),
            *line_edits(data, rng),
            *joins(data, rng),
        ],
    )
    assert n > len(data) // 2


OK_CAPTURES = [n for n in NAMES if not any(findings(data_of(n)))]


def test_the_ok_and_unknown_captures_are_the_ones_expected():
    assert (
        "nccl-ib-gdr-a100-nccl707.txt" in OK_CAPTURES
        and "nccltests-2node-h100-a3mega-ztan.txt" in OK_CAPTURES
    )
    assert "nccl-socket-lo-nccl1053.txt" not in OK_CAPTURES and len(OK_CAPTURES) >= 10


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(OK_CAPTURES),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=12),
    st.integers(0, 1 << 16),
)
def test_an_ok_capture_damaged_anyhow_has_no_finding(name, edits, cut):
    mutant = bytearray(data_of(name))
    for at, byte in edits:
        mutant[at % len(mutant)] = byte
    assert not any(findings(bytes(mutant[: cut % (len(mutant) + 1)])))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_are_unknown(data):
    log = parse(data)
    assert log.error == ""
    for expect in EXPECTS:
        v = judge([log], expect)
        assert v.status == "unknown" and not v.findings


NCCLISH = [
    "NCCL",
    "INFO",
    "WARN",
    "via",
    "NET/IB/0",
    "NET/Socket/0",
    "/GDRDMA",
    "[send]",
    "[receive]",
    "Channel",
    "Ring",
    "Using",
    "network",
    "Socket",
    "->",
    "0[0]",
    ":",
    " ",
    "\n",
    "\r",
    "n1:1:2",
    "[0]",
    "plugin/net.cc:118",
    "Got completion",
    "EI0006",
    "\x00",
    "9" * 30,
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(NCCLISH), max_size=40))
def test_word_soup_never_raises_and_stays_bounded(words):
    """NCCL's own words in any order: this can form real lines, so only no-raise and the bounds hold."""
    log = parse("".join(words).encode())
    assert log.error == "" and len(log.hosts) <= 64 and len(log.channels) <= 64
    for expect in EXPECTS:
        judge([log], expect).encode()


def test_many_logs_of_garbage_together_are_unknown():
    rng = random.Random(7)
    logs = [parse(bytes(rng.randrange(256) for _ in range(2000))) for _ in range(20)]
    assert {judge(logs, e).status for e in EXPECTS} == {"unknown"}
