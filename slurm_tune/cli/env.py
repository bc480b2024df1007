"""`stune-env`: the TaskProlog's per-node settings for sites without it, for `eval` in a job script:

    eval "$(stune-env)" || exit 1

prints `export NAME='value'` lines (the ACTIVE fabric HCAs, the RoCE v2 GID index, the socket interface, staged
datasets) and says on stderr what it could not find. Outside a job, give the partition with -p.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..hw.sysfs import Sysfs, resolve_root
from ..nodeenv.envrules import RULES, SUBMIT
from ..nodeenv.taskenv import as_shell, task_environment
from ..profiles import load_profile
from ..thisnode import job_context
from .common import EXIT_OK, EXIT_USAGE, guarded
from .options import add

PROG = "stune-env"


def _parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split(":", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_rules(),
    )
    add(
        parser,
        "partition",
        help="the partition whose profile to use (default: the job's $SLURM_JOB_PARTITION)",
    )
    add(parser, "node")
    add(parser, "sysfs_root")
    return parser


def _rules() -> str:
    """The node side of the environment rule table (nodeenv/envrules.py), for --help."""
    lines = ["what it decides on the node (docs/sbatch.md: the whole rule table):"]
    lines += [f"  {r.name} ({r.applies}): {r.how}".replace("`", "") for r in RULES if r.decided != SUBMIT]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)

    job = job_context(os.environ, partition=args.partition or None, node=args.node or None)  # options win
    if not job.partition:
        print(f"{PROG}: no partition: run it inside a job, or give -p PARTITION", file=sys.stderr)
        return EXIT_USAGE

    job = job.with_profile(load_profile)
    if job.profile is None:
        raise job.profile_error
    sysfs = Sysfs(resolve_root(args.sysfs_root, job.environ, job.node))
    exports, messages = task_environment(job, progress=sys.stderr, sysfs=sysfs)
    for message in messages:
        print(f"{PROG}: {job.node}: {message}", file=sys.stderr)
    sys.stdout.write(as_shell(exports))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
