"""`stune-env`: the TaskProlog's per-node settings for sites without it, for `eval` in a job script:

    eval "$(stune-env)" || exit 1

prints `export NAME='value'` lines (the ACTIVE fabric HCAs, the RoCE v2 GID index, the socket interface, staged
datasets) and says on stderr what it could not find. Outside a job, give the partition with -p.
"""
from __future__ import annotations

import os
import sys

from .common import EXIT_OK, EXIT_USAGE, guarded

PROG = "stune-env"
USAGE = f"usage: {PROG} [-p PARTITION] [--sysfs-root DIR]"


def _main(argv: list[str]) -> int:
    environ = dict(os.environ)
    partition = environ.get("SLURM_JOB_PARTITION", "").split(",")[0]
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(__doc__.split(":", 1)[1].strip())
            print(USAGE)
            return EXIT_OK
        if arg in ("-p", "--partition") and args:
            partition = args.pop(0)
        elif arg.startswith("--partition="):
            partition = arg.split("=", 1)[1]
        elif arg == "--sysfs-root" and args:
            environ["STUNE_SYSFS_ROOT"] = args.pop(0)
        elif arg.startswith("--sysfs-root="):
            environ["STUNE_SYSFS_ROOT"] = arg.split("=", 1)[1]
        else:
            print(f"{PROG}: unknown argument {arg!r}\n{USAGE}", file=sys.stderr)
            return EXIT_USAGE
    if not partition:
        print(f"{PROG}: no partition: run it inside a job, or give -p PARTITION", file=sys.stderr)
        return EXIT_USAGE
    from ..nodeenv.taskenv import as_shell, task_environment
    from ..profiles import load_profile

    profile = load_profile(partition)
    exports, messages = task_environment(environ, profile, progress=sys.stderr)
    from ..thisnode import node_name

    for message in messages:
        print(f"{PROG}: {node_name(environ)}: {message}", file=sys.stderr)
    sys.stdout.write(as_shell(exports))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    return guarded(PROG, _main, argv)
