"""The per-job directory on each node: where a job's processes leave what the node epilog judges.

    <usage.local_dir>/run/             root's, mode 0755 (made by the prolog)
    <usage.local_dir>/run/<jobid>/     the job's user's, mode 0700 (made by the prolog, removed by the epilog)
        nccl.<host>.<pid>.log          NCCL_DEBUG_FILE (NCCL writes one per process: %h.%p)
        steps.jsonl                    STUNE_STEPS_FILE (the training script's step records: docs/steps.md)

The prolog (`prolog/20-stune-jobgpus`, root) makes the job's directory for every job; the TaskProlog
points NCCL_DEBUG_FILE and STUNE_STEPS_FILE into it when the directory is there and the user's; the node
epilog (`stune-gpu-sampler epilog`, root) reads the files (usage/jobfiles.py: `read_job_files`) and removes
the directory. The directory is the user's, so everything in it is hostile to root: it is opened without
following links (the job's directory too), each file must be a regular file with one link owned by the
job's user, at most MAX_FILES names are looked at, and every read is bounded: the head and the tail of a
long file (NCCL says what it chose at start-up, and its warnings come at the end), within comm/cap.py's
NODE_CAP for all of a node's NCCL logs.

The layout only, and only `os` at module level: the TaskProlog imports it before every task (docs/speed.md);
the epilog's reader is usage/jobfiles.py.
"""

from __future__ import annotations

import os

DEFAULT_LOCAL_DIR = "/var/lib/stune/usage"  # usage.local_dir's default, which the shell hooks use too
RUN_DIR = "run"
NCCL_LOG_PATTERN = "nccl.%h.%p.log"  # NCCL replaces %h with the host name and %p with the process id
NCCL_LOG_PREFIX, NCCL_LOG_SUFFIX = "nccl.", ".log"
STEPS_FILE = "steps.jsonl"
MAX_FILES = 256  # names looked at in one job's directory (NCCL: one log per process on the node)
NCCL_TAIL_SHARE = 8  # of a log's share of the node's cap, 1/8 is its tail: set-up comes first, WARNs last
STEPS_HEAD, STEPS_TAIL = 1 << 20, 3 << 20  # the first steps (warm-up) and the latest


def job_dir(job_id: str, environ=None, node: str | None = None) -> str:
    """The job's directory on this node: $STUNE_USAGE_DIR (`%n`: the node), else usage.local_dir's default,
    as the prolog hook reads it."""
    from ..thisnode import expand

    environ = os.environ if environ is None else environ
    local = expand(environ.get("STUNE_USAGE_DIR") or DEFAULT_LOCAL_DIR, node, environ)
    return os.path.join(local, RUN_DIR, job_id)


def usable_by_me(path: str) -> bool:
    """The job's directory exists, is a real directory (not a symlink) and belongs to this process's user:
    what the TaskProlog checks before pointing a job's files into it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o040000 and st.st_uid == os.geteuid()
