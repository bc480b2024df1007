"""Accounting for AMD and Ascend devices (issue 26 §4): the sampler's source per the profile's `accelerator`,
honest idleness and unmeasured readings on NPUs, the device numbering (device minor = Slurm's GRES id), and an
idle NPU charged like an idle GPU. The backends (hw/amd.py, hw/ascend.py) are stood in for by their entry
points: these tests need none of their code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from usage_helpers import hermetic_env, write_snapshot

from slurm_tune.errors import StuneError
from slurm_tune.fairshare import charges, sacct
from slurm_tune.hw.nvml import GpuUtilization, SnapshotGpuSource
from slurm_tune.slurm.tres import accel_count, gres_gpus
from slurm_tune.usage import accum, spool, summary
from slurm_tune.usage.sampler import AscendSource, Sampler, open_source, slurm_resolver
from stune_dev.accel import amd_section

REPO = Path(__file__).resolve().parent.parent
BIN = os.path.dirname(sys.executable)


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def record(local: Path, job: str, ids: str, when: float) -> None:
    """The prolog's record of a job's devices on this node (usage/spool.py's jobs file)."""
    (local / "jobs").mkdir(parents=True, exist_ok=True)
    path = local / "jobs" / job
    path.write_text(ids + "\n")
    os.utime(path, (when, when))


def npu(minor: int, aicore: float | None, procs: int | None, bus: str | None = None) -> GpuUtilization:
    """One NPU chip as hw/ascend.utilization gives it: index is /dev/davinciN's N."""
    return GpuUtilization(minor, None, bus, aicore, 5.0, 3400 << 20, 65536 << 20, 92.5, procs)


def fake_backend(monkeypatch, name: str, **attrs) -> types.SimpleNamespace:
    """slurm_tune.hw.<name> replaced by a module with `attrs` (the real one need not exist on this branch)."""
    module = types.SimpleNamespace(**attrs)
    monkeypatch.setitem(sys.modules, f"slurm_tune.hw.{name}", module)
    return module


def run_ticks(sampler: Sampler, clock: Clock, n: int) -> None:
    for _ in range(n):
        clock.t += 1.0
        sampler.sample_once()


# ---- which source reads the devices ----------------------------------------------------------------------
def test_a_snapshot_replays_the_section_of_the_nodes_vendor(tmp_path):
    snap = Path(write_snapshot(tmp_path / "gpus.json", 70, gpus=2, procs=1))
    doc = json.loads(snap.read_text())
    doc["accel"] = amd_section(util=20.0, procs=1, devices=4)
    snap.write_text(json.dumps(doc))
    assert [r.sm_util for r in open_source("nvidia", str(snap)).utilization()] == [70, 70]
    for vendor in ("amd", "ascend"):
        readings = open_source(vendor, str(snap)).utilization()
        assert [(r.index, r.sm_util, r.procs) for r in readings] == [(i, 20.0, 1) for i in range(4)]
    assert len(open_source(None, str(snap)).utilization()) == 2  # no profile: `gpus` first, as before
    del doc["gpus"]
    snap.write_text(json.dumps(doc))
    assert len(open_source(None, str(snap)).utilization()) == 4  # ... else the accel section
    assert open_source("nvidia", str(snap)).utilization() == []  # an NVIDIA node never reads `accel`
    del doc["accel"]
    snap.write_text(json.dumps(doc))
    assert open_source("ascend", str(snap)).utilization() == []  # no accel section: no devices, not NVIDIA's
    assert isinstance(open_source("amd", str(snap)), SnapshotGpuSource)


def test_the_live_ascend_source_calls_npu_smi_once_per_tick_with_the_nodes_tools(monkeypatch):
    calls = []

    def utilization(timeout_s, tools=None, environ=None, node=None):
        calls.append((timeout_s, tools, environ, node))
        return [npu(0, 12.0, 1), npu(1, None, None)]

    fake_backend(monkeypatch, "ascend", utilization=utilization)
    env = {"STUNE_ACCEL_TOOLS": "/c/nodes/%n/accel-tools"}
    source = open_source(
        "ascend", None, timeout_s=3.0, tools={"npu-smi": "/opt/npu-smi"}, environ=env, node="n2"
    )
    assert isinstance(source, AscendSource)
    assert [r.sm_util for r in source.utilization()] == [12.0, None]
    assert calls == [(3.0, {"npu-smi": "/opt/npu-smi"}, env, "n2")]
    source.close()


def test_the_live_amd_source_is_amdsmis(monkeypatch):
    made = []

    class AmdSource:
        def __init__(self, timeout_s, amdsmi_module=None):
            made.append(timeout_s)

        def utilization(self):
            return [GpuUtilization(0, None, "0000:0c:00.0", 55.0, 20.0, 1 << 30, 192 << 30, 300.0, 2)]

        def close(self):
            made.append("closed")

    fake_backend(monkeypatch, "amd", AmdSource=AmdSource)
    source = open_source("amd", None, timeout_s=4.0)
    assert source.utilization()[0].sm_util == 55.0 and made == [4.0]
    source.close()
    assert made == [4.0, "closed"]


def test_a_missing_backend_is_one_line_not_a_traceback(monkeypatch):
    monkeypatch.setitem(sys.modules, "slurm_tune.hw.ascend", None)  # import raises ImportError
    with pytest.raises(StuneError, match=r"^no ascend backend in this stune \(slurm_tune.hw.ascend: "):
        open_source("ascend", None)


# ---- numbering, honest idleness, unmeasured ------------------------------------------------------------
def test_npus_are_numbered_by_device_file_not_by_the_nvidia_proc_map(tmp_path):
    """npu-smi lists chips in its own order; index is the davinci number, which is gres.conf's order. A stray
    /proc/driver/nvidia map (its minors the other way round) is never read for AMD or Ascend readings."""
    proc = tmp_path / "proc"
    buses = ["0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0", "0000:c4:00.0"]
    for minor, bus in enumerate(buses):
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(f"Device Minor: \t {3 - minor}\n")

    class Source:
        def utilization(self):  # davinci 2 listed first, each reading its minor x 10 %
            return [npu(m, 10.0 * (m + 1), 1, buses[m]) for m in (2, 0, 3, 1)]

    clock = Clock()
    for vendor, expect in (("ascend", 0.1), ("amd", 0.1), ("nvidia", 0.4)):
        local = tmp_path / vendor
        record(local, "5", "0", clock.t)
        sampler = Sampler(Source(), str(local), interval=1.0, clock=clock, proc_root=str(proc), vendor=vendor)
        run_ticks(sampler, clock, 3)
        _, devs = accum.read(str(local / "acc" / "5"))
        assert devs[0]["sm_sum"] / devs[0]["sm_dt"] == pytest.approx(expect), vendor
        sampler.close()


class Scripted:
    """npu-smi readings per tick: (AICore %, processes) for each of 4 chips alike."""

    def __init__(self, script):
        self.script, self.tick = list(script), 0

    def utilization(self):
        aicore, procs = self.script[min(self.tick, len(self.script) - 1)]
        self.tick += 1
        return [npu(m, aicore, procs) for m in range(4)]


def test_an_npu_with_no_process_is_idle_and_one_npu_smi_cannot_read_is_unmeasured(tmp_path):
    clock = Clock()
    local = tmp_path / "usage"
    record(local, "41", "1,2", clock.t)
    # 10 s a stale 60 % with no process (idle), 10 s unreadable ("-": None), 10 s busy at 80 % with a process
    sampler = Sampler(
        Scripted([(60.0, 0)] * 10 + [(None, None)] * 10 + [(80.0, 1)] * 10),
        str(local),
        interval=1.0,
        clock=clock,
        vendor="ascend",
    )
    run_ticks(sampler, clock, 30)
    sampler.close()
    _, devs = accum.read(str(local / "acc" / "41"))
    assert [int(d["gpu_id"]) for d in devs] == [1, 2] and [int(d["nvml_index"]) for d in devs] == [1, 2]
    for d in devs:
        assert d["sm_dt"] == pytest.approx(20.0)  # the unreadable 10 s are not sampled time
        assert d["sm_sum"] == pytest.approx(0.8 * 10)  # the stale 60 % counts as 0
        assert d["noproc_dt"] == pytest.approx(10.0)
    merged = summary.merge([spool.node_summary(str(local), "41", "n1", None, clock.t)])
    assert merged.eta == pytest.approx(0.4) and merged.covered == pytest.approx(40.0)


def test_an_npu_that_is_never_readable_is_unmeasured_never_zero(tmp_path):
    clock = Clock()
    local = tmp_path / "usage"
    record(local, "42", "0", clock.t)
    sampler = Sampler(Scripted([(None, None)]), str(local), interval=1.0, clock=clock, vendor="ascend")
    run_ticks(sampler, clock, 5)
    sampler.close()
    merged = summary.merge([spool.node_summary(str(local), "42", "n1", None, clock.t)])
    assert merged.covered == 0 and merged.eta is None and [g.sm for g in merged.per_gpu] == [None]


def test_a_failed_npu_smi_read_samples_nothing(tmp_path):
    """hw/ascend gives no chips when npu-smi hangs or prints garbage: the job's NPUs are unmeasured then."""
    clock = Clock()
    local = tmp_path / "usage"
    record(local, "43", "0,1", clock.t)

    class Flaky:
        tick = 0

        def utilization(self):
            self.tick += 1
            return [] if self.tick % 2 else [npu(m, 50.0, 1) for m in range(4)]

    sampler = Sampler(Flaky(), str(local), interval=1.0, clock=clock, vendor="ascend")
    run_ticks(sampler, clock, 10)
    sampler.close()
    _, devs = accum.read(str(local / "acc" / "43"))
    assert all(d["samples"] == 10 and d["sm_sum"] / d["sm_dt"] == pytest.approx(0.5) for d in devs)
    assert all(d["sm_dt"] < 10 for d in devs)  # the failed reads' seconds are not counted as sampled


# ---- an idle NPU is charged like an idle GPU ----------------------------------------------------------------
def _admin_comment(tmp_path: Path, vendor: str, aicore: float, procs: int) -> str:
    """A 2-device job's AdminComment after 60 s of the sampler and the node epilog, on an NVIDIA or Ascend node
    reading the same values."""
    clock = Clock()
    local, shared = tmp_path / vendor / "usage", tmp_path / vendor / "spool"
    shared.mkdir(parents=True)
    record(local, "9", "0,1", clock.t)
    sampler = Sampler(Scripted([(aicore, procs)]), str(local), interval=1.0, clock=clock, vendor=vendor)
    run_ticks(sampler, clock, 60)
    sampler.close()
    spool.node_epilog(str(local), str(shared), "9", "n1", None, now=clock.t)
    docs, _ = spool.read_job_dir(str(shared / "9"))
    return summary.encode(summary.merge(docs, 1))


def test_an_idle_npu_is_charged_like_an_idle_gpu_and_a_busy_one_is_not(tmp_path):
    fields = "|".join(sacct.FIELDS)
    rows = []
    for job, (vendor, gres, aicore, procs) in enumerate(
        [
            ("nvidia", "gres/gpu", 0.0, 0),
            ("ascend", "gres/npu", 0.0, 0),
            ("ascend", "gres/npu", 35.0, 0),  # a stale AICore reading with no process: idle all the same
            ("ascend", "gres/npu", 100.0, 1),
            ("ascend", "gres/npu", None, None),  # never measured: charged as Slurm charges
        ],
        start=1,
    ):
        comment = _admin_comment(tmp_path / str(job), vendor, aicore, procs)
        rows.append(f"{job}|{job}|u|a|p|normal|COMPLETED|1000|1060|60|billing=16,cpu=2,{gres}=2|{comment}")
    table = sacct.parse("\n".join([fields, *rows]) + "\n")
    assert table.gpus.tolist() == [2.0] * 5
    ch = charges.compute(table, np.ones(5, bool), as_of=1060, half_life_s=0, alpha=1.0, coverage_min=0.8)
    slurm_charge = 16 * 60
    assert ch.slurm.tolist() == [slurm_charge] * 5
    assert ch.eta.tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0, 1.0])
    assert ch.stune.tolist() == pytest.approx([2 * slurm_charge] * 3 + [slurm_charge] * 2)
    assert ch.trusted.tolist() == [True, True, True, True, False]


def test_accelerator_tres_count_gpus_and_npus():
    assert accel_count("billing=16,cpu=2,gres/npu=2,node=1") == 2.0
    assert accel_count("billing=16,cpu=2,gres/gpu=4,node=1") == 4.0
    assert accel_count("billing=1,cpu=1") == 0.0
    assert gres_gpus("gpu:4,npu:4") == 4 and gres_gpus("gpu:4,npu:8(S:0-1)", "npu") == 8


# ---- the daemon on an AMD or Ascend node ---------------------------------------------------------------
def test_the_daemon_replays_an_amd_nodes_accel_section_by_its_profile(tmp_path):
    local = tmp_path / "n4" / "usage"
    record(local, "8", "2,3", 0)
    os.utime(local / "jobs" / "8")
    snap = tmp_path / "gpus-n4.json"
    snap.write_text(json.dumps({"accel": amd_section(util=64.0, procs=1)}))
    env = hermetic_env(
        tmp_path,
        STUNE_PARTITIONS=REPO / "partitions",
        STUNE_GPU_SNAPSHOT=tmp_path / "gpus-%n.json",
        SLURMD_NODENAME="n4",
        STUNE_USAGE_DIR=tmp_path / "%n" / "usage",
    )
    proc = subprocess.run(
        [
            f"{BIN}/stune-gpu-sampler",
            "run",
            "--partition",
            "amd",
            "--no-perf",
            "--count",
            "4",
            "--interval",
            "0.05",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    _, devs = accum.read(str(local / "acc" / "8"))
    assert [int(d["nvml_index"]) for d in devs] == [2, 3]
    assert all(d["samples"] >= 3 and d["sm_sum"] / d["sm_dt"] == pytest.approx(0.64) for d in devs)


def test_the_daemon_on_an_ascend_node_without_its_backend_says_so_in_one_line(tmp_path):
    """A live Ascend node (no snapshot) whose stune lacks hw/ascend, or whose partition is unknown."""
    env = hermetic_env(tmp_path, STUNE_PARTITIONS=REPO / "partitions", STUNE_USAGE_DIR=tmp_path / "usage")
    code = (
        "import sys; sys.modules['slurm_tune.hw.ascend'] = None; "
        "from slurm_tune.cli.sampler import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "--partition", "ascend", "--no-perf", "--count", "1"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("stune-gpu-sampler: no ascend backend in this stune")
    )
    unknown = subprocess.run(
        [
            f"{BIN}/stune-gpu-sampler",
            "run",
            "--partition",
            "nosuch",
            "--no-perf",
            "--count",
            "1",
            "--gpu-snapshot",
            str(tmp_path / "none.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert unknown.returncode == 0 and "note: profile nosuch:" in unknown.stderr


# ---- which NPUs a job holds: the prolog's `?` and one question to Slurm -----------------------------------
DETAIL = """JobId=61 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=n[1-3]
   BatchHost=n1
   NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=npu:5
     Nodes=n1 CPU_IDs=0 Mem=0 GRES=npu:3(IDX:0-1,3)
     Nodes=n[2-3] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:2),npu:910b:1(IDX:2)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""


def test_scontrol_detail_names_each_nodes_gres_ids():
    assert spool.gres_ids_from_detail(DETAIL, "n1", "npu") == [0, 1, 3]
    assert spool.gres_ids_from_detail(DETAIL, "n3", "npu") == [2]  # a typed GRES, on a grouped line
    assert spool.gres_ids_from_detail(DETAIL, "n3", "gpu") == [2]
    assert spool.gres_ids_from_detail(DETAIL, "n1", "gpu") == []
    assert spool.gres_ids_from_detail(DETAIL, "n9", "npu") is None  # not allocated there
    cpu_only = DETAIL.replace("GRES=npu:3(IDX:0-1,3)", "GRES=").replace("JOB_GRES=npu:5", "JOB_GRES=(null)")
    assert spool.gres_ids_from_detail(cpu_only, "n1", "npu") == []
    assert spool.gres_ids_from_detail("garbage\nNodes=n[1-\n", "n1", "npu") is None


class FakeSlurm:
    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def run_full(self, argv):
        self.calls.append(argv)
        return self.answers.pop(0)


def test_the_sampler_asks_slurm_once_for_the_npus_of_a_job_the_prolog_could_not_name(tmp_path):
    clock = Clock()
    local = tmp_path / "usage"
    slurm = FakeSlurm([(0, DETAIL, "")])
    resolve = slurm_resolver("npu", "n1", slurm=slurm)
    record(local, "61", "?", clock.t)  # the prolog's record of an npu job
    record(local, "62", "?", clock.t)  # a CPU job: Slurm says no npu on n1
    record(local, "63", "0,1", clock.t)  # $SLURM_JOB_GPUS: gres/gpu ids, not this node's NPUs
    slurm.answers.append((0, DETAIL.replace("GRES=npu:3(IDX:0-1,3)", "GRES="), ""))
    sampler = Sampler(
        Scripted([(50.0, 1)]), str(local), interval=1.0, clock=clock, vendor="ascend", resolve=resolve
    )
    run_ticks(sampler, clock, 5)
    assert set(sampler.jobs) == {"61"} and [c[-1] for c in slurm.calls] == ["61", "62"]
    _, devs = accum.read(str(local / "acc" / "61"))
    assert [int(d["gpu_id"]) for d in devs] == [0, 1, 3] and all(d["sm_dt"] == 5.0 for d in devs)
    sampler.close()
    # a restarted sampler finds the answer in the accumulators: Slurm is not asked about 61 again
    slurm.answers.append((0, DETAIL.replace("GRES=npu:3(IDX:0-1,3)", "GRES="), ""))
    again = Sampler(
        Scripted([(50.0, 1)]), str(local), interval=1.0, clock=clock, vendor="ascend", resolve=resolve
    )
    run_ticks(again, clock, 5)
    assert set(again.jobs) == {"61"} and len(slurm.calls) == 3  # 62 asked again (nothing was kept for it)
    again.close()
    # the node epilog takes the ids from the accumulators
    node = spool.node_summary(str(local), "61", "n1", None, clock.t)
    assert node is not None and [g["id"] for g in node["gpus"]] == [0, 1, 3]
    assert spool.node_summary(str(local), "62", "n1", None, clock.t) is None


def test_an_nvidia_sampler_takes_a_question_mark_as_a_job_without_gpus(tmp_path):
    clock = Clock()
    local = tmp_path / "usage"
    record(local, "70", "?", clock.t)
    sampler = Sampler(Scripted([(50.0, 1)]), str(local), interval=1.0, clock=clock)
    run_ticks(sampler, clock, 3)
    assert sampler.jobs == {} and sampler.samples == 0
    sampler.close()
    assert spool.node_summary(str(local), "70", "n1", None, clock.t) is None


def test_slurm_that_cannot_tell_yet_is_asked_again_later_and_the_npus_are_unmeasured_meanwhile(
    tmp_path, monkeypatch
):
    from slurm_tune.usage import sampler as sampler_module

    clock = Clock()
    local = tmp_path / "usage"
    record(local, "64", "?", clock.t)
    slurm = FakeSlurm(
        [(1, "", "slurm_load_jobs error: Socket timed out on send/recv operation"), (0, DETAIL, "")]
    )
    monkeypatch.setattr(sampler_module, "RESOLVE_RETRY_S", 0.0)
    sampler = Sampler(
        Scripted([(50.0, 1)]),
        str(local),
        interval=1.0,
        clock=clock,
        vendor="ascend",
        resolve=slurm_resolver("npu", "n1", slurm=slurm),
    )
    clock.t += 1.0
    assert sampler.sample_once() == 0 and sampler.jobs == {}
    assert (
        "job 64: its devices: scontrol show job -d 64: slurm_load_jobs error: Socket timed out"
        in sampler.errors[0]
    )
    run_ticks(sampler, clock, 2)
    assert set(sampler.jobs) == {"64"} and len(slurm.calls) == 2
    gone = FakeSlurm([(1, "", "slurm_load_jobs error: Invalid job id specified")])
    assert slurm_resolver("npu", "n1", slurm=gone)("65") == []  # ended already: its epilog removes the record
    sampler.close()


GRES_CAPTURES = REPO / "tests" / "fixtures" / "slurm-gres"
RELEASES = sorted(p.name for p in GRES_CAPTURES.iterdir() if p.is_dir())


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize("release", RELEASES)
def test_slurm_names_npus_only_in_scontrol_detail(release):
    """The captures (README.md there): no Prolog or TaskProlog variable names a gres/npu job's devices, while
    a gres/gpu job's are in both; `scontrol show job -d` names each node's."""
    d = GRES_CAPTURES / release
    assert len(RELEASES) >= 2
    for name in (
        "prolog_env_npu2.txt",
        "taskprolog_env_npu2_step0.txt",
        "taskprolog_env_N2_npu1_step0_task1.txt",
    ):
        env = _env(d / name)
        assert env["SLURM_JOB_PARTITION"] == "ascend"
        assert not [k for k, v in env.items() if "npu" in (k + v).lower() or "GPU" in k or "VISIBLE" in k], (
            name
        )
    for name in ("prolog_env_gpu2.txt", "taskprolog_env_gpu2_batch.txt"):
        assert _env(d / name)["SLURM_JOB_GPUS"] == "0,1"
    one = (d / "scontrol_show_job_d_npu2.txt").read_text()
    assert spool.gres_ids_from_detail(one, "n1", "npu") == [0, 1]
    assert spool.gres_ids_from_detail(one, "n2", "npu") is None
    two = (d / "scontrol_show_job_d_N2_npu1.txt").read_text()
    assert [spool.gres_ids_from_detail(two, n, "npu") for n in ("n2", "n3")] == [[0], [0]]
    gpu = (d / "scontrol_show_job_d_gpu2.txt").read_text()
    assert spool.gres_ids_from_detail(gpu, "n2", "npu") == [] and spool.gres_ids_from_detail(
        gpu, "n2", "gpu"
    ) == [0, 1]


@pytest.mark.parametrize("release", RELEASES)
def test_the_prolog_records_npu_jobs_as_unnamed_from_slurms_real_environment(tmp_path, release):
    d = GRES_CAPTURES / release
    for name, expect in (("prolog_env_npu2.txt", "?\n"), ("prolog_env_gpu2.txt", "0,1\n")):
        env = {k: v for k, v in _env(d / name).items() if k.startswith("SLURM")}
        env.pop("SLURM_CONF", None)
        proc = subprocess.run(
            [str(REPO / "prolog" / "20-stune-jobgpus")],
            env={
                "PATH": "/usr/bin:/bin",
                **env,
                "STUNE_ENV_FILE": str(tmp_path / "none.env"),
                "STUNE_USAGE_DIR": str(tmp_path / "usage"),
            },
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0 and proc.stderr == ""
        assert (tmp_path / "usage" / "jobs" / env["SLURM_JOB_ID"]).read_text() == expect


def test_the_idle_policy_judges_an_idle_npu_as_an_idle_gpu(tmp_path):
    """The ascend partition with the idle policy on: an NPU job idle for 40 minutes after 3 busy hours is
    warned, one idle for over 2 hours cancelled, one whose AICore npu-smi never reported left alone."""
    from slurm_tune.fairshare import idlepolicy
    from slurm_tune.profiles import load_profiles

    d = tmp_path / "partitions"
    d.mkdir()
    policy = "idle_policy:\n  enabled: true\n  threshold: 5\n  warn_after: 30m\n  cancel_after: 2h\n"
    (d / "ascend.yaml").write_text((REPO / "partitions" / "ascend.yaml").read_text() + policy)
    profiles = load_profiles(str(d))

    class Records:
        def job_record(self, job_id):
            return {
                "JobState": "RUNNING",
                "Partition": "ascend",
                "NodeList": "n1",
                "UserId": "u(1)",
                "BatchFlag": "1",
            }

    verdicts = {}
    for name, plan in (
        ("warn", [(3 * 3600, 95.0, 1), (40 * 60, 0.0, 0)]),
        ("cancel", [(3 * 3600, 95.0, 1), (2 * 3600 + 600, 0.0, 0)]),
        ("unmeasured", [(3 * 3600, None, None)]),
    ):
        clock, local = Clock(), tmp_path / name
        record(local, "20", "?", clock.t)
        slurm = FakeSlurm([(0, DETAIL.replace("JobId=61", "JobId=20"), "")])
        sampler = Sampler(
            Scripted([(a, p) for s, a, p in plan for _ in range(int(s))]),
            str(local),
            interval=1.0,
            clock=clock,
            vendor="ascend",
            resolve=slurm_resolver("npu", "n1", slurm=slurm),
        )
        run_ticks(sampler, clock, sum(int(s) for s, _, _ in plan))
        sampler.close()
        verdicts[name] = idlepolicy.evaluate(Records(), profiles, str(local), "n1", now=clock.t)[0].action
    assert verdicts == {"warn": "warn", "cancel": "cancel", "unmeasured": "skip"}
