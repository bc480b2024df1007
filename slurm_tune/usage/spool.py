"""Where usage data lives on disk, and the node epilog's job: accumulators -> node summary -> shared spool.

Node-local (`usage.local_dir`, default /var/lib/stune/usage):
    jobs/<jobid>    written by the prolog: the job's Slurm GPU ids ("0,1"); its mtime is the job's start here.
                    "?" (UNNAMED) when Slurm named no GPU ids: a job without GPUs, or one holding another
                    GRES (gres/npu), whose ids Slurm puts in no Prolog or TaskProlog environment; the sampler
                    of a node that schedules such a GRES asks Slurm for them once (usage/sampler.py)
    acc/<jobid>     the sampler's accumulators (accum.py)

Shared (`usage.spool_dir`, default /var/spool/stune/usage; NFS or any filesystem the nodes and the
controller share; owned root:<SlurmUser's group>, mode 2775 so users cannot forge summaries):
    <jobid>/<node>.json   one node's summary, written atomically (safeio.write_atomic: temp name + rename)
    <jobid>/stored        what the controller last stored (nodes, time), when it stored a partial job

Why a shared spool: Slurm asks node prologs/epilogs not to call Slurm commands (thousands of nodes ending
jobs at once would flood slurmctld/slurmdbd). A file drop on a filesystem every cluster already shares
(home or /var/spool on NFS) costs the nodes nothing, needs no extra service, and the controller's
EpilogSlurmctld (one process per job, on the controller) does the single slurmdbd write, as Princeton's
jobstats does. Sites that run Prometheus can still scrape the sampler; the accounting copy lives in Slurm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

from .. import safeio
from ..hostlist import expand_hostlist
from . import accum, perf, pipeline
from .pipeline import NODE_SUMMARY_SUFFIX, STORED_MARKER
from .summary import ACC_FIELDS

NODE_SUFFIX = NODE_SUMMARY_SUFFIX  # pipeline.py names the formats
SPOOL_DIR_MODE = 0o2775
RECORD_MAX_BYTES = 16 << 20  # a node summary with its utilization series is a few KiB


def job_file(local_dir: str, job_id: str) -> str:
    return os.path.join(local_dir, pipeline.JOBS_DIR, job_id)


def acc_file(local_dir: str, job_id: str) -> str:
    return os.path.join(local_dir, pipeline.ACC_DIR, job_id)


def parse_gpu_ids(text: str) -> list[int]:
    """SLURM_JOB_GPUS ("0,1", "0-3,6" on some setups) -> [0, 1]."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a GPU id list: {text!r}")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


UNNAMED = "?"  # the prolog's record of a job whose device ids Slurm did not put in the Prolog's environment
# one GRES of `scontrol show job -d`'s `GRES=` (npu:2(IDX:0-1), npu:910b:3(IDX:0-1,3), gpu:1(IDX:0))
_GRES_IDX = re.compile(r"([A-Za-z0-9_.-]+)(?::[^:(),=\s]+)*:\d+\(IDX:([0-9,-]*)\)")


def record_ids(text: str) -> list[int] | None:
    """A jobs file's device ids; None for the UNNAMED record. Raises ValueError on anything else."""
    return None if text.strip() == UNNAMED else parse_gpu_ids(text)


def gres_ids_from_detail(text: str, node: str, gres: str) -> list[int] | None:
    """The ids of GRES `gres` that `scontrol show job -d` gives the job on `node` (its `Nodes=... GRES=...`
    lines; nodes with the same allocation share one line, as a host list): [] when the job holds none there,
    None when no line names the node (not allocated there, or not yet)."""
    for line in text.splitlines():
        words = line.split()
        if not words or not words[0].startswith("Nodes="):
            continue
        fields = dict(word.split("=", 1) for word in words if "=" in word)
        try:
            nodes = expand_hostlist(fields["Nodes"])
        except ValueError:
            continue
        if node not in nodes:
            continue
        ids: list[int] = []
        for name, idx in _GRES_IDX.findall(fields.get("GRES", "")):
            if name == gres and idx:
                ids.extend(parse_gpu_ids(idx))
        return sorted(set(ids))
    return None


def _safe_name(text: str, what: str) -> str:
    if not text or "/" in text or text.startswith(".") or "\0" in text:
        raise ValueError(f"unusable {what} {text!r}")
    return text


def node_summary(local_dir: str, job_id: str, node: str, env_gpus: str | None, now: float) -> dict | None:
    """This node's summary of a job from the prolog's record and the sampler's accumulators; None when the job
    had no GPUs here. GPUs the sampler never saw get zero coverage (the accountant then charges eta = 1)."""
    record = job_file(local_dir, job_id)
    gpu_ids: list[int] = []
    start = None
    unnamed = False
    data = safeio.read_small(record, limit=4096)
    if data is not None:
        try:
            ids = record_ids(data.decode("ascii", "replace"))
            start = os.stat(record).st_mtime
            unnamed, gpu_ids = ids is None, ids or []
        except (OSError, ValueError):
            pass
    if not gpu_ids and env_gpus and not unnamed:
        try:
            gpu_ids = parse_gpu_ids(env_gpus)
        except ValueError:
            gpu_ids = []
    if not gpu_ids and not unnamed:
        return None
    try:
        created, records, series = accum.read_with_series(acc_file(local_dir, job_id))
    except accum.AccumulatorError:
        created, records, series = 0.0, [], None
    if unnamed:  # the ids the sampler learned from Slurm are its accumulators' (none: no devices here)
        gpu_ids = [int(r["gpu_id"]) for r in records]
        if not gpu_ids:
            return None
    if start is None:
        start = created or now
    by_id = {int(r["gpu_id"]): r for r in records}
    zero = dict.fromkeys(ACC_FIELDS, 0.0)
    gpus = []
    for gpu in gpu_ids:
        acc = dict(by_id.get(gpu, zero))
        acc["gpu_id"] = float(gpu)
        gpus.append({"id": gpu, "acc": acc})
    out = {
        "v": 1,
        "job": job_id,
        "node": node,
        "start": start,
        "end": now,
        "gpus": gpus,
        "sampled": bool(records),
    }
    if series is not None:
        out["series"] = series
    job_perf = perf.node_perf(local_dir, job_id)  # network, storage, CPU, GPU links: usage/perf.py
    if job_perf is not None:
        out["perf"] = job_perf
    return out


def write_node_summary(spool_dir: str, summary: dict) -> str:
    job_dir = os.path.join(spool_dir, _safe_name(summary["job"], "job id"))
    try:
        os.mkdir(job_dir)
        os.chmod(job_dir, SPOOL_DIR_MODE)
    except FileExistsError:
        pass
    name = _safe_name(summary["node"], "node name") + NODE_SUFFIX
    final = os.path.join(job_dir, name)
    safeio.write_atomic(final, json.dumps(summary, separators=(",", ":")), mode=0o644)
    return final


def node_epilog(
    local_dir: str,
    spool_dir: str,
    job_id: str,
    node: str,
    env_gpus: str | None,
    now: float | None = None,
    environ=None,
) -> str:
    """The node epilog: summarize (with what the job left in its directory, usage/jobfiles.py, when
    `environ` is the epilog's), drop into the spool, forget the job locally. Returns what it did."""
    from . import jobfiles

    _safe_name(job_id, "job id")
    now = time.time() if now is None else now
    summary = node_summary(local_dir, job_id, node, env_gpus, now)
    outcome = "no GPUs on this node"
    notes: list[str] = []
    if environ is not None:
        if summary is not None:
            extra, notes = jobfiles.node_part(local_dir, job_id, node, environ, now)
            summary.update(extra)
        jobfiles.remove_job_dir(local_dir, job_id)
    if summary is not None:
        path = write_node_summary(spool_dir, summary)
        outcome = f"wrote {path}"
    outcome += "".join(f"; {note}" for note in notes[:8])
    for path in (job_file(local_dir, job_id), acc_file(local_dir, job_id)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return outcome


def read_job_dir(job_dir: str) -> tuple[list[dict], dict | None]:
    """(node summaries, stored marker) of one spooled job. Unreadable node files are skipped."""
    summaries = []
    marker = None
    try:
        names = os.listdir(job_dir)
    except FileNotFoundError:
        return [], None
    for name in sorted(names):
        path = os.path.join(job_dir, name)
        if name.endswith(NODE_SUFFIX) and not name.startswith("."):
            doc = _read_json(path)
            if isinstance(doc, dict) and isinstance(doc.get("gpus"), list) and doc.get("node"):
                summaries.append(doc)
        elif name == STORED_MARKER:
            marker = _read_json(path)
    return summaries, marker


def _read_json(path: str):
    """A spooled record, or None when it is missing, not a regular file (never a FIFO's hang, never through
    a symlink), larger than any summary stune writes, or not JSON."""
    data = safeio.read_small(path, limit=RECORD_MAX_BYTES)
    try:
        return None if data is None else json.loads(data)
    except (ValueError, RecursionError):
        return None


def write_marker(job_dir: str, marker: dict) -> None:
    safeio.write_atomic(os.path.join(job_dir, STORED_MARKER), json.dumps(marker), mode=0o644)


def remove_job_dir(job_dir: str) -> None:
    shutil.rmtree(job_dir, ignore_errors=True)
