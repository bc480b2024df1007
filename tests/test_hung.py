"""A hung driver is a broken node (health/hang.py): a probe past its deadline run after run is degraded, then
drained `stune: <read> hung for N runs`; a reader stuck in D state is degraded at once. Real hangs: a FIFO
where a sysfs file belongs blocks open() as a wedged driver blocks a read (the reader waits, state S), and a
thread waiting for a vfork child is in uninterruptible sleep (state D), as a reader inside a hung driver is."""

from __future__ import annotations

import ctypes
import os
import sys
import time

import incidentkit as ik
import pytest

from slurm_tune.health import hang, result
from slurm_tune.hw.deadline import TIMEOUT, run_probe, thread_state

FAST = "  probe_timeout_s: 0.3\n"


@pytest.fixture
def fifos():
    """FIFOs planted where files belong; at the end a writer opens each, so every reader blocked on one
    (the abandoned probe threads) is let go."""
    made: list = []

    def plant(path):
        path.unlink()
        os.mkfifo(path)
        made.append(path)
        return path

    yield plant
    for path in made:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_reader_waiting_is_told_apart_from_one_stuck_in_the_kernel(tmp_path, fifos):
    fifo = tmp_path / "f"
    fifo.write_text("")
    fifos(fifo)

    def read(partial):
        with open(fifo) as fh:  # blocks in open() until a writer comes
            return fh.read()

    waiting = run_probe("sysfs", read, 0.3)
    assert (waiting.status, waiting.reader) == (TIMEOUT, "S")
    assert waiting.timed_out() == {"timeout": True, "reader": "S"}
    assert run_probe("fine", lambda partial: 1, 1).timed_out() == {}
    assert thread_state(None, os.getpid()) == "R" and thread_state("nope") == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's posix_spawn and /proc")
def test_a_reader_in_uninterruptible_sleep_shows_as_d(tmp_path):
    """glibc's posix_spawn clones with CLONE_VFORK; its child opens a FIFO before exec and blocks there, and
    the spawning thread waits for it in uninterruptible sleep, as a read does inside a hung driver."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    libc = ctypes.CDLL(None, use_errno=True)

    def spawn(partial):
        actions = ctypes.create_string_buffer(512)  # posix_spawn_file_actions_t, with room to spare
        libc.posix_spawn_file_actions_init(actions)
        libc.posix_spawn_file_actions_addopen(actions, 0, str(fifo).encode(), os.O_RDONLY, 0)
        pid = ctypes.c_int()
        argv = (ctypes.c_char_p * 2)(b"/bin/true", None)
        libc.posix_spawn(ctypes.byref(pid), b"/bin/true", actions, None, argv, None)
        return pid.value

    stuck = run_probe("nvml", spawn, 0.3)
    try:
        assert (stuck.status, stuck.reader) == (TIMEOUT, "D")
    finally:
        os.close(os.open(fifo, os.O_WRONLY))  # let the child go on to exec
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if os.waitpid(-1, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.05)


def test_a_capture_says_which_probe_hung_on_what(tmp_path, fifos, monkeypatch):
    from slurm_tune.hw import snapshot
    from slurm_tune.hw.sysfs import Sysfs

    world = ik.World(tmp_path, monkeypatch, health_yaml=FAST)
    fifos(world.root / "sys/class/infiniband/mlx5_2/ports/1/state")
    section = snapshot.capture_ib(Sysfs(str(world.root)), 0.3)
    assert section["answered"] is False and section["timeout"] is True
    assert (section["stalled_at"], section["reader"]) == ("mlx5_2", "S")
    assert set(section["devices"]) == {"mlx5_0", "mlx5_1"}  # what was read before the stall is kept
    assert hang.hung({"ib": section, "net": {"answered": True, "devices": {}}}) == {
        "sysfs-ib": {"stalled_at": "mlx5_2", "reader": "S"}
    }


def test_a_read_that_hangs_three_runs_in_a_row_drains_the_node(tmp_path, fifos, monkeypatch):
    world = ik.World(tmp_path, monkeypatch, health_yaml=FAST)
    assert world.run()[1]["status"] == "ok"
    state_file = world.root / "sys/class/infiniband/mlx5_2/ports/1/state"
    fifos(state_file)
    code, doc = world.run()
    assert (code, doc["status"]) == (0, "unknown") and world.slurm.state["n1"]["flags"] == set()
    code, doc = world.run()
    assert (doc["status"], doc["reason"]) == ("degraded", "sysfs read of mlx5_2 hung")
    assert world.slurm.state["n1"]["comment"] == "stune: degraded: sysfs read of mlx5_2 hung"
    code, doc = world.run()
    assert (code, doc["status"], doc["reason"]) == (0, "fail", "sysfs read of mlx5_2 hung for 3 runs")
    assert world.slurm.state["n1"]["reason"] == "stune: sysfs read of mlx5_2 hung for 3 runs"
    assert doc["hangs"]["sysfs-ib"]["runs"] == 3
    code, doc = world.run()  # still hung: the same reason, so no Slurm call
    assert doc["reason"] == "sysfs read of mlx5_2 hung for 3 runs" and world.new_calls == []
    assert "in 4 periodic run(s) in a row" in doc["results"][0]["message"]
    assert '"sysfs-ib"' in (tmp_path / "state" / "last-run.json").read_text()
    os.close(os.open(state_file, os.O_WRONLY | os.O_NONBLOCK))  # the driver comes back
    state_file.unlink()
    state_file.write_text("4: ACTIVE\n")
    code, doc = world.run()
    assert doc["status"] == "ok" and world.slurm.state["n1"]["flags"] == set() and "hangs" not in doc


def _hung_snapshot(reader="S"):
    return {
        "ib": {"answered": False, "timeout": True, "stalled_at": "mlx5_2", "reader": reader, "devices": {}}
    }


class _Health:
    def __init__(self, degrade_after=2, drain_after=3):
        self.hang_degrade_after, self.hang_drain_after = degrade_after, drain_after


def test_a_reader_in_d_state_is_degraded_at_once_and_zero_never_drains():
    ok = result.make_verdict([result.ok("ib.link", "mlx5_0/1", "ACTIVE")])
    state: dict = {}
    v = hang.escalate(ok, _hung_snapshot("D"), state, _Health(), 1.0)
    assert (v.status, v.reason) == ("degraded", "sysfs read of mlx5_2 hung in D state")
    assert "the stuck reader is in D state" in v.results[0].message
    never: dict = {}
    for run in range(10):
        v = hang.escalate(ok, _hung_snapshot(), never, _Health(drain_after=0), float(run))
    assert v.status == "degraded" and never["hangs"]["sysfs-ib"]["runs"] == 10
    assert hang.escalate(ok, {"ib": {"answered": True}}, never, _Health(), 11.0) is ok
    assert never["hangs"] == {}  # it read again: forgotten


def test_a_hung_nvml_names_the_gpu_and_the_prolog_counts_no_hangs(tmp_path, fifos, monkeypatch):
    from slurm_tune.health import node as health_node

    gpus = {"answered": False, "timeout": True, "reader": "D", "stalled_at": 3, "devices": [], "error": "x"}
    v = hang.escalate(result.make_verdict([]), {"gpus": gpus}, {}, _Health(), 1.0)
    assert v.reason == "NVML read of gpu3 hung in D state"
    world = ik.World(tmp_path, monkeypatch, health_yaml=FAST)
    fifos(world.root / "sys/class/infiniband/mlx5_2/ports/1/state")
    for _ in range(4):
        code, doc = health_node.hook("prolog", health_node.settings({}))
        assert (code, doc["status"]) == (0, "unknown")
    from slurm_tune.health import state as health_state

    assert not health_state.read(world.env["STUNE_STATE_DIR"])[0].get("hangs")
