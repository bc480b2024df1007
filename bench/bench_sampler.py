"""The GPU sampler's CPU cost: 8 GPUs held by two jobs. Goal: <= 0.5 % of one core at 1 Hz.

CPU time, not wall time: each subject runs in its own process and measures time.process_time() (user + system
of every thread, including NVML probe threads) over a run of samples after a warm-up. Subjects, interleaved:

- idle loop (baseline): the same fixed-schedule loop with nothing to do; Python's floor for a 1 Hz daemon
- sampler, snapshot source: 8 GPUs from a real DGX A100 capture (`stune-health capture` format)
- sampler, NVML path: the live source (one NVML session, a deadline thread per read) over a stand-in pynvml
  with 8 A100s; real NVML adds the driver's own time per call, which only a GPU node can measure
- the same two with the node counters (issue 24 §1, usage/perfrec.NodePerf): a DGX A100 IB sysfs tree with
  the profile's 8 HCA ports, 2 block devices (the cache tier's md127 and the root fs's nvme0n1p2), an NFS
  mount and a Lustre one, both jobs' cgroup v2 CPU time, and each GPU's PCIe / NVLink / SM clock readings

Runs sample at 10 Hz to collect enough CPU time per round; the cost of one sample times 1 Hz is the share
of a core at 1 Hz. A final direct run at 1 Hz checks the extrapolation.

    .venv/bin/python bench/bench_sampler.py [--rounds 5] [--samples 100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from common import compare

CHILD = r"""
import json, os, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
kind, local, samples, interval, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
from slurm_tune.usage.sampler import Sampler
node_perf = None
if kind.endswith("+perf"):
    from slurm_tune.usage.perfrec import NodePerf
    fabric = {{"type": "ib", "hcas": [(f"mlx5_{{i}}", 1) for i in range(8)]}}
    paths = [("/local/nvme/stune-cache", "cache"), ("/", "source"), ("/datasets", "source"), ("/lustre", "source")]
    node_perf = NodePerf(local, os.path.join(local, "root"), fabric, paths, max_gap=2.5 * interval)
    sel = node_perf.select(0.0)
    assert len(sel.ports) == 8 and len([d for d in sel.devices if d.kind == "block"]) == 2, sel.devices
if kind == "idle":
    class Idle:
        def sample_once(self):
            return 0
    sampler = Idle()
else:
    if kind.startswith("snapshot"):
        from slurm_tune.hw.nvml import open_gpu_source
        source = open_gpu_source(snapshot=os.path.join(local, "snapshot.json"))
    else:
        import fakenvml
        from slurm_tune.hw.nvml import LiveGpuSource
        fake = fakenvml.FakeNvml([fakenvml.device(i, util_gpu=70) for i in range(8)])
        source = LiveGpuSource(nvml=fake, perf=node_perf is not None)
    sampler = Sampler(source, local, interval=interval, perf=node_perf)
def run(n):
    next_at = time.monotonic()
    for _ in range(n):
        sampler.sample_once()
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
run(warm)
cpu0, wall0 = time.process_time(), time.monotonic()
run(samples)
print(json.dumps({{"cpu_per_sample": (time.process_time() - cpu0) / samples,
                  "wall": time.monotonic() - wall0}}))
"""


def prepare(work: str, perf: bool = False) -> None:
    from usage_helpers import write_snapshot

    local = Path(work)
    (local / "jobs").mkdir(parents=True, exist_ok=True)
    (local / "jobs" / "101").write_text("0,1,2,3\n")
    (local / "jobs" / "102").write_text("4,5,6,7\n")
    if not perf:
        write_snapshot(local / "snapshot.json", 70, gpus=8)
        return
    from test_counters import cgroup_v2, ib_node, storage_node
    from test_perf import perf_snapshot

    root = storage_node(ib_node(local / "root"))
    for job in ("101", "102"):
        cgroup_v2(root, job, 10**9)
    perf_snapshot(local / "snapshot.json", 70, gpus=8, nvlink=(10**9, 10**9))


SNAPSHOT_PERF = "sampler + node counters, snapshot, 8 GPUs, 8 ports, 2 disks"
NVML_PERF = "sampler + node counters, NVML path (stand-in)"
PAIRS = {
    SNAPSHOT_PERF: "sampler, snapshot source, 8 GPUs",
    NVML_PERF: "sampler, NVML path (stand-in), 8 GPUs",
}


def measure(kind: str, work: str, samples: int, interval: float, warm: int = 5) -> float:
    code = CHILD.format(repo=str(REPO), tests=str(REPO / "tests"))
    out = subprocess.run(
        [sys.executable, "-c", code, kind, work, str(samples), str(interval), str(warm)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_sampler: {kind} failed: {out.stderr[-800:]}")
    return json.loads(out.stdout)["cpu_per_sample"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--direct-seconds", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    kinds = ("idle", "snapshot", "snapshot+perf", "nvml", "nvml+perf")
    works = {kind: tempfile.mkdtemp(prefix=f"bench-sampler-{kind.replace('+', '-')}-") for kind in kinds}
    for kind, work in works.items():
        prepare(work, perf=kind.endswith("+perf"))
    interval = 0.1
    result = compare(
        "bench_sampler",
        {
            "idle loop (baseline)": lambda: measure("idle", works["idle"], args.samples, interval),
            "sampler, snapshot source, 8 GPUs": lambda: measure(
                "snapshot", works["snapshot"], args.samples, interval
            ),
            SNAPSHOT_PERF: lambda: measure("snapshot+perf", works["snapshot+perf"], args.samples, interval),
            "sampler, NVML path (stand-in), 8 GPUs": lambda: measure(
                "nvml", works["nvml"], args.samples, interval
            ),
            NVML_PERF: lambda: measure("nvml+perf", works["nvml+perf"], args.samples, interval),
        },
        rounds=args.rounds,
        warmup=1,
    )
    print("\nCPU per sample and share of one core at 1 Hz (goal <= 0.5 %):")
    for name, cpu in result["median_s"].items():
        print(f"  {name:60s} {cpu * 1e6:8.1f} us/sample  {100 * cpu:7.4f} % of a core at 1 Hz")
    direct = measure("snapshot+perf", works["snapshot+perf"], args.direct_seconds, 1.0, warm=2)
    print(
        f"\ndirect 1 Hz run, snapshot source with node counters, {args.direct_seconds} samples: "
        f"{direct * 1e6:.1f} us/sample = {100 * direct:.4f} % of a core"
    )
    base = result["median_s"]["idle loop (baseline)"]
    for name, plain in PAIRS.items():
        extra = result["median_s"][name] - result["median_s"][plain]
        print(
            f"  node counters add {extra * 1e6:.1f} us/sample ({extra / base:.2f}x the idle loop) to {plain!r}"
        )
    worst = max(v for k, v in result["median_s"].items() if k.startswith("sampler"))
    print(
        f"worst sampler subject: {100 * worst:.4f} % of a core at 1 Hz (goal <= 0.5 %): "
        f"{'OK' if worst <= 0.005 else 'OVER'}"
    )
    result["direct_1hz_cpu_per_sample"] = direct
    (HERE / "results" / "bench_sampler.json").write_text(json.dumps(result, indent=2) + "\n")
    bench_prolog(args.rounds * 6)
    return 0


def bench_prolog(rounds: int) -> None:
    """The prolog hook that feeds the sampler runs in every job's prolog: plain sh, no Python."""
    from common import time_once

    work = tempfile.mkdtemp(prefix="bench-prolog-")
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_GPUS": "0,1,2,3",
        "STUNE_USAGE_DIR": work,
    }
    compare(
        "bench_prolog_jobgpus",
        {
            "sh -c 'exit 0' (baseline)": lambda: time_once(["/bin/sh", "-c", "exit 0"], env=env),
            "prolog/20-stune-jobgpus": lambda: time_once(
                [str(REPO / "prolog" / "20-stune-jobgpus")], env=env
            ),
        },
        rounds=rounds,
        warmup=3,
    )


if __name__ == "__main__":
    sys.exit(main())
