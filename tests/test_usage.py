"""The node side of per-job GPU usage: summaries, mmap'd accumulators, the sampler, the node epilog and the
hook scripts. The controller side (EpilogSlurmctld, AdminComment) is in test_fairshare_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from usage_helpers import hermetic_env, write_snapshot

from slurm_tune.hw.nvml import GpuUtilization, open_gpu_source
from slurm_tune.usage import accum, spool, summary
from slurm_tune.usage.sampler import Sampler, device_minor

REPO = Path(__file__).resolve().parent.parent
BIN = os.path.dirname(sys.executable)


# ---- the summary text ------------------------------------------------------------------------------------
means = st.one_of(st.none(), st.floats(0, 1e5, allow_nan=False).map(lambda x: round(x, 1)))
gpu_means = st.builds(
    summary.GpuMeans,
    st.sampled_from(["n1", "gpu-a017", "dgx42"]),
    st.integers(0, 7).map(str),
    means,
    means,
    means.map(lambda x: None if x is None else float(round(x))),
    means,
)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        summary.JobSummary,
        st.floats(0, 1e9).map(lambda x: round(x, 1)),
        st.floats(0, 1e9).map(lambda x: round(x, 1)),
        st.floats(0, 1e9).map(lambda x: round(x, 1)),
        st.floats(0, 1e9).map(lambda x: round(x, 1)),
        means,
        st.integers(0, 4096),
        st.integers(0, 512),
        st.integers(0, 512),
        st.lists(gpu_means, max_size=16).map(tuple),
    )
)
def test_summary_text_round_trips(s):
    text = summary.encode(s)
    assert '"' not in text and "|" not in text and "\n" not in text  # sacctmgr-safe, sacct -P-safe
    back = summary.parse(text)
    assert back == s
    assert summary.parse_head(text) == (s.held, s.used, s.covered, s.busy, s.busy_w)


def test_parse_ignores_what_is_not_a_summary():
    assert summary.parse("") is None
    assert summary.parse("JS1:H4sIAAAAA") is None  # jobstats' own format
    assert summary.parse("stune1 held=oops used=1 cov=1") is None
    assert summary.parse_head("stune1 garbage") is None
    # a different key order still parses (slow path)
    text = "stune1 used=5.0 held=10.0 cov=10.0 busy=0.0 busy_w=- gpus=1 nodes=1/1 per_gpu="
    assert summary.parse_head(text) == (10.0, 5.0, 10.0, 0.0, None)


def node_doc(node, start, end, gpus):
    zero = dict.fromkeys(summary.ACC_FIELDS, 0.0)
    return {
        "node": node,
        "start": start,
        "end": end,
        "gpus": [{"id": gid, "acc": {**zero, **acc}} for gid, acc in gpus],
    }


def test_merging_two_nodes_adds_sums_and_recomputes_means():
    a = node_doc(
        "n1",
        0,
        100,
        [
            (
                0,
                {
                    "sm_dt": 100,
                    "sm_sum": 90,
                    "pw_dt": 100,
                    "pw_sum": 30000,
                    "busy_dt": 50,
                    "busy_pw_dt": 50,
                    "busy_pw_sum": 15000,
                },
            )
        ],
    )
    b = node_doc("n2", 0, 100, [(0, {"sm_dt": 50, "sm_sum": 5, "mib_dt": 50, "mib_sum": 50 * 1024}), (1, {})])
    merged = summary.merge([b, a], expected_nodes=3)
    assert (merged.held, merged.used, merged.covered, merged.busy) == (300.0, 95.0, 150.0, 50.0)
    assert merged.busy_w == 300.0
    assert (merged.gpus, merged.nodes_reported, merged.nodes_expected) == (3, 2, 3)
    assert merged.per_gpu[0] == summary.GpuMeans("n1", "0", 90.0, None, None, 300.0)
    assert merged.per_gpu[1].sm == 10.0 and merged.per_gpu[1].mib == 1024.0
    assert merged.per_gpu[2].sm is None
    assert merged.coverage == 0.5 and merged.eta == pytest.approx(95 / 150)


# ---- accumulators --------------------------------------------------------------------------------------
def test_accumulators_survive_a_reopen(tmp_path):
    path = str(tmp_path / "acc" / "42")
    os.makedirs(tmp_path / "acc")
    acc = accum.JobAccumulator(path, [2, 3], created=1000.0)
    acc.add(0, 1001.0, 1.0, 80, 10, 2048.0, 300.0, 95.0, 2)
    acc.add(1, 1001.0, 1.0, 100, 10, None, 90.0, 95.0, 3)
    acc.close()
    again = accum.JobAccumulator(path, [2, 3], created=5555.0)  # a restarted sampler
    assert again.created == 1000.0 and again.records[0][accum.F["last_ts"]] == 1001.0
    again.add(0, 1002.0, 1.0, 40, None, 1024.0, None, 95.0, 2)
    created, gpus = accum.read(path)
    assert created == 1000.0
    assert gpus[0]["gpu_id"] == 2 and gpus[0]["samples"] == 2 and gpus[0]["sm_dt"] == 2.0
    assert gpus[0]["sm_sum"] == pytest.approx(1.2)
    assert gpus[0]["mem_dt"] == 1.0 and gpus[0]["mib_max"] == 2048.0 and gpus[0]["pw_dt"] == 1.0
    assert gpus[1]["busy_dt"] == 1.0 and gpus[1]["busy_pw_sum"] == 90.0
    # the same job id with another allocation (a reused id) starts over
    other = accum.JobAccumulator(path, [0], created=7.0)
    assert other.records[0][accum.F["samples"]] == 0 and other.created == 7.0


def test_a_foreign_file_is_not_read_as_accumulators(tmp_path):
    bad = tmp_path / "acc"
    bad.write_bytes(b"hello")
    with pytest.raises(accum.AccumulatorError, match="truncated"):
        accum.read(str(bad))
    bad.write_bytes(b"X" * 200)
    with pytest.raises(accum.AccumulatorError, match="not a stune accumulator"):
        accum.read(str(bad))
    assert accum.read(str(tmp_path / "missing")) == (0.0, [])


# ---- the sampler -----------------------------------------------------------------------------------------
class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def prolog(local: Path, job: str, gpus: str, when: float | None = None) -> None:
    (local / "jobs").mkdir(parents=True, exist_ok=True)
    path = local / "jobs" / job
    path.write_text(gpus + "\n")
    if when is not None:
        os.utime(path, (when, when))


def test_sampler_attributes_each_gpu_to_its_job(tmp_path):
    local = tmp_path / "usage"
    snap = write_snapshot(tmp_path / "snap.json", 90, gpus=4, power=300.0)
    clock = Clock()
    sampler = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    assert sampler.sample_once() == 0  # no GPU job here: no GPU is read
    prolog(local, "7", "0,1", when=clock.t)
    prolog(local, "8", "3", when=clock.t)
    for _ in range(10):
        clock.t += 1.0
        sampler.sample_once()
    _, seven = accum.read(str(local / "acc" / "7"))
    _, eight = accum.read(str(local / "acc" / "8"))
    assert [int(g["gpu_id"]) for g in seven] == [0, 1] and [int(g["gpu_id"]) for g in eight] == [3]
    for g in seven + eight:
        assert g["samples"] == 10 and g["sm_dt"] == 10.0
        assert 100 * g["sm_sum"] / g["sm_dt"] == pytest.approx(90.0)
        assert g["pw_sum"] / g["pw_dt"] == 300.0
    # utilization changes: the snapshot is re-read
    write_snapshot(snap, 10, gpus=4)
    os.utime(snap, (clock.t + 1, clock.t + 1))
    for _ in range(10):
        clock.t += 1.0
        sampler.sample_once()
    _, seven = accum.read(str(local / "acc" / "7"))
    assert 100 * seven[0]["sm_sum"] / seven[0]["sm_dt"] == pytest.approx(50.0)
    # job 8 ends: its record goes, the sampler lets go of it
    (local / "jobs" / "8").unlink()
    clock.t += 1.0
    sampler.sample_once()
    assert set(sampler.jobs) == {"7"}
    sampler.close()


def test_a_sampler_restart_keeps_the_sums_and_does_not_count_the_gap(tmp_path):
    local = tmp_path / "usage"
    snap = write_snapshot(tmp_path / "snap.json", 50)
    clock = Clock()
    prolog(local, "9", "0", when=clock.t)
    first = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    for _ in range(5):
        clock.t += 1.0
        first.sample_once()
    first.close()
    clock.t += 60.0  # down for a minute
    second = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    for _ in range(5):
        clock.t += 1.0
        second.sample_once()
    _, gpus = accum.read(str(local / "acc" / "9"))
    assert gpus[0]["samples"] == 10
    # 5 s before; after the restart the first sample stands for the unobserved minute, so it adds nothing
    assert gpus[0]["sm_dt"] == 9.0
    assert 100 * gpus[0]["sm_sum"] / gpus[0]["sm_dt"] == pytest.approx(50.0)
    second.close()


def test_unanswered_readings_add_samples_but_no_coverage(tmp_path):
    local = tmp_path / "usage"
    snap = write_snapshot(tmp_path / "snap.json", None, power=None, mem_used=None)
    clock = Clock()
    prolog(local, "5", "0,1", when=clock.t)
    sampler = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    for _ in range(3):
        clock.t += 1.0
        sampler.sample_once()
    _, gpus = accum.read(str(local / "acc" / "5"))
    assert gpus[0]["samples"] == 3 and gpus[0]["sm_dt"] == 0.0 and gpus[0]["pw_dt"] == 0.0
    sampler.close()


def test_slurm_gpu_ids_map_to_gpus_by_device_minor(tmp_path):
    proc = tmp_path / "proc"
    readings = [
        GpuUtilization(i, f"GPU-{i}", f"00000000:{bus}:00.0", 10 * (i + 1), 0, 0, 0, 100.0)
        for i, bus in enumerate(("07", "0F", "47", "4E"))
    ]
    minors = {"07": 3, "0F": 2, "47": 1, "4E": 0}  # the driver numbered them the other way round
    for bus, minor in minors.items():
        d = proc / f"0000:{bus.lower()}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA A100\nDevice Minor: \t {minor}\n")
    assert device_minor("00000000:0F:00.0", str(proc)) == 2
    assert device_minor(None, str(proc)) is None

    class Source:
        def utilization(self):
            return readings

    local = tmp_path / "usage"
    clock = Clock()
    prolog(local, "3", "0", when=clock.t)
    sampler = Sampler(Source(), str(local), interval=1.0, clock=clock, proc_root=str(proc))
    clock.t += 1.0
    sampler.sample_once()
    _, gpus = accum.read(str(local / "acc" / "3"))
    assert gpus[0]["nvml_index"] == 3 and gpus[0]["sm_sum"] == pytest.approx(0.4)  # minor 0 is NVML 3
    plain = Sampler(
        Source(), str(tmp_path / "u2"), interval=1.0, clock=clock, proc_root=str(tmp_path / "none")
    )
    assert plain._build_map(readings) == {0: 0, 1: 1, 2: 2, 3: 3}


# ---- the node epilog -------------------------------------------------------------------------------------
def test_node_epilog_moves_the_summary_to_the_spool_and_forgets_the_job(tmp_path):
    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    snap = write_snapshot(tmp_path / "snap.json", 80, gpus=2, power=200.0)
    clock = Clock()
    prolog(local, "11", "0,1", when=clock.t - 2)
    sampler = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    for _ in range(4):
        clock.t += 1.0
        sampler.sample_once()
    outcome = spool.node_epilog(str(local), str(shared), "11", "n1", "0,1", now=clock.t)
    assert outcome == f"wrote {shared}/11/n1.json"
    assert not (local / "jobs" / "11").exists() and not (local / "acc" / "11").exists()
    docs, marker = spool.read_job_dir(str(shared / "11"))
    assert marker is None and len(docs) == 1
    merged = summary.merge(docs, 1)
    assert merged.held == pytest.approx(2 * 6.0)  # 2 GPUs from the prolog (t-2) to the epilog (t+4)
    assert merged.covered == pytest.approx(2 * 4.0) and merged.eta == pytest.approx(0.8)
    assert oct(os.stat(shared / "11").st_mode & 0o7777) == oct(spool.SPOOL_DIR_MODE)
    sampler.close()


def test_node_epilog_without_a_record(tmp_path):
    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    assert spool.node_epilog(str(local), str(shared), "12", "n1", None) == "no GPUs on this node"
    assert not (shared / "12").exists()
    # GPUs in the environment but no prolog record (prolog without PrologFlags=Alloc never ran here):
    # a summary with zero coverage, so the controller knows the node reported and charges eta = 1
    assert spool.node_epilog(str(local), str(shared), "13", "n2", "0,1", now=50.0).startswith("wrote")
    merged = summary.merge(spool.read_job_dir(str(shared / "13"))[0])
    assert merged.gpus == 2 and merged.covered == 0.0 and merged.eta is None
    with pytest.raises(ValueError):
        spool.node_epilog(str(local), str(shared), "../etc", "n1", "0")


def test_gpu_id_lists():
    assert spool.parse_gpu_ids("0,1\n") == [0, 1]
    assert spool.parse_gpu_ids("0-2,6") == [0, 1, 2, 6]
    with pytest.raises(ValueError):
        spool.parse_gpu_ids("gpu0")


# ---- the hook scripts ------------------------------------------------------------------------------------
def run_hook(path: Path, env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a hook with only `env` (and an empty STUNE_ENV_FILE unless env names one): an installed
    /etc/default/stune must not change what it does."""
    base = {k: v for k, v in hermetic_env(tmp_path).items() if k.startswith(("STUNE_", "SLURM_"))}
    return subprocess.run(
        [str(path)], env={"PATH": "/usr/bin:/bin", **base, **env}, capture_output=True, text=True
    )


def test_hooks_read_settings_from_the_env_file_they_are_given(tmp_path):
    """The hooks take their settings from STUNE_ENV_FILE (the one file /etc/default/stune is by default)."""
    env_file = tmp_path / "site.env"
    env_file.write_text(f"STUNE_USAGE_DIR={tmp_path / 'from-env-file'}\n")
    proc = run_hook(
        REPO / "prolog" / "20-stune-jobgpus",
        {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "3", "STUNE_ENV_FILE": str(env_file)},
        tmp_path,
    )
    assert proc.returncode == 0 and (tmp_path / "from-env-file" / "jobs" / "5").read_text() == "3\n"


def test_prolog_records_the_jobs_gpus_and_never_fails(tmp_path):
    script = REPO / "prolog" / "20-stune-jobgpus"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,2", "STUNE_USAGE_DIR": str(tmp_path / "usage")}
    proc = run_hook(script, env, tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert (tmp_path / "usage" / "jobs" / "77").read_text() == "0,2\n"
    # no GPU ids: a CPU job, or one whose GRES Slurm names no ids for (gres/npu): the sampler decides
    proc = run_hook(script, {**env, "SLURM_JOB_ID": "78", "SLURM_JOB_GPUS": ""}, tmp_path)
    assert proc.returncode == 0 and (tmp_path / "usage" / "jobs" / "78").read_text() == "?\n"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert run_hook(script, {**env, "STUNE_USAGE_DIR": str(blocked)}, tmp_path).returncode == 0


def test_epilog_hook_writes_the_node_summary_and_never_fails(tmp_path):
    script = REPO / "epilog" / "20-stune-usage"
    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    prolog(local, "90", "1")
    env = {
        "SLURM_JOB_ID": "90",
        "SLURMD_NODENAME": "n3",
        "SLURM_JOB_GPUS": "1",
        "STUNE_BIN": BIN,
        "STUNE_USAGE_DIR": str(local),
        "STUNE_USAGE_SPOOL": str(shared),
    }
    proc = run_hook(script, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (shared / "90" / "n3.json").exists() and not (local / "jobs" / "90").exists()
    # CPU-only job: returns at once, without starting Python
    proc = run_hook(
        script, {**env, "SLURM_JOB_ID": "91", "SLURM_JOB_GPUS": "", "STUNE_BIN": "/nonexistent"}, tmp_path
    )
    assert proc.returncode == 0 and proc.stderr == ""
    # a broken spool: one line on stderr, still exit 0
    proc = run_hook(
        script, {**env, "SLURM_JOB_ID": "92", "STUNE_USAGE_SPOOL": str(tmp_path / "missing")}, tmp_path
    )
    assert proc.returncode == 0 and "epilog:" in proc.stderr


def test_sampler_epilogs_explicit_options_win_over_the_environment(tmp_path):
    """--node (and --job) given on the command line beat $SLURMD_NODENAME ($SLURM_JOB_ID), as everywhere."""
    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    prolog(local, "93", "1")
    env = hermetic_env(
        tmp_path,
        SLURM_JOB_ID="94",
        SLURMD_NODENAME="n3",
        SLURM_JOB_GPUS="1",
        STUNE_USAGE_DIR=str(local),
        STUNE_USAGE_SPOOL=str(shared),
    )
    proc = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "epilog", "--node", "n9", "--job", "93", "-v"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0 and "job 93 on n9: wrote" in proc.stderr, proc.stderr
    assert (shared / "93" / "n9.json").exists() and not (shared / "93" / "n3.json").exists()
    assert not (shared / "94").exists()
    proc = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "epilog", "-v"],
        capture_output=True,
        text=True,
        env=dict(env, SLURM_JOB_ID="93"),
        timeout=60,
    )
    assert proc.returncode == 0 and "job 93 on n3:" in proc.stderr, proc.stderr


def test_sampler_cli_runs_and_reports_status(tmp_path):
    local = tmp_path / "usage"
    prolog(local, "5", "0,1")
    snap = write_snapshot(tmp_path / "snap.json", 60)
    env = hermetic_env(tmp_path, STUNE_FAIRSHARE_CONFIG=tmp_path / "none.yaml")
    (tmp_path / "none.yaml").write_text("usage:\n  interval: 0.05\n")
    proc = subprocess.run(
        [
            f"{BIN}/stune-gpu-sampler",
            "run",
            "--gpu-snapshot",
            snap,
            "--local-dir",
            str(local),
            "--count",
            "5",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "deprecated" not in proc.stderr
    proc = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "status", "--local-dir", str(local)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("job 5: gpu0 sm 60% over") and "gpu1 sm 60%" in proc.stdout
    proc = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "status", "--local-dir", str(local), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [j["job"] for j in doc["jobs"]] == ["5"] and [g["gpu"] for g in doc["jobs"][0]["gpus"]] == [0, 1]
    assert all(g["sm_util"] == 0.6 and g["sampled_s"] > 0 for g in doc["jobs"][0]["gpus"])


def test_sampler_stops_cleanly_on_sigterm(tmp_path):
    local = tmp_path / "usage"
    prolog(local, "6", "0")
    snap = write_snapshot(tmp_path / "snap.json", 60)
    env = hermetic_env(tmp_path, STUNE_FAIRSHARE_CONFIG=tmp_path / "none.yaml")
    (tmp_path / "none.yaml").write_text("")
    # the old spelling of --gpu-snapshot (systemd units written for older releases) still works, with a note
    proc = subprocess.Popen(
        [
            f"{BIN}/stune-gpu-sampler",
            "run",
            "--snapshot",
            snap,
            "--local-dir",
            str(local),
            "--interval",
            "0.05",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )

    def sampled() -> bool:  # the file is made before its first sample lands: wait for the sample itself
        try:
            return accum.read(str(local / "acc" / "6"))[1][0]["samples"] >= 1
        except (OSError, ValueError, IndexError, KeyError, accum.AccumulatorError):
            return False

    deadline = time.monotonic() + 30
    while not sampled() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "note: --snapshot is deprecated; use --gpu-snapshot" in stderr
    _, gpus = accum.read(str(local / "acc" / "6"))
    assert gpus[0]["samples"] >= 1  # and the stop kept it


def test_a_gpu_belongs_to_its_newest_job(tmp_path):
    """A record left by a job whose epilog never ran (the node crashed) stops being sampled once its GPU is
    given to a new job: Slurm gives a GPU to one job at a time."""
    local = tmp_path / "usage"
    snap = write_snapshot(tmp_path / "snap.json", 40)
    clock = Clock()
    prolog(local, "50", "0,1", when=clock.t - 100)  # stale
    prolog(local, "51", "1", when=clock.t)  # new, on GPU 1
    sampler = Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock)
    for _ in range(3):
        clock.t += 1.0
        sampler.sample_once()
    _, stale = accum.read(str(local / "acc" / "50"))
    _, new = accum.read(str(local / "acc" / "51"))
    assert [g["samples"] for g in stale] == [3, 0] and new[0]["samples"] == 3
    sampler.close()


def test_the_sampler_loop_survives_a_failing_source(tmp_path, capsys):
    local = tmp_path / "usage"
    prolog(local, "60", "0")

    class Broken:
        def utilization(self):
            raise RuntimeError("driver went away")

    sampler = Sampler(Broken(), str(local), interval=0.01)
    sampler.run(iterations=3)
    assert capsys.readouterr().err.count("stune-gpu-sampler: RuntimeError: driver went away") == 3


# ---- honest idleness, the bounded series, the sawtooth (#12 §3) -------------------------------------------
class ScriptedSource:
    """GPU readings from a list of per-tick (sm, procs) values, for all GPUs alike."""

    def __init__(self, gpus: int, script):
        self.gpus, self.script, self.tick = gpus, list(script), 0

    def utilization(self):
        sm, procs = self.script[min(self.tick, len(self.script) - 1)]
        self.tick += 1
        return [
            GpuUtilization(i, f"GPU-{i}", None, sm, 10.0, 1 << 30, 80 << 30, 250.0, procs)
            for i in range(self.gpus)
        ]


def run_script(tmp_path, script, gpus="0,1", job="70"):
    local = tmp_path / "usage"
    clock = Clock()
    prolog(local, job, gpus, when=clock.t)
    sampler = Sampler(ScriptedSource(8, script), str(local), interval=1.0, clock=clock)
    for _ in range(len(script)):
        clock.t += 1.0
        sampler.sample_once()
    sampler.close()
    return local, clock


def test_a_gpu_with_no_process_is_idle_whatever_its_reading(tmp_path):
    """A stale 90 % with no compute process is idle; an unknown process list (None) trusts the reading."""
    local, _clock = run_script(tmp_path, [(90.0, 0)] * 10 + [(90.0, None)] * 10 + [(90.0, 1)] * 10)
    _, gpus = accum.read(str(local / "acc" / "70"))
    for g in gpus:
        assert g["sm_dt"] == pytest.approx(30.0)
        assert g["sm_sum"] == pytest.approx(0.9 * 20)  # the first 10 s count as 0 %
        assert g["noproc_dt"] == pytest.approx(10.0)


def test_unmeasurable_utilization_is_unmeasured_not_idle(tmp_path):
    """MIG / NVML_ERROR_NOT_SUPPORTED: no utilization reading. Nothing is sampled (coverage 0, eta None),
    so the accountant charges eta = 1 and `job` says "unmeasured", never 0 %."""
    import fakenvml

    from slurm_tune.hw.nvml import LiveGpuSource

    fake = fakenvml.FakeNvml([fakenvml.device(i, mig=True, util_gpu=0) for i in range(2)])
    source = LiveGpuSource(nvml=fake)
    readings = source.utilization()
    assert [r.sm_util for r in readings] == [None, None] and [r.procs for r in readings] == [1, 1]
    local = tmp_path / "usage"
    clock = Clock()
    prolog(local, "71", "0,1", when=clock.t)
    sampler = Sampler(source, str(local), interval=1.0, clock=clock)
    for _ in range(5):
        clock.t += 1.0
        sampler.sample_once()
    sampler.close()
    node = spool.node_summary(str(local), "71", "n1", None, clock.t)
    merged = summary.merge([node])
    assert merged.covered == 0 and merged.eta is None
    assert [g.sm for g in merged.per_gpu] == [None, None]
    from slurm_tune.fairshare import jobdoc

    text = jobdoc.job_text(
        {
            "job_id": "71",
            "user": "u",
            "account": "a",
            "partition": "p",
            "state": "RUNNING",
            "gpus": 2.0,
            "elapsed_s": 5,
            "held_gpu_h": 0.003,
            "eta": None,
            "per_gpu": [{"node": g.node, "gpu": g.gpu, "sm": g.sm, "watts": g.watts} for g in merged.per_gpu],
            "timeline": [],
            "why": "not measured",
            "hints": [],
        }
    )
    assert "utilization unmeasured" in text and " 0%" not in text


def test_the_series_is_bounded_and_keeps_the_shape_of_a_long_job(tmp_path):
    """A 10-hour job at 1 Hz: the file and the series stay SERIES_LEN buckets; the timeline still shows
    a busy first half and an idle second half."""
    hours = 10
    script = [(90.0, 1)] * (hours * 1800) + [(0.0, 1)] * (hours * 1800)
    local, clock = run_script(tmp_path, script)
    path = local / "acc" / "70"
    size = path.stat().st_size
    assert size == accum.HEADER.size + 2 * accum.RECORD.size + accum.SERIES.size <= 4096
    _created, _gpus, series = accum.read_with_series(str(path))
    assert len(series["sm"]) == accum.SERIES_LEN and series["width"] >= hours * 3600 / accum.SERIES_LEN
    assert sum(series["dt"]) == pytest.approx(2 * len(script))  # every sampled second is in it, 2 GPUs
    node = spool.node_summary(str(local), "70", "n1", None, clock.t)
    merged = summary.merge([node])
    tl = merged.timeline
    assert len(tl) == summary.TIMELINE_LEN
    assert set(tl[:20]) == {"8"} and set(tl[-20:]) == {"0"}  # 90 % -> '8' (x 100/9), then 0 %
    back = summary.parse(summary.encode(merged))
    assert back.timeline == tl and back.timeline_percent()[0] == pytest.approx(800 / 9)


def test_a_sawtooth_counts_drops_and_gives_the_data_hint(tmp_path):
    """Utilization that keeps rising and dropping (a loop waiting for data): drops are counted, and `job`
    says to look at storage (stage the dataset) before NCCL. A steady job gets no such hint."""
    from slurm_tune.fairshare import jobdoc

    saw = ([(95.0, 1)] * 5 + [(5.0, 1)] * 5) * 60  # 10 s period, 10 minutes
    local, clock = run_script(tmp_path, saw)
    merged = summary.merge([spool.node_summary(str(local), "70", "n1", None, clock.t)])
    assert merged.drops == 2 * 60  # 60 falls on each of 2 GPUs
    hints = jobdoc.usage_hints(merged, eta=merged.eta, idle_power_w=100.0)
    assert any("stage the dataset" in h and "before tuning NCCL" in h for h in hints)
    steady = [(50.0, 1)] * 600
    local, clock = run_script(tmp_path / "steady", steady)
    flat = summary.merge([spool.node_summary(str(local), "70", "n1", None, clock.t)])
    assert flat.drops == 0 and not any("stage" in h for h in jobdoc.usage_hints(flat, flat.eta, 100.0))


def test_a_stall_is_flagged_in_the_job_view():
    """~100 % utilization at near-idle power most of the time: a hung collective or a spin loop."""
    from slurm_tune.fairshare import jobdoc

    stalled = summary.JobSummary(7200.0, 7100.0, 7200.0, 7000.0, 70.0, 2, 1, 1, ())
    hints = jobdoc.usage_hints(stalled, eta=stalled.eta, idle_power_w=100.0)
    assert any("near-idle power" in h and "hung" in h for h in hints)
    busy = stalled._replace(busy_w=350.0)
    assert not any("near-idle power" in h for h in jobdoc.usage_hints(busy, busy.eta, 100.0))


def test_a_short_jobs_timeline_is_filled_not_dotted():
    """A 20 s job has two 10 s buckets: each covers half of the 48 steps (not one step each)."""
    docs = [
        {
            "node": "n1",
            "start": 0,
            "end": 20,
            "gpus": [],
            "series": {"t0": 0, "width": 10, "sm": [9.5, 0.0], "dt": [10, 10]},
        },
        {
            "node": "n2",
            "start": 0,
            "end": 20,
            "gpus": [],
            "series": {"t0": 0, "width": 10, "sm": [9.5, 0.0], "dt": [10, 0]},
        },
    ]
    assert summary.merge_timeline(docs) == "9" * 24 + "0" * 24


def test_usage_dirs_expand_the_node_name(tmp_path, monkeypatch):
    """%n in $STUNE_USAGE_DIR / $STUNE_USAGE_SPOOL (and the config) is the node's name, as in every stune path."""
    from slurm_tune.usage.config import usage_dirs

    monkeypatch.setenv("STUNE_USAGE_DIR", str(tmp_path / "%n" / "usage"))
    monkeypatch.setenv("STUNE_USAGE_SPOOL", str(tmp_path / "spool-%n-100%%"))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a017")
    assert usage_dirs() == (str(tmp_path / "gpu-a017" / "usage"), str(tmp_path / "spool-gpu-a017-100%"))
    assert usage_dirs(node="n2")[0] == str(tmp_path / "n2" / "usage")
    assert usage_dirs(expand=False)[0] == str(tmp_path / "%n" / "usage")


def test_the_sampler_daemon_reads_STUNE_GPU_SNAPSHOT(tmp_path):
    """The shipped systemd unit passes no --snapshot: the environment names it (with %n)."""
    local = tmp_path / "n7" / "usage"
    prolog(local, "8", "0")
    write_snapshot(tmp_path / "gpus-n7.json", 70)
    env = hermetic_env(
        tmp_path,
        STUNE_GPU_SNAPSHOT=tmp_path / "gpus-%n.json",
        SLURMD_NODENAME="n7",
        STUNE_USAGE_DIR=tmp_path / "%n" / "usage",
    )
    proc = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "run", "--count", "4", "--interval", "0.05"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"snapshot {tmp_path / 'gpus-n7.json'}" in proc.stderr and str(local) in proc.stderr
    _, gpus = accum.read(str(local / "acc" / "8"))
    assert gpus[0]["samples"] >= 3 and gpus[0]["sm_sum"] / gpus[0]["sm_dt"] == pytest.approx(0.7)


# ---- the pipeline named in one place (usage/pipeline.py) ---------------------------------------------------
def test_one_job_travels_the_pipeline_in_the_formats_pipeline_py_names(tmp_path):
    """Stages 1-3 for real (the prolog script, the sampler, the node epilog), then the AdminComment line and
    the ledger file: each artifact is where and what usage/pipeline.py says."""
    from slurm_tune.fairshare.ledger import Ledger
    from slurm_tune.usage import pipeline

    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    clock = Clock()
    hook = run_hook(
        REPO / "prolog" / "20-stune-jobgpus",
        {"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "0", "STUNE_USAGE_DIR": str(local)},
        tmp_path,
    )
    assert hook.returncode == 0 and (local / pipeline.JOBS_DIR / "12").read_text() == "0\n"
    os.utime(local / pipeline.JOBS_DIR / "12", (clock.t - 1, clock.t - 1))
    sampler = Sampler(
        open_gpu_source(snapshot=write_snapshot(tmp_path / "snap.json", 50, gpus=1)),
        str(local),
        interval=1.0,
        clock=clock,
    )
    clock.t += 1.0
    sampler.sample_once()
    assert (local / pipeline.ACC_DIR / "12").read_bytes().startswith(pipeline.ACCUMULATOR_MAGIC)
    assert (
        spool.node_epilog(str(local), str(shared), "12", "n1", "0", now=clock.t)
        == f"wrote {shared}/12/n1{pipeline.NODE_SUMMARY_SUFFIX}"
    )
    sampler.close()
    docs, _ = spool.read_job_dir(str(shared / "12"))
    line = summary.encode(summary.merge(docs, 1))
    assert line.startswith(pipeline.ADMIN_COMMENT_PREFIX) and summary.parse(line) is not None
    Ledger(watermark=1, as_of=1).save(str(tmp_path / "ledger.json"))
    assert json.loads((tmp_path / "ledger.json").read_text())["format"] == pipeline.LEDGER_FORMAT


def test_every_stage_of_the_pipeline_is_a_process_stune_ships():
    from slurm_tune.usage import pipeline

    console = (REPO / "setup.cfg").read_text()
    for _, process, _, home in pipeline.STAGES:
        assert (REPO / process).is_file() or f"{process} = " in console, process
        assert (REPO / "slurm_tune" / home).is_file(), home


def test_a_stop_that_lands_inside_a_tick_stops_the_sampler(tmp_path):
    """SIGTERM raises the sampler command's stop wherever it lands; one inside a tick (here, while the GPUs
    are read) must end the run, not be counted as one more tick's error and sampled past."""
    from slurm_tune.cli.sampler import _Stop
    from slurm_tune.usage.sampler import Sampler

    class StoppedWhileReading:
        reads = 0

        def utilization(self):
            self.reads += 1
            raise _Stop()

    local = tmp_path / "usage"
    prolog(local, "6", "0")  # a GPU job runs here, so each tick reads the GPUs
    source = StoppedWhileReading()
    with pytest.raises(_Stop):
        Sampler(source, str(local), interval=0.01).run(iterations=3)
    assert source.reads == 1
