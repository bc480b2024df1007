"""`stune-gpu-sampler`: the per-node GPU utilization sampler, and the node epilog that summarizes a job.

    stune-gpu-sampler run [--gpu-snapshot FILE] [--interval 1] [--local-dir DIR]   (the daemon; systemd unit
                                                                                    in contrib/systemd/)
    stune-gpu-sampler epilog                  (from epilog/20-stune-usage: this node's summary -> shared spool)
    stune-gpu-sampler status [--json]         (jobs being sampled here, with their running means)

`run --snapshot FILE` is the old spelling of `--gpu-snapshot FILE` (stune-health's name for the same replay;
its `--snapshot` is a whole node's snapshot): still accepted, with a note.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from ..hw.nvml import open_gpu_source
from ..output import print_json
from ..thisnode import expand, job_context
from ..usage import accum, pipeline
from ..usage.config import load_config, usage_dirs
from ..usage.sampler import Sampler
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
    source = open_gpu_source(snapshot=snapshot)
    sampler = Sampler(
        source, local, interval=interval, busy_util=config.report.busy_util, gpu_map=args.gpu_map
    )
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    print(
        f"{PROG}: sampling every {interval:g}s into {local} "
        f"({'snapshot ' + snapshot if snapshot else 'NVML'})",
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
    return EXIT_OK


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
        help="how Slurm GPU ids map to GPUs: device minor (from /proc) or NVML index",
    )
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
