"""The controller side: merge a job's node summaries and store the result in AdminComment.

`store_job` runs as EpilogSlurmctld. slurmctld starts it at job completion, *concurrently* with the node
epilogs (measured on 22.05: it starts ~2 ms before them), so it waits, bounded, for every node of the job.
A job whose spool directory never appears is asked about once in slurmdbd (sacct, not slurmctld): no GPUs
means nothing to store. Whatever is late is picked up by `sweep` (`stune-fairshare collect`, run by the
accountant host's timer), which re-stores a job when more nodes have reported and removes finished
directories.

Partial means partial: the job's expected node list is written to its spool directory (the `stored`
marker) before the first attempt to store it, so a store that fails (slurmdbd down) leaves `sweep` knowing
which nodes make the job complete. A directory without that list (no EpilogSlurmctld ran) gets it from
slurmdbd (sacct NodeList) before anything is stored: a node that never reports is never counted as the
job's last one (`nodes=k/k`).
"""

from __future__ import annotations

import os
import time

from ..errors import SlurmError
from ..hostlist import expand_hostlist
from ..slurm.tres import accel_count
from . import jobfiles, spool, summary, whyslow


def job_gpus(slurm, job_id: str) -> float:
    rows = slurm.sacct(["JobIDRaw", "AllocTRES"], job_ids=[job_id])
    for row in rows:
        if row["JobIDRaw"] == str(job_id):
            return accel_count(row["AllocTRES"])  # GPUs or Ascend NPUs
    return -1.0  # not in the database (yet)


def job_nodes(slurm, job_id: str) -> list[str] | None:
    """The nodes a job ran on, as slurmdbd recorded them; None when it does not know the job (yet)."""
    for row in slurm.sacct(["JobIDRaw", "NodeList"], job_ids=[job_id]):
        if row["JobIDRaw"] == str(job_id):
            nodes = row["NodeList"].strip()
            return expand_hostlist(nodes) if nodes and nodes != "None assigned" else None
    return None


def _expected(marker) -> list[str] | None:
    """The node list a marker recorded, when it is one (a list of names)."""
    expected = (marker or {}).get("expected") if isinstance(marker, dict) else None
    if isinstance(expected, list) and expected and all(isinstance(n, str) and n for n in expected):
        return expected
    return None


def _store(
    slurm, job_id: str, summaries: list[dict], expected: list[str] | None, partition: str = ""
) -> summary.JobSummary:
    merged = summary.merge(summaries, len(expected) if expected else None)
    extra = jobfiles.job_tokens(summaries)
    line = summary.encode(merged) + (f" {extra}" if extra else "")
    # the verdict as stored, for the reports' counts; stune-job judges the record again when asked
    line += f" {whyslow.BOUND_KEY}={whyslow.bound_of(line, partition)}"
    slurm.set_admin_comment(job_id, line)
    return merged


def store_job(
    slurm,
    spool_dir: str,
    job_id: str,
    nodes_expr: str | None,
    wait_s: float = 30.0,
    poll_s: float = 0.2,
    partition: str = "",
) -> str:
    """EpilogSlurmctld: wait for the job's node summaries, merge, write AdminComment. Returns what it did.
    `partition` (SLURM_JOB_PARTITION there) finds the nodes' fio baselines for the stored verdict."""
    job_dir = os.path.join(spool_dir, job_id)
    expected = expand_hostlist(nodes_expr) if nodes_expr else None
    deadline = time.monotonic() + wait_s
    checked_gpus = False
    while True:
        summaries, _ = spool.read_job_dir(job_dir)
        present = {s["node"] for s in summaries}
        if expected is not None and present >= set(expected):
            break
        if not summaries and not checked_gpus and os.path.isdir(spool_dir):
            checked_gpus = True
            try:
                if job_gpus(slurm, job_id) == 0:
                    return "no GPUs: nothing to store"
            except SlurmError:
                pass  # the database is busy: keep waiting for node files
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if not summaries:
        if os.path.isdir(job_dir) or expected:
            _remember(job_dir, [], expected)
        return f"no node summary within {wait_s:g}s; `stune-fairshare collect` will store it when it arrives"
    if expected is not None:
        # before the first store attempt, which fails while slurmdbd is down: `collect` then knows which nodes
        # make the job complete, stores it whole and removes its directory at once
        _remember(job_dir, [], expected)
    merged = _store(slurm, job_id, summaries, expected, partition)
    if expected is not None and present >= set(expected):
        spool.remove_job_dir(job_dir)
        return f"stored ({merged.nodes_reported}/{merged.nodes_expected} nodes, eta {_eta(merged)})"
    _remember(job_dir, sorted(present), expected)
    return (
        f"stored partial ({merged.nodes_reported}/{merged.nodes_expected} nodes); the rest is left to "
        f"`stune-fairshare collect`"
    )


def _eta(s: summary.JobSummary) -> str:
    return "-" if s.eta is None else f"{s.eta:.2f}, coverage {s.coverage:.2f}"


def _remember(job_dir: str, stored: list[str], expected: list[str] | None) -> None:
    try:
        os.makedirs(job_dir, exist_ok=True)
        spool.write_marker(job_dir, {"stored": stored, "expected": expected, "at": time.time()})
    except OSError:
        pass


def sweep(
    slurm, spool_dir: str, min_age_s: float = 60.0, max_age_s: float = 86400.0, now: float | None = None
):
    """Store jobs whose node summaries changed since the last store; drop finished or expired directories.
    Yields (job id, outcome)."""
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(spool_dir))
    except FileNotFoundError:
        return
    for name in names:
        if not name.isdigit():
            continue
        job_dir = os.path.join(spool_dir, name)
        try:
            age = now - os.stat(job_dir).st_mtime
        except OSError:
            continue
        if age < min_age_s:
            continue
        summaries, marker = spool.read_job_dir(job_dir)
        expected = _expected(marker)
        present = sorted({s["node"] for s in summaries})
        expired = age > max_age_s
        if not summaries:
            if expired:
                spool.remove_job_dir(job_dir)
                yield name, "expired without any node summary; removed"
            continue
        if expected is None:  # no EpilogSlurmctld said which nodes the job ran on: slurmdbd knows
            try:
                expected = job_nodes(slurm, name)
            except SlurmError as exc:
                yield name, f"not stored: its node list is unknown: {exc}"
                continue
            if expected is None:
                if expired:
                    spool.remove_job_dir(job_dir)
                    yield name, "expired, its node list unknown to slurmdbd; removed"
                continue
            _remember(job_dir, (marker or {}).get("stored") or [], expected)
        complete = set(present) >= set(expected)
        if marker is not None and marker.get("stored") == present and not complete:
            if expired:
                spool.remove_job_dir(job_dir)
                yield name, f"expired with {len(present)} node(s) stored; removed"
            continue
        try:
            merged = _store(slurm, name, summaries, expected)
        except SlurmError as exc:
            yield name, f"not stored: {exc}"
            continue
        if complete or expired:
            spool.remove_job_dir(job_dir)
            yield name, f"stored ({merged.nodes_reported}/{merged.nodes_expected} nodes); removed"
        else:
            spool.write_marker(job_dir, {"stored": present, "expected": expected, "at": now})
            yield name, f"stored partial ({len(present)} node(s))"
