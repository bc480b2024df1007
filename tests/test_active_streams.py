"""The validation and scaling records' readers (active/streams.py) under byte-level fuzzing: a mutated or
random line is skipped or read whole, never a traceback, and whatever is read is safe for the comparison and
the acceptance page."""

from __future__ import annotations

import json
import math
import os
import time

import comparekit as kit
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_active_parse import mutate

from slurm_tune.active import acceptance, compare, judge, streams
from slurm_tune.active.scaling_judge import valid_record as valid_scaling_record
from slurm_tune.active.store import partition_dir
from slurm_tune.validate.records import valid_record

NOW = time.time()
BAD = kit.op("softmax", "fp16", "fail", max_rel=0.3)
LINES = {
    "validate": [
        kit.validate("hdr", "ops", "n1", "fail", NOW - 60, ops=[kit.op("matmul", "bf16"), BAD]),
        kit.validate(
            "hdr",
            "converge",
            "n1",
            "pass",
            NOW - 50,
            losses=[2.3, 1.9],
            steps=200,
            band=0.05,
            reference={"against": "partition a100", "node": "g1", "at": NOW - 900},
            max_dev=0.01,
            cold={"steps": 10, "seconds": 4.2, "steps_per_s": 2.4},
            steady={"steps": 190, "seconds": 20.0, "steps_per_s": 9.5},
            peak_mem_bytes=123456789,
        ),
        kit.validate(
            "hdr", "training", "n1", "pass", NOW - 40, verdict="pass", metrics={"ppl": 7.1}, note="", by="bob"
        ),
    ],
    "scaling": [
        kit.curve("hdr", "node", {1: 1.0, 2: 0.97, 8: 0.9}, NOW - 30),
        kit.curve(
            "hdr", "nodes", {1: 1.0, 4: 0.7}, NOW - 20, "knee", {"n": 4, "efficiency": 0.7, "why": "uplink"}
        ),
    ],
}
READERS = {"validate": streams.load_validate, "scaling": streams.load_scaling}
VALID = {"validate": valid_record, "scaling": valid_scaling_record}


def test_the_writers_lines_are_read_whole():
    for kind, lines in LINES.items():
        assert all(VALID[kind](r) for r in lines), kind


@pytest.mark.parametrize(
    "kind, change",
    [
        ("validate", {"layer": "weights"}),
        ("validate", {"status": "ok"}),
        ("validate", {"at": float("nan")}),
        ("validate", {"node": 7}),
        ("validate", {"ops": [{"op": "matmul", "status": "pass", "max_rel": "0.1"}]}),
        ("validate", {"ops": [{"op": "matmul", "status": "pass", "max_rel": True}]}),
        ("validate", {"fingerprint": {"driver": 535}}),
        ("scaling", {"points": [{"n": 0, "efficiency": 1.0}]}),
        ("scaling", {"points": [{"n": 2, "efficiency": -1.0}]}),
        ("scaling", {"knee": {"n": "4"}}),
        ("scaling", {"verdict": "great"}),
        ("scaling", {"scope": "rack"}),
    ],
)
def test_a_wrong_field_skips_the_record(kind, change):
    assert not VALID[kind](dict(LINES[kind][0], **change))


def test_a_tiny_tolerance_scores_finite():
    assert compare.op_score(dict(BAD, max_abs=1e15, tol_abs=5e-324)) == 1e15


def _use(directory, kind):
    """Read the partition back and put it through everything that reads the stream."""
    got = READERS[kind](str(directory), "hdr", 0.0)
    validate = got if kind == "validate" else []
    scaling = got if kind == "scaling" else []
    json.dumps(
        compare.compare(
            compare.side("hdr", "latest", [], validate, scaling),
            compare.side("hdr", "previous", [], validate, scaling),
        ),
        allow_nan=False,
    )
    acceptance.correct(validate)
    acceptance.fast({}, [], judge.Settings(2, 3, 3.0, 0.1, 3, {}), scaling, [], None, "hdr")
    for r in got:
        for o in r.get("ops") or ():
            assert math.isfinite(compare.op_score(o))
    return got


def _write(tmp_path, kind, blob: bytes):
    d = tmp_path / kind
    p = partition_dir(str(d), "hdr", kind)
    os.makedirs(p, exist_ok=True)
    with open(os.path.join(p, time.strftime("%Y-%m", time.gmtime(NOW)) + ".jsonl"), "wb") as fh:
        fh.write(blob)
    return d


@pytest.mark.parametrize("kind", sorted(LINES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_byte_level_fuzz_never_raises(tmp_path_factory, kind, data):
    whole = "".join(json.dumps(r) + "\n" for r in LINES[kind]).encode()
    got = _use(_write(tmp_path_factory.mktemp("f"), kind, mutate(data, whole)), kind)
    assert len(got) <= len(LINES[kind])


@pytest.mark.parametrize("kind", sorted(LINES))
@settings(max_examples=150, deadline=None)
@given(blob=st.binary(max_size=2048))
def test_random_bytes_are_skipped(tmp_path_factory, kind, blob):
    assert _use(_write(tmp_path_factory.mktemp("r"), kind, blob), kind) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    doc=JSON,
    base=st.sampled_from([r for rs in LINES.values() for r in rs]),
    key=st.sampled_from(
        ["ops", "points", "knee", "cold", "steady", "fingerprint", "max_dev", "band", "node", "verdict", "at"]
    ),
)
def test_any_json_in_any_field_is_judged_without_raising(doc, base, key):
    record = dict(base, **{key: doc})
    for valid in VALID.values():
        valid(record)
        valid(doc)


def test_the_store_reads_each_line_as_json_loads_would(tmp_path):
    """store._lines (the scanner in place) against json.loads per line, on odd lines among good ones."""
    from slurm_tune.active.store import _lines

    good = json.dumps(LINES["scaling"][0])
    odd = [good, "  " + good + " \r", "{}{}", "[1,", "NaN", '"x"', "", "\x00", good + " x", "9" * 5000, good]
    data = "\n".join(odd).encode()
    want = []
    for line in data.split(b"\n"):
        try:
            if line.strip():
                want.append(json.loads(line))
        except ValueError:
            pass
    got = list(_lines(data))
    assert len(got) == len(want) == 5 and json.dumps(got, default=str) == json.dumps(want, default=str)
    assert len(list(_lines(data + b"\n\xff\xfe\n" + good.encode()))) == 6  # bad UTF-8 costs its own line only
