"""The per-job perf record (usage/perfrec.py) the sampler keeps beside the GPU accumulators, the node summary's
`perf` key, the job-level merge and its AdminComment tokens (usage/perf.py), over node trees whose counters a
stand-in (test_counters.Counters) advances while the sampler samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import fakenvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_counters import Counters, cgroup_v2, ib_node, storage_node
from usage_helpers import hermetic_env, write_snapshot

from slurm_tune.hw.nvml import LiveGpuSource, open_gpu_source
from slurm_tune.usage import perf, perfrec, spool, summary
from slurm_tune.usage.sampler import Sampler

BIN = os.path.dirname(sys.executable)
HDR = 200e9 / 8  # bytes/s of one HDR200 port
CACHE = [("/local/nvme/stune-cache", "cache"), ("/datasets/imagenet", "source"), ("/lustre/proj", "source")]


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def perf_snapshot(path, sm, *, gpus=8, pcie=(1843, 5120), nvlink=(0, 0), clock=(1275, 1410), procs=1):
    """The DGX A100 capture with each device's `perf` readings (PCIe KB/s, NVLink KiB counters, SM MHz)."""
    write_snapshot(path, sm, gpus=gpus, procs=procs)
    snap = json.loads(Path(path).read_text())
    for dev in snap["gpus"]["devices"]:
        dev["perf"] = dict(
            zip(
                ("pcie_tx_kbs", "pcie_rx_kbs", "nvlink_tx_kib", "nvlink_rx_kib", "sm_mhz", "sm_max_mhz"),
                (*pcie, *nvlink, *clock),
            )
        )
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(snap))
    os.replace(tmp, path)
    return str(path)


def prolog(local: Path, job: str, gpus: str, when: float) -> None:
    (local / "jobs").mkdir(parents=True, exist_ok=True)
    (local / "jobs" / job).write_text(gpus + "\n")
    os.utime(local / "jobs" / job, (when, when))


def node(tmp_path: Path) -> Path:
    """A DGX A100 IB node with the storage of test_counters (cache tier on md127, NFS datasets, Lustre)."""
    return storage_node(ib_node(tmp_path / "root"))


def sampler_for(tmp_path: Path, root: Path, clock: Clock, snap: str, paths=CACHE, fabric=None) -> Sampler:
    local = tmp_path / "usage"
    node_perf = perfrec.NodePerf(str(local), str(root), fabric, paths, max_gap=2.5)
    return Sampler(open_gpu_source(snapshot=snap), str(local), interval=1.0, clock=clock, perf=node_perf)


def ticks(sampler: Sampler, clock: Clock, n: int, traffic=None) -> None:
    for _ in range(n):
        if traffic:
            traffic()
        clock.t += 1.0
        sampler.sample_once()


# ---- the record -----------------------------------------------------------------------------------------------
def test_the_record_is_bounded_and_its_size_is_the_stated_one(tmp_path):
    assert perfrec.record_bytes(8, 2) == 7168  # the module docstring's figure: 2 pages mapped per job
    assert perfrec.record_bytes(perfrec.MAX_PORTS, perfrec.MAX_DEVICES) == 17008
    ports = [(f"mlx5_{i}/1", "ib", []) for i in range(70)]
    rec = perfrec.PerfRecord(str(tmp_path / "1"), ports, [("nvme0n1", "block", ["cache"])], 100.0)
    assert len(rec.port_names) == perfrec.MAX_PORTS  # more ports than slots: the rest are not recorded
    assert os.path.getsize(tmp_path / "1") == perfrec.record_bytes(perfrec.MAX_PORTS, 1)
    for hour in range(200):  # a 200-hour job keeps SERIES_LEN buckets
        bucket = rec.bucket(100.0 + 3600 * hour)
        rec.v[rec.series_at + 5 * bucket] += 1.0
    rec.flush()
    back = perfrec.read(str(tmp_path / "1"))
    assert len(back["series"]["net"]) == perfrec.SERIES_LEN and sum(back["series"]["net"]) == 200
    assert back["width"] >= 200 * 3600 / perfrec.SERIES_LEN and back["devices"][0][2] == ["cache"]
    rec.close()


def test_a_foreign_or_truncated_file_is_not_read_as_a_record(tmp_path):
    (tmp_path / "x").write_bytes(b"Y" * 100)
    with pytest.raises(perfrec.PerfError):
        perfrec.read(str(tmp_path / "x"))
    assert perfrec.read(str(tmp_path / "missing")) is None
    assert perf.node_perf(str(tmp_path), "x") is None


# ---- the sampler with a node's counters -----------------------------------------------------------------------
def test_a_job_gets_its_network_storage_cpu_and_gpu_link_numbers(tmp_path):
    """Ten ticks at 1 s: five with the GPUs at 90 %, five at 20 % (idle phases) while the network runs at 85 %
    of line rate on mlx5_0; the cache tier reads 2 GB/s throughout."""
    root = node(tmp_path)
    clock = Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    cgroup_v2(root, "7", 0)
    prolog(tmp_path / "usage", "7", "0,1,2,3,4,5,6,7", clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    stand_in = Counters(root)
    cpu = f"{cgroup_v2(root, '7', 0).relative_to(root)}"
    state = {"sm": 90, "usec": 0, "nvl": 0}

    def traffic():
        idle = state["sm"] < 50
        stand_in.ib(
            "mlx5_0", int(0.85 * HDR) if idle else int(0.05 * HDR), int(0.85 * HDR) if idle else 10**6
        )
        stand_in.disk("9:127", 2 * 10**9, 950)
        stand_in.nfs(10**8)
        state["usec"] += 12 * 10**6  # 12 CPUs busy
        (root / cpu).write_text(f"usage_usec {state['usec']}\nuser_usec 0\nsystem_usec 0\n")
        state["nvl"] += 10**6  # KiB per second per GPU
        perf_snapshot(snap, state["sm"], nvlink=(state["nvl"], state["nvl"]))

    ticks(sampler, clock, 5, traffic)
    state["sm"] = 20
    ticks(sampler, clock, 5, traffic)
    p = perf.node_perf(str(tmp_path / "usage"), "7")
    sampler.close()
    assert p["sampled_s"] == 9.0  # the first tick is the baseline: counters are differences
    assert p["idle_s"] == 5.0 and p["shared_s"] == 0.0
    assert p["net"]["rule"] == "every ACTIVE IB/RoCE port" and len(p["net"]["ports"]) == 9
    port = p["net"]["ports"][0]
    assert port["name"] == "mlx5_0/1" and port["s"] == 9.0 and port["cap"] == pytest.approx(9 * HDR)
    assert port["idle_tx"] == pytest.approx(5 * 0.85 * HDR, rel=1e-6) and port["idle_cap"] == pytest.approx(
        5 * HDR
    )
    devices = {d["name"]: d for d in p["storage"]["devices"]}
    md = devices["md127"]
    assert (
        md["roles"] == ["cache"]
        and md["read"] == pytest.approx(9 * 2e9, rel=1e-6)
        and md["busy"] == pytest.approx(8.55)
    )
    assert devices["nfs:10.1.0.5:/export/datasets"]["read"] == pytest.approx(9e8)
    assert p["storage"]["unmeasured"] == [
        {"path": "/lustre/proj", "role": "source", "why": "lustre-not-read"}
    ]
    assert p["cpu"] == {"s": pytest.approx(108.0), "over_s": 9.0, "cpus": 32, "why": None}
    gpu = p["gpu"]
    assert gpu["pcie_s"] == 72.0 and gpu["pcie_tx"] == pytest.approx(1843 * 1024 * 72)
    assert gpu["nvlink_s"] == 72.0 and gpu["nvlink_tx"] == pytest.approx(72 * 10**6 * 1024)
    assert gpu["sm_mhz_s"] / gpu["sm_max_mhz_s"] == pytest.approx(1275 / 1410)
    job = perf.merge([{"node": "n1", "start": 1_000_000.0, "end": clock.t, "perf": p}])
    assert job.net_idle_frac == pytest.approx(0.85 / 9, rel=1e-3)  # over 9 HDR ports: the storage HCA too
    assert job.net_port_frac == pytest.approx((4 * 0.05 + 5 * 0.85) / 9, rel=1e-3)
    assert job.sto_busy == pytest.approx(0.95) and job.cpus == 32 and job.cpu_util == pytest.approx(12 / 32)
    assert job.clock == pytest.approx(1275 / 1410) and not job.node_wide
    assert job.sto_unmeasured == (("source", "lustre-not-read"),)


def test_the_profile_fabric_keeps_the_storage_hca_out_of_the_network(tmp_path):
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(tmp_path / "usage", "3", "0", clock.t)
    fabric = {"type": "ib", "hcas": [(f"mlx5_{i}", 1) for i in range(8)]}
    sampler = sampler_for(tmp_path, root, clock, snap, fabric=fabric)
    stand_in = Counters(root)
    ticks(sampler, clock, 4, lambda: stand_in.ib("mlx5_8", 10**10, 10**10))  # storage traffic only
    p = perf.node_perf(str(tmp_path / "usage"), "3")
    sampler.close()
    assert [x["name"] for x in p["net"]["ports"]] == [f"mlx5_{i}/1" for i in range(8)]
    assert sum(x["rx"] for x in p["net"]["ports"]) == 0.0 and p["net"]["rule"] == "the profile's fabric.hcas"


def test_a_reset_counter_makes_its_interval_unmeasured_not_negative(tmp_path):
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(tmp_path / "usage", "4", "0", clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    stand_in = Counters(root)
    ticks(sampler, clock, 3, lambda: stand_in.ib("mlx5_0", 4000, 4000))
    stand_in.set("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data", 10)  # perfquery -R: a reset
    stand_in.set("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data", 10)
    ticks(sampler, clock, 1)
    ticks(sampler, clock, 2, lambda: stand_in.ib("mlx5_0", 4000, 4000))
    port = perf.node_perf(str(tmp_path / "usage"), "4")["net"]["ports"][0]
    sampler.close()
    assert port["s"] == 4.0 and port["tx"] == 4 * 4000  # 5 intervals, the reset one left out
    assert perf.node_perf(str(tmp_path / "usage"), "4")["net"]["ports"][1]["s"] == 5.0


def test_a_wrapped_32_bit_counter_counts_its_bytes(tmp_path):
    """io_ticks is 32 bits on every kernel: a wrap between two ticks is the time busy, not 49 days."""
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(tmp_path / "usage", "5", "0", clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    stand_in = Counters(root)
    stand_in.values["sys/dev/block/9:127/stat#t"] = (1 << 32) - 1500
    ticks(sampler, clock, 4, lambda: stand_in.disk("9:127", 512 * 1000, 900))
    md = next(
        d for d in perf.node_perf(str(tmp_path / "usage"), "5")["storage"]["devices"] if d["name"] == "md127"
    )
    sampler.close()
    assert md["busy"] == pytest.approx(2.7) and md["busy_s"] == 3.0 and md["read"] == 3 * 512 * 1000


def test_a_second_job_makes_the_node_counters_node_wide(tmp_path):
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(tmp_path / "usage", "10", "0,1,2,3", clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    ticks(sampler, clock, 3)
    prolog(tmp_path / "usage", "11", "4,5,6,7", clock.t)
    ticks(sampler, clock, 3)
    (tmp_path / "usage" / "jobs" / "11").unlink()  # its epilog
    ticks(sampler, clock, 2)
    cgroup_v2(root, "12", 0)  # a CPU-only job: the prolog records no GPUs, its cgroup shows it
    ticks(sampler, clock, 2)
    ten = perf.node_perf(str(tmp_path / "usage"), "10")
    assert ten["sampled_s"] == 9.0 and ten["shared_s"] == 3.0 + 2.0
    assert not (tmp_path / "usage" / perfrec.PERF_DIR / "11").exists()  # its record went with it
    sampler.close()
    assert perf.merge([{"node": "n1", "start": 0, "end": 10, "perf": ten}]).node_wide


def test_node_counters_are_read_once_per_tick_whatever_the_number_of_jobs(tmp_path, monkeypatch):
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    for job in range(8):
        prolog(tmp_path / "usage", str(100 + job), str(job), clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    ticks(sampler, clock, 2)
    reads: list[str] = []
    real = sampler.perf.sysfs.read
    monkeypatch.setattr(sampler.perf.sysfs, "read", lambda rel: reads.append(rel) or real(rel))
    ticks(sampler, clock, 1)
    sampler.close()
    counter_reads = [r for r in reads if "/counters/" in r or r.endswith("/stat") or "mountstats" in r]
    assert len(counter_reads) == len(set(counter_reads)) == 9 * 2 + 1 + 1  # ports; md127; mountstats


def test_a_sampler_restart_continues_the_record_and_leaves_out_the_gap(tmp_path):
    root, clock = node(tmp_path), Clock()
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(tmp_path / "usage", "20", "0", clock.t)
    stand_in = Counters(root)

    def traffic():
        stand_in.ib("mlx5_0", 8000, 8000)

    first = sampler_for(tmp_path, root, clock, snap)
    ticks(first, clock, 5, traffic)
    first.close()
    clock.t += 120  # down for two minutes, traffic meanwhile
    stand_in.ib("mlx5_0", 10**9, 10**9)
    second = sampler_for(tmp_path, root, clock, snap)
    ticks(second, clock, 5, traffic)
    port = perf.node_perf(str(tmp_path / "usage"), "20")["net"]["ports"][0]
    second.close()
    assert port["s"] == 4.0 + 4.0 and port["tx"] == 8 * 8000  # each run's first tick is its baseline


def test_the_epilog_puts_perf_into_the_node_summary_and_the_record_goes(tmp_path):
    root, clock = node(tmp_path), Clock()
    local, shared = tmp_path / "usage", tmp_path / "spool"
    shared.mkdir()
    snap = perf_snapshot(tmp_path / "gpus.json", 90, gpus=2)
    prolog(local, "30", "0,1", clock.t)
    sampler = sampler_for(tmp_path, root, clock, snap)
    stand_in = Counters(root)
    ticks(sampler, clock, 4, lambda: stand_in.disk("9:127", 10**9, 100))
    assert spool.node_epilog(str(local), str(shared), "30", "n1", "0,1", now=clock.t).startswith("wrote")
    docs, _ = spool.read_job_dir(str(shared / "30"))
    assert docs[0]["perf"]["storage"]["devices"][0]["read"] == 3e9
    ticks(sampler, clock, 1)  # the sampler sees the job gone and removes its record
    assert not (local / perfrec.PERF_DIR / "30").exists()
    sampler.close()
    line = summary.encode(summary.merge(docs, 1)) + " " + perf.merge(docs).tokens()
    fields = dict(t.split("=", 1) for t in line[len(summary.PREFIX) :].split(" ") if "=" in t)
    back = perf.parse_tokens(fields)
    assert summary.parse(line) is not None and back.sto_bps == pytest.approx(1e9, rel=1e-3)
    assert back.sto_devices[0].name == "md127" and back.sto_devices[0].roles == "cache"


def test_a_sampler_that_was_down_at_a_jobs_end_removes_its_record(tmp_path):
    local = tmp_path / "usage"
    (local / perfrec.PERF_DIR).mkdir(parents=True)
    (local / perfrec.PERF_DIR / "99").write_bytes(b"old")
    prolog(local, "98", "0", 1_000_000.0)
    sampler = sampler_for(tmp_path, node(tmp_path), Clock(), perf_snapshot(tmp_path / "g.json", 50))
    sampler.refresh_jobs()
    assert not (local / perfrec.PERF_DIR / "99").exists()
    sampler.close()


# ---- NVML: unsupported is unmeasured ----------------------------------------------------------------------------
def test_nvml_perf_readings_and_unsupported_ones(tmp_path):
    devices = [fakenvml.device(0, "a100", nvlink_tx_kib=5000, nvlink_rx_kib=7000, sm_clock=1200)]
    devices.append(fakenvml.device(1, "a10g", pcie_tx_kbs=None, pcie_rx_kbs=None))  # no NVLink, no PCIe here
    fake = fakenvml.FakeNvml(devices)
    source = LiveGpuSource(nvml=fake, perf=True)
    a100, a10g = source.utilization()
    assert (a100.nvlink_tx_kib, a100.nvlink_rx_kib, a100.sm_mhz, a100.sm_max_mhz) == (5000, 7000, 1200, 1410)
    assert a100.pcie_tx_kbs == 1843 and a100.pcie_rx_kbs == 5120
    assert a10g.nvlink_tx_kib is None and a10g.pcie_tx_kbs is None and a10g.sm_max_mhz == 1710  # never 0
    before = fake.calls
    source.utilization()
    # 4 base calls each; perf: the A100 4 (PCIe x2, clock, NVLink), the A10G 1 (clock): NotSupported is not
    # asked again, nor is the max clock
    assert fake.calls - before == 8 + 4 + 1
    assert LiveGpuSource(nvml=fake).utilization()[0].sm_mhz is None  # without perf: not read


def test_old_snapshots_without_perf_still_load(tmp_path):
    readings = open_gpu_source(snapshot=write_snapshot(tmp_path / "old.json", 70)).utilization()
    assert readings[0].sm_util == 70 and readings[0].pcie_tx_kbs is None and readings[0].sm_max_mhz is None
    snap = json.loads((tmp_path / "old.json").read_text())
    snap["gpus"]["devices"][0]["perf"] = {"pcie_tx_kbs": -5, "sm_mhz": "fast", "nvlink_tx_kib": float("nan")}
    (tmp_path / "bad.json").write_text(json.dumps(snap))
    bad = open_gpu_source(snapshot=str(tmp_path / "bad.json")).utilization()[0]
    assert (bad.pcie_tx_kbs, bad.sm_mhz, bad.nvlink_tx_kib) == (None, None, None)


# ---- merge and tokens ------------------------------------------------------------------------------------------
def node_doc(name, start, end, *, tx, cap, read, s, series=None, cpu=None, shared=0.0):
    return {
        "node": name,
        "start": start,
        "end": end,
        "perf": {
            "v": 1,
            "sampled_s": s,
            "idle_s": s / 2,
            "shared_s": shared,
            "net": {
                "rule": "r",
                "ports": [
                    {
                        "name": "mlx5_0/1",
                        "kind": "ib",
                        "tx": tx,
                        "rx": tx / 2,
                        "cap": cap,
                        "s": s,
                        "idle_tx": tx / 2,
                        "idle_rx": 0,
                        "idle_cap": cap / 2,
                        "idle_s": s / 2,
                    }
                ],
            },
            "storage": {
                "devices": [
                    {
                        "name": "nvme0n1",
                        "kind": "block",
                        "roles": ["cache"],
                        "read": read,
                        "s": s,
                        "idle_read": read / 2,
                        "idle_s": s / 2,
                        "busy": s / 4,
                        "busy_s": s,
                    }
                ],
                "unmeasured": [],
            },
            "cpu": cpu or {"s": 0.0, "over_s": 0.0, "cpus": None, "why": "no-cgroup"},
            "gpu": dict.fromkeys(
                (
                    "pcie_tx",
                    "pcie_rx",
                    "pcie_s",
                    "nvlink_tx",
                    "nvlink_rx",
                    "nvlink_s",
                    "sm_mhz_s",
                    "sm_max_mhz_s",
                    "clock_s",
                ),
                0.0,
            ),
            "series": series
            or {"t0": start, "width": 10.0, "net": [], "cap": [], "net_s": [], "sto": [], "sto_s": []},
            "notes": [],
        },
    }


def test_two_nodes_merge_into_per_node_rates_and_one_timeline():
    first = node_doc(
        "n1",
        0.0,
        100.0,
        tx=HDR * 100 * 0.5,
        cap=HDR * 100,
        read=1e11,
        s=100.0,
        series={
            "t0": 0.0,
            "width": 50.0,
            "net": [HDR * 50, 0.0],
            "cap": [HDR * 50, HDR * 50],
            "net_s": [50, 50],
            "sto": [1e11, 0.0],
            "sto_s": [50, 50],
        },
    )
    second = node_doc("n2", 0.0, 100.0, tx=HDR * 100 * 0.1, cap=HDR * 100, read=0.0, s=100.0)
    job = perf.merge([second, first, {"node": "n3", "start": 0, "end": 1}])  # n3: no perf
    assert job.nodes == 2 and job.sampled_s == 200.0
    assert job.net_frac == pytest.approx(0.3) and job.net_port_frac == pytest.approx(0.5)
    assert job.net_bps == pytest.approx(0.3 * HDR) and job.sto_bps == pytest.approx(5e8)
    assert (
        [d.node for d in job.sto_devices] == ["n1", "n2"] and job.cpu_why == "no-cgroup" and job.cpu_s is None
    )
    assert job.net_tl == "9" * 24 + "0" * 24 and job.sto_tl == "9" * 24 + "0" * 24
    assert job.sto_peak == pytest.approx(2e9)


def test_tokens_say_unmeasured_as_dashes_and_parse_back():
    empty = perf.merge([{"node": "n1", "start": 0, "end": 5}])
    assert empty == perf.EMPTY and "net_bps=- " in empty.tokens() and "cpu_why=-" in empty.tokens()
    assert perf.parse_tokens({"held": "1.0"}) is None
    job = perf.merge(
        [
            node_doc(
                "n1",
                0,
                10,
                tx=5e9,
                cap=2.5e11,
                read=3e9,
                s=10.0,
                cpu={"s": 40.0, "over_s": 10.0, "cpus": 8, "why": None},
            )
        ]
    )
    text = job.tokens()
    fields = dict(t.split("=", 1) for t in text.split(" "))
    assert len(fields) == len(text.split(" ")) and all(v and " " not in v for v in fields.values())
    back = perf.parse_tokens(fields)
    assert back.tokens() == text and back.cpu_util == pytest.approx(0.5) and back.net_kind == "ib"
    assert back.net_frac == pytest.approx(job.net_frac, abs=1e-3) and back.sto_devices[
        0
    ].bps == pytest.approx(3e8)


def test_reason_codes_read_as_words():
    assert perf.reason_text("lustre-not-read") == "lustre: its client counters are not read"
    assert "cgroup" in perf.reason_text("no-cgroup") and perf.reason_text("odd") == "odd"


numbers = st.one_of(st.none(), st.floats(0, 1e15, allow_nan=False).map(lambda x: float(f"{x:.4g}")))
word = st.text("abcdefgh-0123456789", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        perf.JobPerf,
        st.integers(1, 512),
        *(st.floats(0, 1e7).map(lambda x: round(x, 1)) for _ in range(3)),
        st.sampled_from(["ib", "roce", "eth", "ib+eth", ""]),
        *(numbers for _ in range(8)),
        st.lists(
            st.builds(
                perf.StoDev,
                word,
                st.sampled_from(["nvme0n1", "nfs:srv:/export/a", "md127"]),
                st.sampled_from(["cache", "source", "cache+source", "disk"]),
                numbers,
            ),
            max_size=4,
        ).map(tuple),
        st.lists(st.tuples(st.sampled_from(["cache", "source"]), word), max_size=3).map(tuple),
        st.one_of(st.none(), st.floats(0, 1e7).map(lambda x: round(x, 1))),
        st.one_of(st.none(), st.floats(0, 1e7).map(lambda x: round(x, 1))),
        st.one_of(st.none(), st.integers(1, 4096)),
        st.sampled_from(["", "no-cgroup"]),
        numbers,
        numbers,
        numbers,
        st.text("0123456789-", max_size=48).filter(lambda t: t != "-"),
        st.text("0123456789-", max_size=48).filter(lambda t: t != "-"),
        numbers,
    )
)
def test_tokens_round_trip(job):
    text = job.tokens()
    back = perf.parse_tokens(dict(t.split("=", 1) for t in text.split(" ")))
    assert (
        back.tokens() == text
        and back.sto_devices == job.sto_devices
        and back.sto_unmeasured == job.sto_unmeasured
    )


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["pf_nodes", "net_bps", "sto_dev", "sto_un", "cpus", "net_tl", "clk", "x"]),
        st.text(max_size=80),
    )
)
def test_parse_tokens_never_raises_on_garbage(fields):
    back = perf.parse_tokens(fields)
    assert back is None or isinstance(back.tokens(), str)


garbage_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(garbage_json, garbage_json)
def test_merge_never_raises_on_a_garbled_node_summary(perf_value, series):
    good = node_doc("n1", 0, 10, tx=1e9, cap=2.5e10, read=1e9, s=10.0)
    broken = node_doc("n2", 0, 10, tx=1e9, cap=2.5e10, read=1e9, s=10.0)
    broken["perf"]["net"] = perf_value
    good["perf"]["series"] = series
    job = perf.merge([good, broken, {"node": "n3", "perf": perf_value, "start": "x"}])
    assert job.nodes >= 1 and isinstance(job.tokens(), str)


# ---- the sampler daemon, with the stand-in advancing a node's counters ---------------------------------------
def test_the_sampler_daemon_measures_a_tree_a_stand_in_advances(tmp_path):
    root = node(tmp_path)
    local = tmp_path / "usage"
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    prolog(local, "40", "0,1", time.time())
    cgroup_v2(root, "40", 0)
    env = hermetic_env(tmp_path, STUNE_SYSFS_ROOT=root)
    stop = threading.Event()
    stand_in = Counters(root)

    def traffic():
        while not stop.is_set():
            stand_in.ib("mlx5_0", int(HDR * 0.02), int(HDR * 0.02))  # 50 % of line rate at 25 Hz
            stand_in.disk("9:127", 10**8, 40)
            time.sleep(0.04)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        proc = subprocess.run(
            [
                f"{BIN}/stune-gpu-sampler",
                "run",
                "--gpu-snapshot",
                snap,
                "--local-dir",
                str(local),
                "--interval",
                "0.1",
                "--count",
                "20",
                *(a for p, _ in CACHE[:1] for a in ("--cache", p)),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        stop.set()
        thread.join()
    assert proc.returncode == 0, proc.stderr
    assert "ports (every ACTIVE IB/RoCE port): mlx5_0/1, " in proc.stderr and "md127 (cache)" in proc.stderr
    status = subprocess.run(
        [f"{BIN}/stune-gpu-sampler", "status", "--local-dir", str(local)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert status.returncode == 0, status.stderr
    assert (
        "% of line rate" in status.stdout
        and "md127" in status.stdout
        and "0.0 CPUs busy of 32" in status.stdout
    )
    doc = json.loads(
        subprocess.run(
            [f"{BIN}/stune-gpu-sampler", "status", "--local-dir", str(local), "--json"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    )
    p = doc["jobs"][0]["perf"]
    port = p["net"]["ports"][0]
    assert p["sampled_s"] > 1.0 and 0.2 < port["tx"] / port["cap"] < 0.9  # ~50 %, timing on a busy machine
    md = next(d for d in p["storage"]["devices"] if d["name"] == "md127")
    assert md["read"] > 0 and md["roles"] == ["cache"] and p["cpu"]["why"] is None and p["cpu"]["cpus"] == 32


def test_the_sampler_takes_its_ports_and_paths_from_the_nodes_profile(tmp_path):
    """`--partition hdr` (or $STUNE_HEALTH_PARTITION): the profile's 8 HCAs, not the storage HCA, and its cache
    tier's device; an unknown partition is a note, and the automatic rules apply."""
    root = node(tmp_path)
    local = tmp_path / "usage"
    prolog(local, "50", "0", time.time())
    snap = perf_snapshot(tmp_path / "gpus.json", 90)
    env = hermetic_env(
        tmp_path, STUNE_SYSFS_ROOT=root, STUNE_PARTITIONS=Path(__file__).parent.parent / "partitions"
    )
    run = [
        f"{BIN}/stune-gpu-sampler",
        "run",
        "--gpu-snapshot",
        snap,
        "--local-dir",
        str(local),
        "--count",
        "2",
    ]
    proc = subprocess.run([*run, "--partition", "hdr"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ports (the profile's fabric.hcas): mlx5_0/1, " in proc.stderr and "mlx5_8" not in proc.stderr
    assert "storage: md127 (cache)" in proc.stderr
    proc = subprocess.run(
        run, capture_output=True, text=True, env=dict(env, STUNE_HEALTH_PARTITION="nosuch"), timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "note: profile nosuch:" in proc.stderr and "every ACTIVE IB/RoCE port" in proc.stderr
    assert "mlx5_8/1" in proc.stderr and "storage: nvme0n1 (disk), nvme1n1 (disk)" in proc.stderr
