"""`stune-gpu-sampler`: the per-node GPU utilization sampler, and the node epilog that summarizes a job.

    stune-gpu-sampler run [--gpu-snapshot FILE] [--interval 1] [--local-dir DIR]   (the daemon; systemd unit
                          [--sysfs-root DIR] [--partition P] [--cache PATH]        in contrib/systemd/)
                          [--source PATH ...] [--no-perf]
    stune-gpu-sampler epilog                  (from epilog/20-stune-usage: this node's summary -> shared spool)
    stune-gpu-sampler status [--json]         (jobs being sampled here, with their running means)

`run --snapshot FILE` is the old spelling of `--gpu-snapshot FILE` (stune-health's name for the same replay;
its `--snapshot` is a whole node's snapshot): still accepted, with a note.

The devices are read by the backend of the node's profile (`--partition`, default $STUNE_HEALTH_PARTITION):
`accelerator: nvidia` NVML, `amd` amdsmi, `ascend` npu-smi (the profile's accel.tools, else $STUNE_ACCEL_TOOLS,
PATH and the vendor's directories); a snapshot replays its `gpus` section on NVIDIA, its `accel` section on
AMD and Ascend (usage/sampler.open_source). Without a profile: NVML, as before.

Beside the GPUs (`--no-perf` turns it off), the node's counters go into each job's perf record
(usage/perfrec.py): read under `--sysfs-root` ($STUNE_SYSFS_ROOT, %n the node name, as every stune command);
the ports are the profile's fabric where the node has one (`--partition`, default $STUNE_HEALTH_PARTITION),
the storage devices those behind the profile's cache tier and `cache.stage` sources plus `--cache` and
`--source` (hw/counters.py has the rules).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..accelspec import gres_name
from ..errors import StuneError
from ..hw.sysfs import resolve_root
from ..output import print_json
from ..profilestore import load_profile
from ..thisnode import expand, job_context, node_name
from ..usage import accum, pipeline
from ..usage.config import load_config, usage_dirs
from ..usage.perf import node_perf, reason_text
from ..usage.perfrec import NodePerf
from ..usage.sampler import MAX_GAP_INTERVALS, NVIDIA, Sampler, open_source, slurm_resolver
from ..usage.spool import node_epilog
from . import options
from .common import EXIT_OK, guarded

PROG = "stune-gpu-sampler"


class _Stop(BaseException):
    """SIGTERM/SIGINT: a BaseException, so the sampler's keep-going `except Exception` around a tick cannot
    swallow a stop that lands inside one (systemd would wait for its SIGKILL)."""


def _raise_stop(signum, frame):
    raise _Stop()


def _run(args) -> int:
    config = load_config(args.config)
    local, _ = usage_dirs(config)
    local = expand(args.local_dir) if args.local_dir else local
    interval = args.interval or config.usage.interval
    # the shipped systemd unit passes no --gpu-snapshot: $STUNE_GPU_SNAPSHOT (as for stune-health, %n allowed)
    snapshot = args.gpu_snapshot or os.environ.get("STUNE_GPU_SNAPSHOT") or None
    snapshot = expand(snapshot) if snapshot else None
    profile = _node_profile(args)
    vendor = profile.accelerator if profile is not None else None
    tools = profile.accel.tools.to_dict() if profile is not None and vendor != NVIDIA else None
    node = args.node or node_name()
    gres = gres_name(profile) if profile is not None else "gpu"
    # Slurm names a job's ids in the Prolog's environment for gres/gpu only: for another GRES, ask it per job
    resolve = slurm_resolver(gres, node) if gres != "gpu" else None
    source = open_source(vendor, snapshot, perf=not args.no_perf, tools=tools, environ=os.environ, node=node)
    node_perf = None
    if not args.no_perf:
        fabric, paths = _node_hints(args, profile)
        root = resolve_root(args.sysfs_root)
        node_perf = NodePerf(local, root, fabric, paths, max_gap=MAX_GAP_INTERVALS * interval)
        sel = node_perf.select(time.time())
        ports = ", ".join(p.name for p in sel.ports) or "none"
        disks = ", ".join(f"{d.name} ({'+'.join(d.roles)})" for d in sel.devices) or "none"
        print(f"{PROG}: ports ({sel.rule}): {ports}; storage: {disks}", file=sys.stderr)
        for path, role, why in sel.unmeasured:
            print(f"{PROG}: {role} {path}: unmeasured: {reason_text(why)}", file=sys.stderr)
        for note in sel.notes:
            print(f"{PROG}: note: {note}", file=sys.stderr)
    sampler = Sampler(
        source,
        local,
        interval=interval,
        busy_util=config.report.busy_util,
        gpu_map=args.gpu_map,
        perf=node_perf,
        vendor=vendor,
        resolve=resolve,
    )
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    print(
        f"{PROG}: sampling every {interval:g}s into {local} "
        f"({'snapshot ' + snapshot if snapshot else _LIVE.get(vendor or NVIDIA, 'NVML')}"
        f"{f'; gres/{gres} ids from Slurm per job' if resolve else ''})",
        file=sys.stderr,
        flush=True,
    )
    try:
        sampler.run(args.count)
    except _Stop:
        pass
    finally:
        sampler.close()
    return EXIT_OK


_LIVE = {"nvidia": "NVML", "amd": "amdsmi", "ascend": "npu-smi"}


def _node_profile(args):
    """The node's profile (`--partition`, default $STUNE_HEALTH_PARTITION), or None: none named, or one that
    cannot be loaded (a note; the sampler then reads NVML and chooses ports and disks without it)."""
    partition = args.partition or os.environ.get("STUNE_HEALTH_PARTITION")
    if not partition:
        return None
    try:
        return load_profile(partition)
    except StuneError as exc:
        print(f"{PROG}: note: profile {partition}: {exc}; sampling without it", file=sys.stderr)
        return None


def _node_hints(args, profile) -> tuple[dict | None, list[tuple[str, str]]]:
    """(fabric, [(path, role)]) from the node's profile and the options; no profile: the automatic rules."""
    fabric, paths = None, []
    if profile is not None:
        f = profile.fabric
        hcas = [(h.device, h.port) for h in f.hcas or ()]
        fabric = {"type": f.type, "hcas": hcas, "socket_ifname": f.socket_ifname}
        if profile.cache.path:
            paths.append((profile.cache.path, "cache"))
        paths.extend((src, "source") for src in profile.cache.stage or ())
    paths.extend((p, "cache") for p in args.cache or ())
    paths.extend((p, "source") for p in args.source or ())
    return fabric, paths


def _epilog(args) -> int:
    """Never fails the epilog: a problem is one line on stderr and exit 0 (a non-zero epilog drains the node)."""
    try:
        context = job_context(os.environ, node=args.node)  # an explicit --node wins over $SLURMD_NODENAME
        job = args.job or context.job_id
        node = context.node
        if not job:
            print(f"{PROG}: epilog: no SLURM_JOB_ID", file=sys.stderr)
            return EXIT_OK
        local, spool_dir = usage_dirs()
        outcome = node_epilog(
            local, spool_dir, job, node, os.environ.get("SLURM_JOB_GPUS"), environ=os.environ
        )
        if args.verbose:
            print(f"{PROG}: job {job} on {node}: {outcome}", file=sys.stderr)
    except Exception as exc:  # the hook boundary
        print(f"{PROG}: epilog: {type(exc).__name__}: {exc}", file=sys.stderr)
    return EXIT_OK


def _status(args) -> int:
    local, _ = usage_dirs(load_config(args.config))
    local = args.local_dir or local
    acc_dir = os.path.join(local, pipeline.ACC_DIR)
    try:
        names = sorted(os.listdir(acc_dir))
    except FileNotFoundError:
        names = []
    jobs: list[dict] = []
    for name in names:
        try:
            _, gpus = accum.read(os.path.join(acc_dir, name))
        except accum.AccumulatorError as exc:
            jobs.append({"job": name, "error": str(exc), "gpus": []})
            continue
        jobs.append(
            {
                "job": name,
                "error": None,
                "perf": node_perf(local, name),
                "gpus": [
                    {
                        "gpu": int(g["gpu_id"]),
                        "sampled_s": round(g["sm_dt"], 3),
                        "sm_util": round(g["sm_sum"] / g["sm_dt"], 4) if g["sm_dt"] > 0 else None,
                    }
                    for g in gpus
                ],
            }
        )
    if args.json:
        print_json({"dir": acc_dir, "jobs": jobs})
        return EXIT_OK
    if not jobs:
        print(f"no job is being sampled ({acc_dir})")
    for job in jobs:
        if job["error"]:
            print(f"job {job['job']}: {job['error']}")
            continue
        print(
            f"job {job['job']}: "
            + ", ".join(
                f"gpu{g['gpu']} sm {'-' if g['sm_util'] is None else format(100 * g['sm_util'], '.0f') + '%'} "
                f"over {g['sampled_s']:.0f}s"
                for g in job["gpus"]
            )
        )
        if job.get("perf"):
            print(f"  {_perf_line(job['perf'])}")
    return EXIT_OK


def _rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "unmeasured"


def _perf_line(p: dict) -> str:
    """One line of a job's node counters so far: network, storage, CPU, GPU links, clock."""
    ports = [x for x in p["net"]["ports"] if x["s"] > 0]
    cap = sum(x["cap"] for x in ports)
    busier = max(sum(x["tx"] for x in ports), sum(x["rx"] for x in ports))
    net = _rate(busier, max((x["s"] for x in ports), default=0))
    net += f" ({100 * busier / cap:.0f} % of line rate)" if cap > 0 else ""
    devs = [d for d in p["storage"]["devices"] if d["s"] > 0]
    sto = ", ".join(f"{d['name']} {_rate(d['read'], d['s'])}" for d in devs) or "unmeasured"
    sto += "".join(f"; {u['path']} unmeasured ({reason_text(u['why'])})" for u in p["storage"]["unmeasured"])
    cpu = p["cpu"]
    cpu_text = f"{cpu['s'] / cpu['over_s']:.1f} CPUs busy" if cpu["over_s"] > 0 else "unmeasured"
    cpu_text += f" of {cpu['cpus']}" if cpu["over_s"] > 0 and cpu["cpus"] else ""
    cpu_text += f" ({reason_text(cpu['why'])})" if cpu.get("why") else ""
    g = p["gpu"]
    pcie = _rate(g["pcie_tx"] + g["pcie_rx"], g["pcie_s"])
    nvlink = _rate(g["nvlink_tx"] + g["nvlink_rx"], g["nvlink_s"])
    clock = f"{100 * g['sm_mhz_s'] / g['sm_max_mhz_s']:.0f} %" if g["sm_max_mhz_s"] > 0 else "unmeasured"
    shared = " (node-wide: another job shared the node)" if p["shared_s"] > 0 else ""
    return (
        f"over {p['sampled_s']:.0f}s: net {net}; storage {sto}{shared}; cpu {cpu_text}; "
        f"per GPU pcie {pcie}, nvlink {nvlink}; SM clock {clock} of max"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="per-job GPU utilization sampler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="sample the GPUs until stopped")
    p.add_argument(
        "--gpu-snapshot",
        metavar="FILE",
        help="read GPUs from this snapshot file (re-read when it "
        "changes) instead of NVML; default $STUNE_GPU_SNAPSHOT "
        "(%%n: the node name)",
    )
    options.deprecated(p, "--snapshot", "--gpu-snapshot", PROG, dest="gpu_snapshot")
    p.add_argument("--interval", type=float, help="seconds between samples (default usage.interval)")
    p.add_argument("--local-dir", help="node-local state (default $STUNE_USAGE_DIR or usage.local_dir)")
    p.add_argument(
        "--gpu-map",
        choices=("auto", "minor", "index"),
        default="auto",
        help="how Slurm GPU ids map to GPUs: device minor (from /proc) or NVML index; auto: AMD and Ascend "
        "readings are numbered by device file already",
    )
    options.add(p, "sysfs_root")
    options.add(
        p,
        "partition",
        help="the node's profile: its accelerator's backend, its fabric's ports, cache tier and sources "
        "(default $STUNE_HEALTH_PARTITION; none: NVML, every ACTIVE IB/RoCE port, every disk)",
    )
    options.add(p, "node", help="the node's name, for %%n in $STUNE_ACCEL_TOOLS (default: $SLURMD_NODENAME)")
    p.add_argument(
        "--cache", action="append", metavar="PATH", help="the cache tier's path (its device is measured)"
    )
    p.add_argument("--source", action="append", metavar="PATH", help="a dataset source's path (repeatable)")
    p.add_argument("--no-perf", action="store_true", help="GPUs only: no network, storage or CPU counters")
    p.add_argument("--count", type=int, help=argparse.SUPPRESS)
    p.add_argument("--config")
    p = sub.add_parser("epilog", help="summarize this node's usage of $SLURM_JOB_ID into the shared spool")
    p.add_argument("--job", help=argparse.SUPPRESS)
    options.add(p, "node", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true")
    p = sub.add_parser("status", help="jobs being sampled on this node")
    p.add_argument("--local-dir")
    p.add_argument("--config")
    options.add(p, "json")
    return parser


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return {"run": _run, "epilog": _epilog, "status": _status}[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
