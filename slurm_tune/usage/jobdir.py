"""The per-job directory on each node: where a job's processes leave what the node epilog judges.

    <usage.local_dir>/run/             root's, mode 0755 (made by the prolog)
    <usage.local_dir>/run/<jobid>/     the job's user's, mode 0700 (made by the prolog, removed by the epilog)
        nccl.<host>.<pid>.log          NCCL_DEBUG_FILE (NCCL writes one per process: %h.%p)
        steps.jsonl                    STUNE_STEPS_FILE (the training script's step records: docs/steps.md)

The prolog (`prolog/20-stune-jobgpus`, root) makes the job's directory for every job; the TaskProlog
points NCCL_DEBUG_FILE and STUNE_STEPS_FILE into it when the directory is there and the user's; the node
epilog (`stune-gpu-sampler epilog`, root) reads the files through `read_job_files` and removes the
directory. The directory is the user's, so everything in it is hostile to root: it is opened without
following links (the job's directory too), each file must be a regular file with one link owned by the
job's user, at most MAX_FILES names are looked at, and every read is bounded: the head and the tail of a
long file (NCCL says what it chose at start-up, and its warnings come at the end), within comm/cap.py's
NODE_CAP for all of a node's NCCL logs.

Only `os` at module level: the TaskProlog imports `job_dir` before every task (docs/speed.md).
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


class JobFiles:
    """What a job left on this node. `nccl`: [(name, bytes)] of the NCCL logs read (head and tail joined when
    longer than the cap); `steps`: the steps file's bytes or None; `notes`: files refused or not read, each
    with why (a symlink, another owner, a hard link, too many)."""

    __slots__ = ("nccl", "nccl_files", "steps", "notes", "found")

    def __init__(self) -> None:
        self.nccl: list[tuple[str, bytes]] = []
        self.nccl_files = 0  # NCCL logs present, read or not
        self.steps: bytes | None = None
        self.notes: list[str] = []
        self.found = False  # the job's directory was there and usable


def read_job_files(local_dir: str, job_id: str, uid: int) -> JobFiles:
    """Read (as root) what the job's processes wrote into its directory; never raises for what is found
    there (a refused file is a note)."""
    from .. import safeio

    out = JobFiles()
    if not _plain_name(job_id):
        return out
    try:
        run_fd = safeio.open_dir(os.path.join(local_dir, RUN_DIR))
    except (OSError, safeio.UnsafePathError):
        return out
    try:
        try:
            job_fd = safeio.open_dir(job_id, run_fd, owner=uid)
        except FileNotFoundError:
            return out
        except (OSError, safeio.UnsafePathError) as exc:
            out.notes.append(f"job directory not read: {exc}")
            return out
        try:
            out.found = True
            _read_into(out, job_fd, uid)
        finally:
            os.close(job_fd)
    finally:
        os.close(run_fd)
    return out


def _read_into(out: JobFiles, job_fd: int, uid: int) -> None:
    from .. import safeio
    from ..comm import cap

    names: list[str] = []
    with os.scandir(job_fd) as entries:
        for entry in entries:
            if len(names) >= MAX_FILES:
                out.notes.append(f"more than {MAX_FILES} names in the job directory: the rest not looked at")
                break
            names.append(entry.name)
    logs = sorted(n for n in names if n.startswith(NCCL_LOG_PREFIX) and n.endswith(NCCL_LOG_SUFFIX))
    out.nccl_files = len(logs)
    read = logs[: cap.NODE_CAP // cap.FILE_MIN]  # each at least FILE_MIN: the node's cap holds
    each = cap.share(len(read))
    tail = each // NCCL_TAIL_SHARE
    for name in read:
        data = _read_one(out, name, job_fd, uid, each - tail, tail, safeio, cap.join_head_tail)
        if data is not None:
            out.nccl.append((name, data))
    if len(logs) > len(read):
        out.notes.append(
            f"{len(logs) - len(read)} more NCCL logs not read (the first {len(read)} were: the node's cap is "
            f"{cap.NODE_CAP >> 20} MiB)"
        )
    if STEPS_FILE in names:
        out.steps = _read_one(out, STEPS_FILE, job_fd, uid, STEPS_HEAD, STEPS_TAIL, safeio)


def _read_one(
    out: JobFiles, name: str, job_fd: int, uid: int, head: int, tail: int, safeio, join=None
) -> bytes | None:
    try:
        fd = safeio.open_file(name, job_fd, owner=uid, single_link=True)
    except (OSError, safeio.UnsafePathError) as exc:
        out.notes.append(f"{name}: not read: {exc}")
        return None
    try:
        return safeio.read_head_tail(fd, head, tail, join)
    except OSError as exc:
        out.notes.append(f"{name}: not read: {exc}")
        return None
    finally:
        os.close(fd)


def _plain_name(name: str) -> bool:
    """A job id usable as one path component (the hook's $SLURM_JOB_ID; never `..` or a path)."""
    return bool(name) and "/" not in name and not name.startswith(".") and "\0" not in name


def remove_job_dir(local_dir: str, job_id: str) -> None:
    """Remove the job's directory (as root, without following anything the user left in it)."""
    from .. import safeio

    if not _plain_name(job_id):
        return
    try:
        run_fd = safeio.open_dir(os.path.join(local_dir, RUN_DIR))
    except (OSError, safeio.UnsafePathError):
        return
    try:
        safeio.rmtree_at(job_id, run_fd)
    except OSError:
        pass
    finally:
        os.close(run_fd)
