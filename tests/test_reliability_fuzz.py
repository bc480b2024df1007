"""Byte-level fuzzing of what the reliability package reads: sacct dumps (history.py, with AdminComment's
transport tokens for causes.py) and `sacctmgr show event` dumps (events.py), through to the lemon test and
the report. Nothing raises but the one-line HistoryFormatError for a dump with no header; the numbers stay
numbers; and damage alone never makes a lemon of a clean site (a damaged row is skipped, or reads as a
cause that is not the machine's: garbage is unknown, never a failure)."""

from __future__ import annotations

import math
import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_history import Site, generate

from slurm_tune.reliability import causes, events, history, lemons, render, report
from slurm_tune.reliability.lemons import Policy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reliability"
CLEAN, CLEAN_EVENTS = generate(Site(seed=11, nodes=16, days=20, jobs_per_day=25, sizes=(2, 4)))
PLANTED, PLANTED_EVENTS = generate(Site(seed=12, nodes=16, days=20, jobs_per_day=25, lemon="gpu005"))
SEEDS = [
    CLEAN.encode(),
    PLANTED.encode(),
    (FIXTURES / "sacct_node_fail_requeue_22.05.8.txt").read_bytes(),
]
EVENT_SEEDS = [
    CLEAN_EVENTS.encode(),
    PLANTED_EVENTS.encode(),
    (FIXTURES / "sacctmgr_show_event_22.05.8.txt").read_bytes(),
]
JUNK = [
    b"|",
    b"\n",
    b"\r\n",
    b"\x00",
    b"\xff\xfe",
    b"Unknown",
    b"None",
    b"-1",
    b"\xd9\xa3",
    b"9" * 40,
    b"n[1-3,x]",
    b"[",
    b"]",
    b"comm=",
    b"@c1;errors;",
    b"NODE_FAIL",
    b" ",
    b"\t",
    b"nan",
    b"1e308",
]


def mutate(data: bytes, rng: random.Random, rounds: int) -> bytes:
    buf = bytearray(data)
    for _ in range(rounds):
        if not buf:
            buf += rng.choice(JUNK)
            continue
        at = rng.randrange(len(buf))
        how = rng.randrange(5)
        if how == 0:
            buf[at] = rng.randrange(256)
        elif how == 1:
            buf[at:at] = rng.choice(JUNK)
        elif how == 2:
            del buf[at : at + rng.randrange(1, 200)]
        elif how == 3:  # a line said twice (overlapping exports) or a line lost
            start = buf.rfind(b"\n", 0, at) + 1
            end = buf.find(b"\n", at)
            line = bytes(buf[start : end if end >= 0 else len(buf)])
            buf[start:start] = line + b"\n" if rng.random() < 0.5 else b""
            if rng.random() < 0.5:
                del buf[start : start + len(line) + 1]
        else:
            del buf[at:]
    return bytes(buf)


def pipeline(sacct: bytes, event_bytes: bytes | None):
    """What the commands do with the bytes, as a text-mode read decodes them."""
    try:
        runs = history.parse(sacct.decode("utf-8", "replace"))
    except history.HistoryFormatError as exc:
        assert "\n" not in str(exc)
        return None, None
    evs = events.parse(event_bytes.decode("utf-8", "replace")) if event_bytes is not None else None
    found = causes.classify(runs, evs)
    assert len(found.cause) == runs.n and set(found.suspects) <= set(range(runs.n))
    until = max(runs.as_of, 1)
    since = until - 40 * 86400
    scored = [lemons.score(runs, found, p, since, until, Policy()) for p in sorted(set(runs.partitions))]
    for r in scored:
        assert r.failures <= r.runs and r.localized + r.unlocalized == r.failures
        for s in r.lemons + r.closest:
            assert 0.0 <= s.p_value <= 1.0 and math.isfinite(s.expected) and s.failures >= 0
        render.lemons_text([r])
    rep = report.build(runs, found, since, until)
    assert rep.interruptions <= rep.runs + runs.n and rep.node_days >= 0 and math.isfinite(rep.node_days)
    assert rep.ettr is None or 0.0 <= rep.ettr <= 1.0
    render.reliability_text(rep)
    for which in render.TABLES:
        render.reliability_csv(rep, which)
    render.reliability_json(rep)
    return scored, rep


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(SEEDS) - 1), st.integers(0, len(EVENT_SEEDS) - 1), st.integers(1, 40), st.randoms())
def test_damaged_dumps_never_raise(which, which_events, rounds, rng):
    pipeline(mutate(SEEDS[which], rng, rounds), mutate(EVENT_SEEDS[which_events], rng, rounds))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=2000))
def test_bytes_that_are_no_dump(sacct, event_bytes):
    header = "|".join(history.FIELDS).encode() + b"\n"
    pipeline(sacct, event_bytes)
    pipeline(header + sacct, event_bytes)


def test_damage_never_makes_a_lemon_of_a_clean_site():
    rng = random.Random(5)
    base, _ = pipeline(CLEAN.encode(), CLEAN_EVENTS.encode())
    assert base and not any(r.lemons for r in base)
    for _ in range(40):
        scored, _ = pipeline(
            mutate(CLEAN.encode(), rng, rng.randrange(1, 30)), mutate(CLEAN_EVENTS.encode(), rng, 5)
        )
        assert not any(r.lemons for r in scored or []), [s.node for r in scored for s in r.lemons]


def test_the_planted_lemon_survives_a_little_damage():
    rng = random.Random(6)
    base, _ = pipeline(PLANTED.encode(), PLANTED_EVENTS.encode())
    assert [s.node for r in base for s in r.lemons] == ["gpu005"]
    for _ in range(20):
        scored, _ = pipeline(mutate(PLANTED.encode(), rng, 3), PLANTED_EVENTS.encode())
        assert {s.node for r in scored or [] for s in r.lemons} <= {"gpu005"}
