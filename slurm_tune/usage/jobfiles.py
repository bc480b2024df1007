"""What the node epilog adds to its summary from the job's directory (usage/jobdir.py), and the job-level
tokens the controller stores from every node's.

Node side (`node_part`, root, in `stune-gpu-sampler epilog`): the steps file summarised (usage/steps.py) and
the NCCL logs judged against the partition's profile (comm/), as the node summary's `steps` and `comm` keys
(each the compact form its module defines); a judged verdict is also recorded in the node's health state,
where the transport family counts fallbacks (health/transport.py).

Controller side (`job_tokens`, in `stune-fairshare store`): the tokens appended to the AdminComment line:
- the node counters merged over the nodes (usage/perf.py);
- the steps summary of the node with the most steps (rank 0 writes the file: one node has it);
- `comm=` the nodes' verdicts, `node@verdict` joined by `|`, the nodes with findings first and at most
  COMM_NODES_KEPT of them, with `commn=judged/ok/not_judged` counting every node.
"""

from __future__ import annotations

import os
import time

from .. import safeio
from ..errors import StuneError
from ..hostlist import expand_hostlist
from . import jobdir, perf
from . import steps as steps_mod

COMM_NODES_KEPT = 32  # node verdicts kept in AdminComment (~100-400 bytes each; the line stays < 64 KiB)
JUDGED = ("ok", "fallback", "no_gdr", "plugin_failed", "errors")  # statuses a node's record counts


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
    out = JobFiles()
    if not _plain_name(job_id):
        return out
    try:
        run_fd = safeio.open_dir(os.path.join(local_dir, jobdir.RUN_DIR))
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
    from ..comm import cap

    names: list[str] = []
    with os.scandir(job_fd) as entries:
        for entry in entries:
            if len(names) >= jobdir.MAX_FILES:
                out.notes.append(
                    f"more than {jobdir.MAX_FILES} names in the job directory: the rest not looked at"
                )
                break
            names.append(entry.name)
    logs = sorted(
        n for n in names if n.startswith(jobdir.NCCL_LOG_PREFIX) and n.endswith(jobdir.NCCL_LOG_SUFFIX)
    )
    out.nccl_files = len(logs)
    read = logs[: cap.NODE_CAP // cap.FILE_MIN]  # each at least FILE_MIN: the node's cap holds
    each = cap.share(len(read))
    tail = each // jobdir.NCCL_TAIL_SHARE
    for name in read:
        data = _read_one(out, name, job_fd, uid, each - tail, tail, cap.join_head_tail)
        if data is not None:
            out.nccl.append((name, data))
    if len(logs) > len(read):
        out.notes.append(
            f"{len(logs) - len(read)} more NCCL logs not read (the first {len(read)} were: the node's cap is "
            f"{cap.NODE_CAP >> 20} MiB)"
        )
    if jobdir.STEPS_FILE in names:
        out.steps = _read_one(out, jobdir.STEPS_FILE, job_fd, uid, jobdir.STEPS_HEAD, jobdir.STEPS_TAIL)


def _read_one(
    out: JobFiles, name: str, job_fd: int, uid: int, head: int, tail: int, join=None
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
    if not _plain_name(job_id):
        return
    try:
        run_fd = safeio.open_dir(os.path.join(local_dir, jobdir.RUN_DIR))
    except (OSError, safeio.UnsafePathError):
        return
    try:
        safeio.rmtree_at(job_id, run_fd)
    except OSError:
        pass
    finally:
        os.close(run_fd)


def node_part(
    local_dir: str, job_id: str, node: str, environ, now: float | None = None
) -> tuple[dict, list[str]]:
    """({"steps": tokens, "comm": verdict} for the node summary, notes for the epilog's log). Never raises for
    what the job left; the job's directory is removed afterwards by the caller."""
    now = time.time() if now is None else now
    uid_text = environ.get("SLURM_JOB_UID", "")
    if not uid_text.isdigit():
        return {}, ["no SLURM_JOB_UID: the job's directory is not read"]
    uid = int(uid_text)
    files = read_job_files(local_dir, job_id, uid)
    out: dict = {}
    notes = list(files.notes)
    if files.steps is not None:
        stats = steps_mod.parse(files.steps)
        if stats.has_steps or stats.bad:
            out["steps"] = stats.tokens()
            out["steps_n"] = stats.steps + stats.warmup
    if files.nccl or (files.found and job_nodes(environ) > 1):
        verdict, why = _judge(files, environ)
        if verdict is not None:
            out["comm"] = verdict.encode()
            if verdict.status in JUDGED:
                notes += _record(environ, node, job_id, uid, verdict, now)
        elif why:
            notes.append(why)
    return out, notes


def job_nodes(environ) -> int:
    """How many nodes the job has, from the epilog's environment (SLURM_JOB_NUM_NODES; Slurm 22.05 gives the
    list as SLURM_NODELIST, later ones SLURM_JOB_NODELIST too)."""
    count = environ.get("SLURM_JOB_NUM_NODES", "")
    if count.isdigit():
        return int(count)
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    return len(expand_hostlist(nodelist)) if nodelist else 1


def _judge(files: JobFiles, environ):
    """(the node's NodeVerdict, or None and why)."""
    from .. import comm
    from ..profilestore import load_profile
    from ..thisnode import job_partition

    partition = job_partition(environ)
    try:
        expect = comm.Expectation.from_profile(load_profile(partition)) if partition else None
    except (StuneError, OSError) as exc:
        return None, f"transport not judged: {exc}"
    if expect is None:
        return None, "transport not judged: no partition"
    return comm.judge([comm.parse(data) for _, data in files.nccl], expect), ""


def _record(environ, node: str, job_id: str, uid: int, verdict, now: float) -> list[str]:
    """The node's record of judged jobs (health state, under its lock). Best effort: a problem is a note."""
    from .. import comm
    from ..health import state, transport

    why = "; ".join(comm.messages(verdict, node=node, short=True))[: transport.WHY_MAX]
    try:
        directory = state.state_dir(None, environ, node)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        with state.Locked(directory) as st:
            transport.record(st.state, job_id, uid, verdict.status, why, now)
            st.save()
    except (OSError, StuneError) as exc:
        return [f"transport verdict not recorded in the node state: {exc}"]
    return []


def job_tokens(node_summaries: list[dict]) -> str:
    """The tokens the job's AdminComment line gets from its nodes' steps and comm parts ('' when none)."""
    from .. import comm

    tokens: list[str] = []
    job_perf = perf.merge(node_summaries)
    if job_perf.nodes:
        tokens.append(job_perf.tokens())
    with_steps = [s for s in node_summaries if isinstance(s.get("steps"), str) and s["steps"]]
    if with_steps:
        best = max(with_steps, key=lambda s: (_int(s.get("steps_n")), str(s.get("node"))))
        tokens.append(best["steps"])
    verdicts = []
    for s in sorted(node_summaries, key=lambda s: str(s.get("node"))):
        text = s.get("comm")
        verdict = comm.decode(text) if isinstance(text, str) else None
        if verdict is not None and _plain(str(s.get("node", ""))):
            verdicts.append((str(s["node"]), text, verdict.status))
    if verdicts:
        worst = sorted(verdicts, key=lambda v: (v[2] in ("ok", "not_judged"), v[2] == "ok"))
        kept = worst[:COMM_NODES_KEPT]
        ok = sum(1 for v in verdicts if v[2] == "ok")
        not_judged = sum(1 for v in verdicts if v[2] == "not_judged")
        tokens.append("comm=" + "|".join(f"{node}@{text}" for node, text, _ in kept))
        tokens.append(f"commn={len(verdicts) - not_judged}/{ok}/{not_judged}")
    return " ".join(tokens)


def parse_comm(fields: dict[str, str]):
    """The job's transport verdict (comm.JobVerdict) from its AdminComment fields, and the counts
    (judged, ok, not judged) over all its nodes; (None, None) when the line holds none."""
    from .. import comm

    text = fields.get("comm")
    if not text:
        return None, None
    per_node = {}
    for item in text.split("|"):
        node, sep, encoded = item.partition("@")
        verdict = comm.decode(encoded) if sep else None
        if verdict is not None:
            per_node[node] = verdict
    if not per_node:
        return None, None
    counts = None
    parts = fields.get("commn", "").split("/")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        counts = tuple(int(p) for p in parts)
    return comm.merge(per_node), counts


def _int(value) -> int:
    return value if type(value) is int else 0


def _plain(node: str) -> bool:
    return bool(node) and not any(c in node for c in " |@=")
