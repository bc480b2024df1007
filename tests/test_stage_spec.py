"""`--stage SRC[:NAME]` parsing and the STUNE_STAGE encoding (what stune-sbatch hands the TaskProlog)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_tune.errors import StuneError
from slurm_tune.stage.spec import (
    StageRequest,
    StageRequestError,
    decode_requests,
    default_name,
    encode_requests,
    merge_requests,
    parse_profile_stage,
    parse_stage_arg,
)


@pytest.mark.parametrize(
    "arg, source, name",
    [
        ("/lustre/datasets/imagenet:IMAGENET", "/lustre/datasets/imagenet", "IMAGENET"),
        ("/lustre/datasets/imagenet", "/lustre/datasets/imagenet", "IMAGENET"),
        ("/data/coco-2017.tar.gz", "/data/coco-2017.tar.gz", "COCO_2017"),
        ("/data/shards.tgz", "/data/shards.tgz", "SHARDS"),
        ("/data/3d-scans", "/data/3d-scans", "_3D_SCANS"),
        ("/data//a/./b/:b_2", "/data/a/b", "b_2"),
        ("/data/with:colon:NAME", "/data/with:colon", "NAME"),
        ("sub/dir:X", "/submit/sub/dir", "X"),
    ],
)
def test_parse_stage_arg(arg, source, name):
    assert parse_stage_arg(arg, cwd="/submit") == StageRequest(source, name)


@pytest.mark.parametrize(
    "arg, words",
    [
        ("../../etc:x", "climbs out"),
        ("../../etc", "climbs out"),
        ("data/../../etc:x", "climbs out"),
        ("/data/x:a/b", "must not contain '/'"),
        ("/data/x:..", "must not contain '/' or '..'"),
        ("/data/x:", "NAME is empty"),
        ("/data/x:9lives", "not a valid variable suffix"),
        ("/data/x:has-dash", "not a valid variable suffix"),
        ("/data/x:" + "A" * 65, "longer than 64"),
        ("/:ROOT", "root directory"),
        (":NAME", "SRC is empty"),
        ("", "needs SRC"),
    ],
)
def test_bad_stage_args_are_refused_with_the_argument_named(arg, words):
    with pytest.raises(StageRequestError) as info:
        parse_stage_arg(arg, cwd="/submit")
    message = str(info.value)
    assert words in message
    assert "\n" not in message
    assert isinstance(info.value, StuneError)


def test_default_name_drops_archive_suffixes():
    assert default_name("/x/imagenet.tar") == "IMAGENET"
    assert default_name("/x/imagenet.tar.zst") == "IMAGENET"
    assert default_name("/x/weights.bin") == "WEIGHTS_BIN"


def test_encode_decode_round_trip_with_awkward_paths():
    reqs = [StageRequest("/d/a;b%3B", "A"), StageRequest("/d/spaces here/x=y", "B")]
    text = encode_requests(reqs, required=True)
    assert text.startswith("v1;required;")
    assert decode_requests(text) == (reqs, True)
    assert decode_requests(encode_requests(reqs[:1], required=False)) == (reqs[:1], False)


def test_encode_refuses_a_name_given_twice():
    with pytest.raises(StageRequestError, match="given twice"):
        encode_requests([StageRequest("/a", "X"), StageRequest("/b", "X")], False)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "v2;optional;A=/a",
        "v1;maybe;A=/a",
        "v1;optional;A",
        "v1;optional;A=relative",
        "v1;optional;A=/a/../../etc",
        "v1;optional;bad/name=/a",
        "v1;optional;A=/a;A=/b",
    ],
)
def test_decode_rechecks_what_the_job_environment_says(text):
    with pytest.raises(StageRequestError):
        decode_requests(text)


_paths = (
    st.lists(
        st.text(
            st.characters(blacklist_characters="/\0\n", blacklist_categories=("Cs",)), min_size=1, max_size=12
        ).filter(lambda s: s not in (".", "..")),
        min_size=1,
        max_size=4,
    )
    .map(lambda parts: os.path.normpath("/" + "/".join(parts)))
    .filter(lambda p: p != "/" and not p.startswith("//"))
)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)


@given(st.lists(st.tuples(_paths, _names), max_size=5, unique_by=lambda t: t[1]), st.booleans())
def test_round_trip_property(pairs, required):
    reqs = [StageRequest(path, name) for path, name in pairs]
    assert decode_requests(encode_requests(reqs, required)) == (reqs, required)


def test_profile_defaults_merge_and_a_job_request_wins():
    defaults = parse_profile_stage(["/shared/tokenizer:TOK", "/shared/imagenet:IMAGENET"])
    mine = [parse_stage_arg("/scratch/my-imagenet:IMAGENET")]
    merged = merge_requests(defaults, mine)
    assert merged == [
        StageRequest("/shared/tokenizer", "TOK"),
        StageRequest("/scratch/my-imagenet", "IMAGENET"),
    ]
    with pytest.raises(StageRequestError, match="absolute"):
        parse_profile_stage(["relative/path:X"])


def test_spec_module_stays_light():
    """spec runs in stune-sbatch: it must not pull in re, json, subprocess or dataclasses."""
    from importcheck import loaded_by  # hermetic: the same under any kind of install

    loaded = loaded_by("import slurm_tune.stage.spec; import slurm_tune.stage.jobenv")
    assert not loaded & {"re", "json", "subprocess", "dataclasses", "typing", "shutil"}
