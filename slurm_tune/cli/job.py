"""`stune-job`: what happened to my job. Its GPU usage and charge, which of compute, storage, communication
or the host bound it (with the numbers), the transport NCCL used, and its throughput.

    stune-job JOBID [--json] [--png FILE] [--config FILE]

`stune-fairshare job JOBID` is the older spelling of the same command, with the same output.
"""

from __future__ import annotations

import argparse
import sys

from ..fairshare import jobdoc
from ..fairshare.jobview import job_view
from ..output import json_text
from ..slurm import Slurm
from ..usage.config import load_config
from . import options
from .common import EXIT_OK, guarded

PROG = "stune-job"


def show(args, prog: str) -> int:
    """Print one job's document (text, or --json) and write its --png timeline."""
    config = load_config(args.config)
    doc = job_view(Slurm.from_env(), config, args.job_id)
    if args.png:
        jobdoc.timeline_png(doc, args.png)
        print(f"{prog}: wrote {args.png}", file=sys.stderr)
    sys.stdout.write(json_text(doc) if args.json else jobdoc.job_text(doc))
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="fair-share YAML (default $STUNE_FAIRSHARE_CONFIG or /etc/stune/fairshare.yaml)"
    )
    p.add_argument("job_id", help="the job (12345, or 12345_7 for an array task)")
    options.add(p, "json")
    p.add_argument("--png", help="write the job's timeline chart (GPU, network, storage) here")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="what happened to my job: GPU usage and charge, the bottleneck (compute, storage, "
        "communication, host) with its numbers, the NCCL transport, the throughput",
    )
    add_arguments(parser)
    return parser


def _main(argv: list[str]) -> int:
    return show(options.parse(_parser(), argv), PROG)


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
