"""Faults lose nothing (#28): numbers read back from stune's own files are finite and in range or refused in
one line naming the file and the key; every writer on a full disk fails in one line naming its file and
leaves the previous file as it was (a small tmpfs, filled, mounted by the test: root only).

The cluster halves (a poisoned ledger changes no SiteFactor; `collect` after a slurmdbd outage) are in
test_fairshare_cluster.py."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tune import readback, safeio
from slurm_tune.active import store as active_store
from slurm_tune.cli.common import guarded
from slurm_tune.errors import EXIT_ERROR, CorruptFileError, FileWriteError, StuneError
from slurm_tune.fairshare.ledger import FORMAT as LEDGER_FORMAT
from slurm_tune.fairshare.ledger import Ledger, LedgerError
from slurm_tune.health import state as health_state
from slurm_tune.sbatch import history, historyview
from slurm_tune.stage.layout import parse_row
from slurm_tune.stage.tier import Tier, TierConfig
from slurm_tune.usage import spool

BIN = Path(sys.executable).parent
GARBAGE = [float("nan"), float("inf"), float("-inf"), -1e300, 1e308, "abc", "1.5", True, None, [1]]


# ---- the one rule --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", GARBAGE)
def test_the_rule_refuses_what_stune_never_writes(value):
    assert readback.problem(value, 0, 1e18) is not None
    with pytest.raises(CorruptFileError) as info:
        readback.number(value, "/x/ledger.json", "usage.a|u[0]", 0, 1e18)
    assert str(info.value).startswith("/x/ledger.json: usage.a|u[0]: ") and "\n" not in str(info.value)


def test_the_rule_passes_finite_numbers_in_range_and_integers_when_asked():
    assert readback.number(0, "f", "k") == 0 and readback.number(2.5, "f", "k", 0, 3) == 2.5
    assert readback.problem(4, 0, 3) and readback.problem(2.0, 0, 3, integer=True)
    assert readback.parse("12", 0, 100, integer=True) == 12
    assert readback.parse("1e400") is None and readback.parse("nan") is None and readback.parse("-1") is None
    assert readback.parse("٣", integer=True) is None  # a digit, but not ASCII


# ---- the fair-share ledger -----------------------------------------------------------------------------------


def _ledger(path: Path, usage=(1.5, 2.5), **over) -> bytes:
    doc = {
        "format": LEDGER_FORMAT,
        "watermark": 1_700_000_000,
        "as_of": 1_700_000_100,
        "half_life_s": 604800,
        "usage": {"physics|alice": list(usage)},
        "settled": {"12@1699999000": 1_699_999_500},
        **over,
    }
    path.write_text(json.dumps(doc))  # json writes NaN and Infinity, as a corrupted ledger would hold them
    return path.read_bytes()


def test_a_sound_ledger_loads_its_values(tmp_path):
    _ledger(tmp_path / "ledger.json")
    ledger = Ledger.load(str(tmp_path / "ledger.json"))
    assert ledger.usage == {("physics", "alice"): [1.5, 2.5]} and ledger.watermark == 1_700_000_000


@pytest.mark.parametrize("value", GARBAGE[:6])
def test_a_corrupt_usage_value_is_refused_naming_the_file_and_key_and_the_file_is_kept(tmp_path, value):
    path = tmp_path / "ledger.json"
    before = _ledger(path, usage=(1.5, value))
    with pytest.raises(LedgerError) as info:
        Ledger.load(str(path))
    assert str(info.value).startswith(f"{path}: usage.physics|alice[1]: ") and "\n" not in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "key,value",
    [
        ("watermark", float("nan")),
        ("as_of", 1e308),
        ("half_life_s", -1.0),
        ("settled", {"12@1": "abc"}),
        ("usage", {"physics|alice": [1.0]}),
        ("usage", []),
        ("as_of", 1.5),
    ],
)
def test_corrupt_times_and_shapes_are_refused_too(tmp_path, key, value):
    path = tmp_path / "ledger.json"
    _ledger(path, **{key: value})
    with pytest.raises(LedgerError) as info:
        Ledger.load(str(path))
    assert str(info.value).startswith(f"{path}: {key}")


def test_the_cli_boundary_says_it_in_one_line_and_exits_1(tmp_path, capsys):
    path = tmp_path / "ledger.json"
    _ledger(path, usage=("abc", 1.0))
    assert guarded("stune-fairshare", lambda argv: Ledger.load(str(path)), []) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage.physics|alice[0]" in err and str(path) in err


# ---- the other state files -----------------------------------------------------------------------------------


def _state(directory: Path, **over) -> None:
    doc = {
        "format": health_state.FORMAT,
        "node": "n1",
        "baselines": {"mlx5_0/1": {"symbol_error": 3}},
        "xid_sticky": [],
        "trusted": ["abcd1234"],
        "applied": {"action": "clear", "reason": "", "synced_at": 1_700_000_000.0},
        **over,
    }
    directory.mkdir(exist_ok=True)
    (directory / health_state.STATE_FILE).write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "over,key",
    [
        ({"baselines": {"mlx5_0/1": {"symbol_error": float("nan")}}}, "baselines.mlx5_0/1.symbol_error"),
        ({"applied": {"action": "drain", "retry_at": float("inf")}}, "applied.retry_at"),
        ({"hook_fail": {"mode": "prolog", "at": -1e300}}, "hook_fail.at"),
        ({"xid_seq": 1e308}, "xid_seq"),
        ({"unknown_runs": {"ib.link mlx5_0/1": "abc"}}, "unknown_runs.ib.link mlx5_0/1"),
    ],
)
def test_a_health_state_with_a_garbage_number_starts_over_naming_the_key_and_keeps_the_file(
    tmp_path, over, key
):
    directory = tmp_path / "st"
    _state(directory, **over)
    before = (directory / health_state.STATE_FILE).read_bytes()
    state, problem = health_state.read(str(directory))
    assert state == health_state.empty() and problem.startswith(
        f"{directory / health_state.STATE_FILE}: {key}: "
    )
    with health_state.Locked(str(directory)) as st:
        assert (
            st.state == health_state.empty()
            and f"kept as {directory / health_state.STATE_FILE}.bad" in st.problem
        )
    assert (directory / (health_state.STATE_FILE + ".bad")).read_bytes() == before


def test_a_sound_health_state_reads_back_whole(tmp_path):
    _state(tmp_path / "st")
    state, problem = health_state.read(str(tmp_path / "st"))
    assert problem is None and state["baselines"] == {"mlx5_0/1": {"symbol_error": 3}}


def _result(**over) -> dict:
    return {
        "at": 1_700_000_000.0,
        "sweep": "s1",
        "partition": "gpu",
        "check": "nccl",
        "subject": "n1",
        "status": "ok",
        "value": 180.0,
        "unit": "GB/s",
        "fingerprint": {"driver": "535"},
        **over,
    }


def test_active_results_with_garbage_numbers_are_skipped(tmp_path):
    bad = [
        _result(value=float("inf")),
        _result(value=1e308),
        _result(at=float("nan")),
        _result(at=-5.0),
        _result(at=1e300),
    ]
    active_store.append(str(tmp_path), "gpu", [_result()])
    path = Path(active_store.partition_dir(str(tmp_path), "gpu")) / "2023-11.jsonl"
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in bad))
    assert active_store.load(str(tmp_path), "gpu", until=1_700_000_001) == [_result()]


@pytest.mark.parametrize(
    "text,key",
    [
        ('{"marks": {"n1": {"action": "drain", "at": NaN}}}', "marks.n1.at"),
        ('{"marks": {"n1": {"synced_at": 1e308}}}', "marks.n1.synced_at"),
        ('{"marks": {"n1": {"applied": {"retry_at": NaN}}}}', "marks.n1.applied.retry_at"),
        ('{"marks": {"n1": {"hook_fail": {"at": -1e300}}}}', "marks.n1.hook_fail.at"),
        ('{"marks": ', ""),
    ],
)
def test_a_garbage_sweep_state_is_refused_naming_the_file_and_kept(tmp_path, text, key):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(CorruptFileError) as info:
        active_store.read_state(str(tmp_path))
    assert str(info.value).startswith(f"{path}: {key}") and path.read_text() == text
    assert active_store.read_state(str(tmp_path / "none")) == {}


@pytest.mark.parametrize("text", ["nan ready", "1e308 ready", "-5 ready", "٣ ready", "99999999999 ready"])
def test_a_tier_ledger_row_with_a_garbage_size_is_ignored(text):
    assert parse_row(text, 10**10) is None
    assert parse_row("4096 ready", 10**10) == (4096, "ready")


def test_the_history_skips_torn_and_garbage_lines_and_counts_them(tmp_path):
    path = tmp_path / "h.jsonl"
    environ = {"STUNE_HISTORY": str(path)}
    history.record({"time": 1_700_000_000, "job_id": "1"}, environ)
    with open(path, "a") as fh:
        fh.write('{"time": NaN, "job_id": "2"}\n{"time": 1e308, "job_id": "3"}\n{"time": 1700000000, "job')
    entries = historyview.load(environ)
    assert [e["job_id"] for e in entries] == ["1"]
    assert [line for line, _ in entries.skipped] == [2, 3, 4]
    assert (
        entries.warning() == f"{path}: skipped 3 unreadable lines (first: line 2, time: nan is not a finite "
        "number)"
    )
    # the listing says it on stderr, once, and still lists the sound records (a sacct that knows no job: the
    # only warning is the history's)
    slurm_bin = tmp_path / "bin"
    slurm_bin.mkdir()
    (slurm_bin / "sacct").write_text("#!/bin/sh\nexit 0\n")
    (slurm_bin / "sacct").chmod(0o755)
    proc = subprocess.run(
        [str(BIN / "stune-sbatch"), "history"],
        capture_output=True,
        text=True,
        env=dict(os.environ, STUNE_HISTORY=str(path), STUNE_SLURM_BIN=str(slurm_bin)),
    )
    assert proc.returncode == 0 and proc.stderr == f"stune-sbatch: warning: {entries.warning()}\n"
    assert proc.stdout.count("\n") == 2  # the header and job 1


# ---- a full disk ---------------------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs: `fill()` takes all its free space (after the test wrote its previous files)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")

    class Disk:
        path = mnt

        @staticmethod
        def fill() -> None:
            fd = os.open(mnt / ".filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            finally:
                os.close(fd)
            assert os.statvfs(mnt).f_bavail == 0

    try:
        yield Disk
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _one_line_naming(exc: BaseException, path) -> None:
    assert isinstance(exc, StuneError) and str(path) in str(exc) and "\n" not in str(exc), exc
    assert "No space left on device" in str(exc)


def _no_temporaries(directory: Path) -> None:
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_on_a_full_disk_names_the_file_and_keeps_the_old_one(full_disk):
    path = full_disk.path / "f.json"
    path.write_text("old\n")
    full_disk.fill()
    with pytest.raises(FileWriteError) as info:
        safeio.write_atomic(str(path), "x" * 10000)
    _one_line_naming(info.value, path)
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC  # callers catching OSError
    assert path.read_text() == "old\n"
    _no_temporaries(full_disk.path)


def test_the_ledger_on_a_full_disk(full_disk):
    path = full_disk.path / "ledger.json"
    before = _ledger(path)
    ledger = Ledger.load(str(path))
    ledger.usage[("biology", "bob")] = [1e6, 2e6]
    ledger.settled.update({f"{i}@1699999000": 1_699_999_500 for i in range(5000)})
    full_disk.fill()
    with pytest.raises(LedgerError) as info:
        ledger.save()
    _one_line_naming(info.value, path)
    assert path.read_bytes() == before
    _no_temporaries(full_disk.path)


def test_the_health_state_on_a_full_disk(full_disk):
    directory = full_disk.path / "st"
    _state(directory)
    before = (directory / health_state.STATE_FILE).read_bytes()
    with health_state.Locked(str(directory)) as st:
        st.state["baselines"] = {f"mlx5_{i}/1": {"symbol_error": i} for i in range(2000)}
        full_disk.fill()
        with pytest.raises(FileWriteError) as info:
            st.save()
    _one_line_naming(info.value, directory / health_state.STATE_FILE)
    assert (directory / health_state.STATE_FILE).read_bytes() == before


def test_stune_health_run_on_a_full_disk_exits_1_naming_the_state_file(full_disk, tmp_path):
    import healthkit as kit

    state = full_disk.path / "st"
    env = dict(
        os.environ,
        STUNE_PARTITIONS=str(kit.profile_dir(tmp_path / "p")),
        STUNE_SYSFS_ROOT=str(kit.tree(tmp_path / "root", "hdr")),
        SLURMD_NODENAME="n7",
        STUNE_GPU_SNAPSHOT=str(kit.gpu_file(tmp_path / "gpus.json")),
        STUNE_STATE_DIR=str(state),
        STUNE_HEALTH_PARTITION="hdr",
        SLURM_CONF="/nonexistent/slurm.conf",
    )
    env.pop("STUNE_DEBUG", None)
    first = subprocess.run([str(BIN / "stune-health"), "run"], env=env, capture_output=True, text=True)
    assert (state / health_state.STATE_FILE).exists(), first.stderr
    before = (state / health_state.STATE_FILE).read_bytes()
    full_disk.fill()
    proc = subprocess.run([str(BIN / "stune-health"), "run"], env=env, capture_output=True, text=True)
    assert proc.returncode == EXIT_ERROR, proc.stderr
    assert (
        proc.stderr
        == f"stune-health: {state / health_state.STATE_FILE}: cannot write: No space left on device\n"
    )
    assert (state / health_state.STATE_FILE).read_bytes() == before


def test_a_history_record_on_a_full_disk_is_whole_or_absent(full_disk):
    """The issue's case: the record does not fit in what is left of the file's last page, so write() is
    short (the first part lands, the rest gets ENOSPC). Nothing of it may stay."""
    path = full_disk.path / "h.jsonl"
    environ = {"STUNE_HISTORY": str(path)}
    history.record({"time": 1_700_000_000, "job_id": "1", "env": {"A": "x" * 100}}, environ)
    before = path.read_bytes()
    full_disk.fill()
    with pytest.raises(FileWriteError) as info:
        history.record({"time": 1_700_000_001, "job_id": "2", "env": {"A": "y" * 8000}}, environ)
    _one_line_naming(info.value, path)
    assert path.read_bytes() == before
    assert [e["job_id"] for e in historyview.load(environ)] == ["1"]


def test_spool_summaries_and_markers_on_a_full_disk(full_disk):
    doc = {"v": 1, "job": "42", "node": "n1", "start": 0, "end": 10, "gpus": [], "series": "s" * 100}
    written = Path(spool.write_node_summary(str(full_disk.path), doc))
    job_dir = written.parent
    spool.write_marker(str(job_dir), {"stored": [], "expected": ["n1"], "at": 0})
    before = {p.name: p.read_bytes() for p in job_dir.iterdir()}
    full_disk.fill()
    with pytest.raises(FileWriteError) as info:
        spool.write_node_summary(str(full_disk.path), dict(doc, series="t" * 20000))
    _one_line_naming(info.value, written)
    with pytest.raises(FileWriteError) as info:
        spool.write_marker(str(job_dir), {"stored": ["n1"] * 3000, "expected": ["n1"], "at": 1})
    _one_line_naming(info.value, job_dir / spool.STORED_MARKER)
    assert {p.name: p.read_bytes() for p in job_dir.iterdir()} == before


def test_the_sweep_store_on_a_full_disk(full_disk):
    store = str(full_disk.path)
    active_store.append(store, "gpu", [_result()])
    active_store.write_state(store, {"marks": {"n1": {"action": "degrade", "at": 1_700_000_000.0}}})
    results = Path(active_store.partition_dir(store, "gpu")) / "2023-11.jsonl"
    state = full_disk.path / "state.json"
    before = results.read_bytes(), state.read_bytes()
    full_disk.fill()
    with pytest.raises(FileWriteError) as info:
        active_store.append(store, "gpu", [_result(subject=f"n{i}", detail="d" * 100) for i in range(200)])
    _one_line_naming(info.value, results)
    with pytest.raises(FileWriteError) as info:
        active_store.write_state(
            store, {"marks": {f"n{i}": {"action": "degrade", "at": 1.0} for i in range(2000)}}
        )
    _one_line_naming(info.value, state)
    assert (results.read_bytes(), state.read_bytes()) == before
    assert active_store.load(store, "gpu", until=1_700_000_001) == [_result()]


def test_the_cache_tier_ledger_on_a_full_disk(full_disk):
    root = full_disk.path / "tier"
    (root / ".ledger").mkdir(parents=True)
    os.chmod(root, 0o1777)
    os.chmod(root / ".ledger", 0o1777)
    entry = "0" * 32 + ".1"
    with Tier(TierConfig(str(root), None, 0.9, 0.8, "mtime")) as tier:
        tier.ledger_write(0, entry, 4096, "ready")
        row = root / ".ledger" / f"0.{entry}"
        before = row.read_bytes()
        # a row is a few bytes: make the disk hold no page at all for the new one
        full_disk.fill()
        with pytest.raises(FileWriteError) as info:
            tier.ledger_write(0, entry, 8192, "ready")
    _one_line_naming(info.value, row)
    assert row.read_bytes() == before
    _no_temporaries(root / ".ledger")


@pytest.mark.cluster
def test_stune_sbatch_on_a_full_disk_submits_and_warns_in_one_line(full_disk, slurm):
    """The issue's case on the real cluster: the history cannot take the record. The job is submitted (rc 0,
    its id printed), the user is told in one line naming the file, and the history holds no torn record."""
    path = full_disk.path / "history.jsonl"
    env = dict(os.environ, STUNE_HISTORY=str(path))
    job = ["--parsable", "-H", "-o", "/dev/null", "-J", "faults", "-p", "roce", "--wrap", "true"]
    first = subprocess.run([str(BIN / "stune-sbatch"), *job], capture_output=True, text=True, env=env)
    assert first.returncode == 0 and path.exists(), first.stderr
    before = path.read_bytes()
    full_disk.fill()
    try:
        proc = subprocess.run(
            [str(BIN / "stune-sbatch"), *job],
            capture_output=True,
            text=True,
            env=dict(env, BIG_SETTING="y" * 8000),
        )  # a record longer than the page left
    finally:
        slurm.run(["scancel", "-n", "faults"], check=False)
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), proc.stderr
    assert proc.stderr == (
        "stune-sbatch: warning: job submitted, but the history was not written: "
        f"{path}: cannot write: No space left on device\n"
    )
    assert path.read_bytes() == before
