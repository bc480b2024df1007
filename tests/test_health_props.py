"""Property-based tests: garbage in every snapshot field and every sysfs file never raises, and nothing is
judged "fail" because something could not be parsed. Plus the fast JSON path against the json module."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import healthkit as kit
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slurm_tune import fastjson
from slurm_tune.health import collect, ib
from slurm_tune.health import judge as health_judge
from slurm_tune.health.result import FAIL, OK
from slurm_tune.hw import sysfs as hw_sysfs
from slurm_tune.profiles import version_key

REPO = Path(__file__).resolve().parent.parent


def _version_garbage(text: str) -> bool:
    return not version_key(text)


# What each grammar-bound field accepts; garbage for it is text its parser rejects.
PARSERS = {
    "state": lambda t: ib._known(t, ib.PORT_STATES) is None,
    "phys_state": lambda t: ib._known(t, ib.PHYS_STATES) is None,
    "rate": lambda t: hw_sysfs.parse_rate_gbps(t) is None,
    "link_layer": lambda t: t not in ("InfiniBand", "Ethernet"),
    "fw_ver": _version_garbage,
    "driver_version": _version_garbage,
    "cuda_driver_version": _version_garbage,
    "vbios_version": _version_garbage,
    "operstate": lambda t: t not in ib.OPERSTATES,
    "flags": lambda t: hw_sysfs.parse_int(t) is None,
    "current_link_width": lambda t: hw_sysfs.parse_int(t) is None,
    "max_link_width": lambda t: hw_sysfs.parse_int(t) is None,
    "vendor": lambda t: hw_sysfs.parse_int(t) is None,
}
COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors")
# Free text that is compared, not parsed: another value there is a real finding, not garbage.
FREE_TEXT = {"name", "netdevs"}


def unparseable(key: str, text: str) -> bool:
    if key in COUNTERS:
        return hw_sysfs.parse_counter(text) is None
    return PARSERS.get(key, lambda t: True)(text)


def leaves(value, path=()):
    """Every path into a snapshot (containers too), with its value."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))


def _snapshots():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for partition in ("hdr", "roce", "vpc"):
            out[partition] = kit.node_snapshot(Path(tmp) / partition, partition)
    return out


SNAPSHOTS = _snapshots()
PATHS = [(p, path) for p, snap in SNAPSHOTS.items() for path, _ in leaves(snap) if path]

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
)
GARBAGE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _is_garbage_for(old, new, key) -> bool:
    """Wrong type for the field, or (for text) text the field's parser rejects."""
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is not type(new)
    if isinstance(old, str):
        return not isinstance(new, str) or (key not in FREE_TEXT and unparseable(key, new))
    if isinstance(old, (int, float)):
        return not isinstance(new, (int, float)) or (
            isinstance(new, float) and not new.is_integer() and not isinstance(old, float)
        )
    return type(new) is not type(old)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), GARBAGE)
def test_garbage_in_any_snapshot_field_is_never_a_failure(where, garbage):
    partition, path = where
    snap = SNAPSHOTS[partition]
    old = snap
    for key in path:
        old = old[key]
    key = next((k for k in reversed(path) if isinstance(k, str)), "")
    assume(_is_garbage_for(old, garbage, key))
    assume(not (key in FREE_TEXT or (len(path) > 1 and path[-2] in FREE_TEXT)))
    verdict, _ = health_judge.judge(kit.mutate(snap, path, garbage), kit.profile(partition), {})
    failures = [r.line() for r in verdict.results if r.status == FAIL]
    assert not failures, f"{path} = {garbage!r} made {failures}"


def test_the_unmutated_snapshots_are_healthy():
    for partition, snap in SNAPSHOTS.items():
        assert health_judge.judge(snap, kit.profile(partition), {})[0].status == OK


# ---- garbage in sysfs files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    """A DGX-A100 tree, and the state its first (clean) evaluation left: NVML listed its GPUs."""
    root = kit.tree(tmp_path_factory.mktemp("clean") / "root", "hdr")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    state: dict = {}
    health_judge.merge_state(
        state, health_judge.judge(kit.take(root, "hdr"), kit.profile("hdr"), {})[1], rebaseline=True
    )
    return root, files, state


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), garbage=st.binary(max_size=40))
def test_garbage_in_any_sysfs_file_is_never_a_failure(clean_tree, data, garbage):
    root, files, state = clean_tree
    rel = data.draw(st.sampled_from(files))
    text = garbage.decode("utf-8", "replace").strip()
    assume(unparseable(Path(rel).name, text))
    profile = kit.profile("hdr")
    original = (root / rel).read_bytes()
    (root / rel).write_bytes(garbage)
    try:
        for snap in (collect.fast(str(root), profile, "n1", state.get("gpu_pci")), kit.take(root, "hdr")):
            collect.add_known_gpus(hw_sysfs.Sysfs(str(root)), snap, state.get("gpu_pci"))
            verdict, _ = health_judge.judge(snap, profile, state)
            failures = [r.line() for r in verdict.results if r.status == FAIL]
            assert not failures, f"{rel} = {garbage!r} made {failures}"
    finally:
        (root / rel).write_bytes(original)


# ---- the fast JSON path is json ------------------------------------------------------------------------------

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_fastjson_round_trips_like_json(value):
    text = fastjson.dumps(value)
    assert text == json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(f" \n{json.dumps(value, indent=2)}\n ") == json.loads(json.dumps(value))


ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)
# what a history record holds: mostly plain strings (joined without _json), now and then one that is not
PLAIN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), ASCII, st.text(max_size=3)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(ASCII, inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=1000, deadline=None)
@given(PLAIN)
def test_fastjson_encodes_plain_values_as_json_does(value):
    assert fastjson.dumps(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))


def test_a_plain_record_is_encoded_without_loading_the_c_module():
    import subprocess
    import sys

    code = (
        "import sys\nfrom slurm_tune import fastjson\n"
        "value = {'argv': ['-p', 'roce'], 'env': {'PATH': '/usr/bin', 'X': ''}, 'job_id': None, 'v': 1}\n"
        "text = fastjson.dumps(value)\n"
        "assert '_json' not in sys.modules and 'json' not in sys.modules\n"
        "import json\n"
        "assert text == json.dumps(value, sort_keys=True, separators=(',', ':')), text\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_fastjson_rejects_what_json_rejects(text):
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            fastjson.loads(text)
        return
    got = fastjson.loads(text)
    assert got == expected or (isinstance(got, float) and math.isnan(got) and math.isnan(expected))


class _OtherSignature:
    """A `_json` of a release whose entry points take other arguments."""

    @staticmethod
    def make_scanner(context, extra):
        raise AssertionError("not called like this")

    @staticmethod
    def make_encoder(*args):
        raise TypeError("make_encoder() takes 10 positional arguments")

    encode_basestring_ascii = staticmethod(json.encoder.encode_basestring_ascii)


class _OtherAnswers(_OtherSignature):
    """One that takes the arguments but answers differently."""

    @staticmethod
    def make_scanner(context):
        return lambda text, i: ({}, len(text))

    @staticmethod
    def make_encoder(*args):
        return lambda obj, level: iter(["{}"])


@pytest.mark.parametrize(
    "fake", [_OtherSignature, _OtherAnswers, None], ids=["other-signature", "other-answers", "none"]
)
def test_fastjson_falls_back_to_json_when_the_private_api_differs(monkeypatch, fake):
    """fastjson wraps CPython's private `_json`: where it has other signatures, answers differently, or is
    missing, reading and writing give json's results through json, and bad input json's message."""
    monkeypatch.setattr(fastjson, "_c_json", lambda: fake)
    monkeypatch.setattr(fastjson, "_scan", fastjson._UNBUILT)
    monkeypatch.setattr(fastjson, "_encode", fastjson._UNBUILT)
    value = {"a": [1, 2.5, None, True], "b": 'caf\u00e9 "q"', "n": {"x": 1e300}, "s": ["\n\t"]}
    text = fastjson.dumps(value)
    assert text == json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert fastjson._encode is None  # the probe refused the C encoder: json did the work
    assert fastjson.loads(text) == value and fastjson._scan is None
    with pytest.raises(ValueError, match="line 1 column 7"):
        fastjson.loads('{"a": }')
