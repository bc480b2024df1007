"""Shared helpers, once each: the one line writer (streams.say), the flock wrappers built on safeio.LockFile,
and the atomic writes that go through safeio.write_atomic."""

from __future__ import annotations

import io
import json
import os
import stat
import sys

import pytest

from slurm_tune import safeio
from slurm_tune.streams import say


class Broken(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_say_writes_one_line_and_reports_a_failed_stream():
    out = io.StringIO()
    assert say(out, "stune-stage: data: copied") is True
    assert out.getvalue() == "stune-stage: data: copied\n"
    closed = io.StringIO()
    closed.close()
    assert say(closed, "x") is False and say(Broken(), "x") is False and say(None, "x") is False


def test_every_note_writer_survives_a_dead_stream(monkeypatch):
    from slurm_tune.health import node
    from slurm_tune.sbatch import submit
    from slurm_tune.stage import stager, watch

    closed = io.StringIO()
    closed.close()
    stager._say(closed, "waiting")
    stager._say(Broken(), "waiting")
    progress = watch.Progress(Broken(), "data", 10, delay=0)
    progress.emit("1 of 10 bytes")
    assert progress.stream is None  # dropped after the first failure
    monkeypatch.setattr(sys, "stderr", Broken())
    submit.warn("warning: something")
    node._say_and_log("stune-health", None, "drained n1")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    submit.warn("warning: something")
    assert out.getvalue() == "stune-sbatch: warning: something\n"


def _locks(tmp_path):
    """Each flock wrapper, with the lock file it holds."""
    from slurm_tune.active.store import SweepLock
    from slurm_tune.fairshare.ledger import LedgerLock
    from slurm_tune.health.state import Locked

    return [
        (lambda: Locked(str(tmp_path / "health")), tmp_path / "health" / "lock"),
        (lambda: LedgerLock(str(tmp_path / "fs" / "ledger.json")), tmp_path / "fs" / "ledger.json.lock"),
        (lambda: SweepLock(str(tmp_path / "store"), "gpu"), tmp_path / "store" / "gpu.lock"),
    ]


def test_the_flock_wrappers_are_exclusive_and_released(tmp_path):
    for make, path in _locks(tmp_path):
        with make():
            other = os.open(path, os.O_RDONLY)
            try:
                assert not safeio.lock_fd(other, blocking=False), path  # held
            finally:
                os.close(other)
        other = os.open(path, os.O_RDONLY)
        try:
            assert safeio.lock_fd(other, blocking=False), path  # released on exit
        finally:
            os.close(other)


def test_the_non_waiting_locks_say_who_holds_them(tmp_path):
    from slurm_tune.errors import StuneError

    for make, path in _locks(tmp_path)[1:]:
        held = rf"^another (stune-fairshare|sweep of this partition) is running \(lock {path}\)$"
        with make(), pytest.raises(StuneError, match=held):
            make().__enter__()


def test_the_flock_wrappers_never_follow_a_symlink(tmp_path):
    from slurm_tune.errors import StuneError

    victim = tmp_path / "victim"
    victim.write_text("root's")
    for make, path in _locks(tmp_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(victim)
        with pytest.raises((OSError, StuneError)):
            make().__enter__()
    assert victim.read_text() == "root's"


def _planted(path, victim):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim)


def test_spool_writes_replace_a_planted_name_and_never_write_through_it(tmp_path):
    from slurm_tune.usage import spool

    victim = tmp_path / "victim"
    victim.write_text("root's")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    _planted(spool_dir / "42" / "n1.json", victim)
    path = spool.write_node_summary(str(spool_dir), {"job": "42", "node": "n1", "gpus": []})
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    _planted(spool_dir / "42" / spool.STORED_MARKER, victim)
    spool.write_marker(str(spool_dir / "42"), {"nodes": ["n1"]})
    assert victim.read_text() == "root's"
    summaries, marker = spool.read_job_dir(str(spool_dir / "42"))
    assert [s["node"] for s in summaries] == ["n1"] and marker == {"nodes": ["n1"]}
    assert sorted(os.listdir(spool_dir / "42")) == ["n1.json", "stored"]  # no temporary left behind
    os.mkfifo(spool_dir / "42" / "n2.json")  # a FIFO or a symlink among the summaries: skipped, no hang
    (spool_dir / "42" / "n3.json").symlink_to(spool_dir / "42" / "n1.json")
    summaries, _ = spool.read_job_dir(str(spool_dir / "42"))
    assert [s["node"] for s in summaries] == ["n1"]


def test_health_outputs_are_atomic_and_make_their_directory(tmp_path):
    from slurm_tune.health import outputs

    victim = tmp_path / "victim"
    victim.write_text("root's")
    target = tmp_path / "textfile" / "stune.json"
    outputs.write_json(str(target), {"status": "ok"})
    assert json.loads(target.read_text()) == {"status": "ok"}
    target.unlink()
    target.symlink_to(victim)
    outputs.write_json(str(target), {"status": "fail"})
    assert not target.is_symlink() and victim.read_text() == "root's"


def test_root_appends_go_through_safeio(tmp_path):
    """The health log and the active-check results: a planted symlink or FIFO is refused, never followed."""
    from slurm_tune.active import store
    from slurm_tune.health import state

    victim = tmp_path / "victim"
    victim.write_text("root's")
    health = tmp_path / "health"
    _planted(health / state.LOG_FILE, victim)
    state.log(str(health), "drained n1")  # best effort: refused quietly
    os.unlink(health / state.LOG_FILE)
    os.mkfifo(health / state.LOG_FILE)
    state.log(str(health), "drained n1")  # no reader: never hangs
    os.unlink(health / state.LOG_FILE)
    state.log(str(health), "drained n1", now=0)
    assert (health / state.LOG_FILE).read_text().endswith(" drained n1\n")
    _planted(tmp_path / "store" / "results" / "gpu" / "1970-01.jsonl", victim)
    with pytest.raises(safeio.UnsafePathError, match="symbolic link"):
        store.append(str(tmp_path / "store"), "gpu", [{"at": 0, "check": "x"}])
    assert victim.read_text() == "root's"


def test_kmsg_is_read_without_following_or_hanging(tmp_path):
    from slurm_tune.hw.kernellog import read_xid_events

    record = "4,1234,5678901,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1, GPU has fallen off the bus.\n"
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "dev").mkdir()
    (tmp_path / "real" / "dev" / "kmsg").write_text(record)
    assert [e["xid"] for e in read_xid_events(str(tmp_path / "real"))] == [79]
    (tmp_path / "link" / "dev").mkdir(parents=True)
    (tmp_path / "link" / "dev" / "kmsg").symlink_to(tmp_path / "real" / "dev" / "kmsg")
    assert read_xid_events(str(tmp_path / "link")) == []
    (tmp_path / "fifo" / "dev").mkdir(parents=True)
    os.mkfifo(tmp_path / "fifo" / "dev" / "kmsg")
    assert read_xid_events(str(tmp_path / "fifo")) == []  # a planted FIFO: no hang


# Known exceptions, each for a reason, checked by the audit below. Everything else opens, creates and locks
# through slurm_tune/safeio.py, or reads through trust.py's open_regular (safeio's own, for a hot path's
# cache that imports no more of safeio).
RAW_FLAG_EXCEPTIONS = {
    "stage/jobenv.py": "JobLog reads the job's own stderr file as the job's user (the TaskProlog)",
}
SAFE_OPEN_HOMES = ("safeio.py", "trust.py")
RAW_FLOCK_EXCEPTIONS: dict[str, str] = {}


def _raw_uses(names: set[str], module: str) -> dict[str, list[int]]:
    import ast
    from pathlib import Path

    import slurm_tune

    root = Path(slurm_tune.__file__).parent
    out: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in SAFE_OPEN_HOMES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in names
                and isinstance(node.value, ast.Name)
                and node.value.id == module
            ):
                out.setdefault(rel, []).append(node.lineno)
    return out


def test_the_safe_open_discipline_lives_in_safeio():
    """O_NOFOLLOW / O_NONBLOCK / O_EXCL and flock are spelled in safeio.py only (plus the exceptions above):
    a new root path that needs them uses safeio.open_file/open_dir/open_append/create_exclusive/LockFile."""
    flags = _raw_uses({"O_NOFOLLOW", "O_NONBLOCK", "O_EXCL"}, "os")
    unexpected = {f: lines for f, lines in flags.items() if f not in RAW_FLAG_EXCEPTIONS}
    assert not unexpected, f"open through slurm_tune.safeio instead of raw flags: {unexpected}"
    locks = _raw_uses({"flock", "lockf"}, "fcntl")
    unexpected = {f: lines for f, lines in locks.items() if f not in RAW_FLOCK_EXCEPTIONS}
    assert not unexpected, f"lock through safeio.LockFile / safeio.lock_fd instead: {unexpected}"


def test_open_dir_follows_a_symlink_only_when_asked(tmp_path):
    """The tier root is an admin's path (a mount point's alias may be a symlink); everything below it is not."""
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("x")
    with pytest.raises(safeio.UnsafePathError, match="symbolic link"):
        safeio.open_dir(str(tmp_path / "alias"))
    fd = safeio.open_dir(str(tmp_path / "alias"), follow_symlinks=True)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "real"))
    finally:
        os.close(fd)
    for follow in (False, True):
        with pytest.raises(safeio.UnsafePathError, match="not a directory"):
            safeio.open_dir(str(tmp_path / "file"), follow_symlinks=follow)


def test_the_tier_root_opens_through_safeio(tmp_path):
    """A symlinked tier root still works; a file or a missing path is TierUnavailable, as before."""
    from slurm_tune.stage.errors import TierUnavailable
    from slurm_tune.stage.tier import Tier, TierConfig

    (tmp_path / "cache").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "cache")
    (tmp_path / "file").write_text("x")
    with Tier(TierConfig(str(tmp_path / "alias"), None, 0.9, 0.5, "fast")) as tier:
        assert os.path.samestat(os.fstat(tier.fd), os.stat(tmp_path / "cache"))
    for name, words in (("file", "is not a directory"), ("missing", "does not exist")):
        config = TierConfig(str(tmp_path / name), None, 0.9, 0.5, "fast")
        with Tier(config) as tier, pytest.raises(TierUnavailable, match=words):
            _ = tier.fd  # the property raises


def test_the_stager_never_stamps_through_a_planted_symlink(tmp_path):
    """_publish and _verified open the staged directory with the tier toolkit: a symlink in its place
    (a user racing the stager) is refused, and nothing is written where it points."""
    from slurm_tune.stage import stager
    from slurm_tune.stage.layout import ENTRIES, TMP

    for sub in (TMP, ENTRIES):
        (tmp_path / sub).mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    fds = {sub: os.open(tmp_path / sub, os.O_RDONLY | os.O_DIRECTORY) for sub in (TMP, ENTRIES)}

    class FakeNamespace:
        def sub(self, name):
            return fds[name]

        def entry_path(self, entry):
            return str(tmp_path / ENTRIES / entry)

    try:
        (tmp_path / TMP / "k.1.staging").symlink_to(victim)
        with pytest.raises(NotADirectoryError):
            stager._publish(FakeNamespace(), "k.1.staging", "k.1", {"boot": "b"})
        (tmp_path / ENTRIES / "k.2").symlink_to(victim)
        tree = stager.fresh_manifest(FakeNamespace().entry_path("k.2"))[2]
        with pytest.raises(NotADirectoryError):
            stager._verified(FakeNamespace(), "k.2", {"boot": "another boot", "tree": tree})
        assert list(victim.iterdir()) == []
    finally:
        for fd in fds.values():
            os.close(fd)
