"""A job's "why slow" sections (fairshare/whyslow.py) from its AdminComment line as the pipeline writes it, and
the nodes' fio baselines in the active-check store."""

from __future__ import annotations

from pathlib import Path

from slurm_tune import comm
from slurm_tune.active import store
from slurm_tune.usage import jobfiles, perf, summary, whyslow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "comm"
NOW = 1_790_000_000.0


def usage_line(eta: float = 0.4, drops: int = 40) -> str:
    held = 4 * 3600.0
    s = summary.JobSummary(held, held * eta, held, 0.0, None, 4, 1, 1, (), drops, 0.0, "9090909090")
    return summary.encode(s)


def perf_tokens(**changes) -> str:
    base = perf.EMPTY._replace(
        nodes=1,
        sampled_s=3600.0,
        idle_s=1800.0,
        net_kind="ib",
        net_bps=1e9,
        net_frac=0.05,
        net_idle_bps=2e9,
        net_idle_frac=0.08,
        sto_bps=2.0e9,
        sto_idle_bps=2.9e9,
        sto_devices=(perf.StoDev("n17", "nvme0n1", "source", 2.0e9),),
        cpu_why="no-cgroup",
        clock=0.97,
        net_tl="1" * 48,
        sto_tl="9" * 48,
        sto_peak=3.1e9,
    )
    return base._replace(**changes).tokens()


def baseline(tmp_path: Path, node: str = "n17", gbps: float = 3.05) -> str:
    fp = dict.fromkeys(store.FINGERPRINT_KEYS, "x")
    result = {"at": NOW - 3600, "check": "disk_read", "subject": node, "status": "ok", "value": gbps}
    store.append(str(tmp_path), "hdr", [{**result, "sweep": "s", "partition": "hdr", "fingerprint": fp}])
    return str(tmp_path)


def sections(line: str, store_dir: str | None, monkeypatch) -> dict:
    monkeypatch.setattr(whyslow.time, "time", lambda: NOW)
    return whyslow.why_sections(summary.parse(line), line, "hdr", store_dir)


def test_a_source_device_fio_never_measured_is_not_held_against_the_caches_baseline(tmp_path, monkeypatch):
    line = usage_line() + " " + perf_tokens()
    b = sections(line, baseline(tmp_path), monkeypatch)["bottleneck"]
    # fio measured the cache tier's device: a source on another device has no baseline, so no limit is claimed
    assert b["bound"] == "unclear" and "GPU 40 % in a sawtooth" in b["headline"]
    assert "storage: dataset source nvme0n1 read at 2.9 GB/s on n17" in b["lines"]


def test_the_cache_tiers_rate_is_held_against_its_nodes_fio_baseline(tmp_path, monkeypatch):
    line = usage_line() + " " + perf_tokens(sto_devices=(perf.StoDev("n17", "nvme0n1", "cache+source", 2e9),))
    b = sections(line, baseline(tmp_path), monkeypatch)["bottleneck"]
    assert b["bound"] == "storage"
    assert b["headline"] == (
        "GPU 40 % in a sawtooth while the cache tier and dataset source nvme0n1 read at 2.9 GB/s, 95 % of "
        "n17's fio baseline: storage-bound"
    )


def test_without_a_baseline_the_same_rate_is_not_called_the_limit(monkeypatch, tmp_path):
    line = usage_line() + " " + perf_tokens(sto_devices=(perf.StoDev("n17", "nvme0n1", "cache", 2e9),))
    b = sections(line, str(tmp_path / "empty-store"), monkeypatch)["bottleneck"]
    assert b["bound"] == "unclear"
    assert "storage: cache tier nvme0n1 read at 2.9 GB/s on n17" in b["lines"]
    assert b["lines"][-1] == "GPU links (per GPU, both directions): PCIe unmeasured, NVLink unmeasured"


def test_the_network_busy_in_the_gpus_idle_phases_is_communication_bound(monkeypatch, tmp_path):
    line = usage_line() + " " + perf_tokens(net_idle_frac=0.85, net_idle_bps=21e9)
    doc = sections(line, None, monkeypatch)
    assert doc["bottleneck"]["bound"] == "communication"
    assert "IB at 85 % of line rate in the GPU's idle phases" in doc["bottleneck"]["headline"]
    assert doc["series"]["network"][0] == 100 * 1 / 9 and doc["series"]["storage"][0] == 100.0


def test_busy_gpus_with_the_transport_verdict_and_throughput(monkeypatch):
    socket = comm.judge(
        [comm.parse((FIXTURES / "nccl-socket-ncclTests179.txt").read_bytes())], comm.Expectation("ib")
    )
    nodes = [{"node": "n3", "comm": socket.encode()}, {"node": "n4", "comm": socket.encode()}]
    line = " ".join(
        [
            usage_line(eta=0.93, drops=0),
            perf_tokens(),
            jobfiles.job_tokens(nodes),
            "sps=1830/1700/1900/1800 dwait=6.0/9.0 steps=500/10/0/1 warm=20.0/900.0",
        ]
    )
    doc = sections(line, None, monkeypatch)
    assert doc["bottleneck"]["headline"] == "GPU busy 93 %: compute-bound"
    assert doc["transport"]["status"] == "fallback" and doc["transport"]["judged"] == 2
    assert any("ranks on n[3-4] used NET/Socket" in m for m in doc["transport"]["messages"])
    assert any(line.startswith("transport: IB partition") for line in doc["bottleneck"]["lines"])
    assert doc["throughput"]["sps_p50"] == 1830
    text = "\n".join(whyslow.why_text(doc))
    assert "throughput: 1830 samples/s (1700-1900), data wait 6 % over 500 steps" in text


def test_a_job_with_no_record_is_unmeasured_not_guessed(monkeypatch):
    doc = sections("", None, monkeypatch)
    assert doc["bottleneck"]["bound"] == "unmeasured" and doc["transport"] is None
    assert (
        "storage: unmeasured (the sampler recorded no node counters for this job)"
        in doc["bottleneck"]["lines"]
    )
    # a lustre source the sampler could not read is named with why
    line = usage_line() + " " + perf_tokens(sto_devices=(), sto_unmeasured=(("source", "lustre-not-read"),))
    b = sections(line, None, monkeypatch)["bottleneck"]
    assert "storage: unmeasured (dataset source lustre: its client counters are not read)" in b["lines"]


def test_history_diff_names_the_bottleneck_change_beside_the_throughput_change(monkeypatch):
    from slurm_tune.sbatch import historyview

    fast = (
        usage_line(eta=0.92, drops=0)
        + " sps=1830/1700/1900/1800 dwait=6.0/9.0 steps=500/10/0/1 warm=20.0/900.0"
    )
    slow = (
        usage_line(eta=0.45, drops=30)
        + " sps=1210/1100/1300/1200 dwait=31.0/40.0 steps=500/10/0/1 warm=5.0/100.0"
    )
    a = {"job_id": "1", "partition": "hdr", "argv": ["--stage", "/d:x", "t.sh"], "script": "t.sh"}
    b = {"job_id": "2", "partition": "hdr", "argv": ["t.sh"], "script": "t.sh"}
    found = {"1": fast, "2": slow}
    bounds = historyview.bounds_of([a, b], found)
    assert bounds == {"1": "compute", "2": "storage"}
    line = historyview.headline(a, b, historyview.steps_of(found), bounds)
    assert line == (
        "samples/s 1830 -> 1210 (-34 %); data wait 6 % -> 31 %; bound compute -> storage; --stage dropped"
    )


def test_the_stored_record_carries_its_verdict_and_the_reports_count_it(tmp_path):
    import numpy as np

    from slurm_tune.fairshare import report, report_render
    from slurm_tune.usage import collect

    class Recorder:
        def set_admin_comment(self, job, text):
            self.stored = (job, text)

    nodes = [
        {"v": 1, "job": "9", "node": "n1", "start": 0.0, "end": 100.0, "sampled": True,
         "gpus": [{"id": 0, "acc": {"sm_sum": 95.0, "sm_dt": 100.0, "mem_sum": 0, "mem_dt": 0, "mib_sum": 0,
                                    "mib_dt": 0, "pw_sum": 0, "pw_dt": 0, "busy_dt": 0, "busy_pw_dt": 0,
                                    "busy_pw_sum": 0}}]}
    ]  # fmt: skip
    slurm = Recorder()
    collect._store(slurm, "9", nodes, ["n1"], "hdr")
    assert slurm.stored[1].endswith(" bound=compute")

    from types import SimpleNamespace

    table = SimpleNamespace(
        admin_comment=[slurm.stored[1], usage_line() + " bound=storage", "stune1 held=1", "bound=x y"],
        partition=["hdr", "hdr", "hdr", "roce"],
    )
    counts = report.bound_counts(table, np.array([True, True, True, False]))
    assert counts == {"hdr/compute": 1, "hdr/storage": 1}
    rep = report.Report(0, None, "fair_tree", 1, bounds=counts)
    path = tmp_path / "stune.prom"
    report_render.to_prometheus(rep, str(path))
    assert 'stune_jobs_by_bound{bound="storage",partition="hdr"} 1.0' in path.read_text()
