"""The `transport` family: a node whose multi-node jobs fall back, again and again, is half-broken.

The node epilog judges the transport NCCL used in each multi-node job on this node (slurm_tune/comm/, from
the job's NCCL log) and records the verdict in the node state (`record`: `comm_jobs`, the latest
COMM_JOBS_KEPT). This family reads that record: `health.comm_degrade_after` fallbacks within
`health.comm_window` (NET/Socket on an RDMA partition, or GPUDirect RDMA missing where the profile expects
it), in the jobs of at least MIN_USERS users, mark the node degraded, with the jobs as evidence, through the
usual path (the periodic run's mark; multi-node jobs then avoid the node). A job that later passes here, or the window passing, clears it. Only
jobs that were judged count: a gloo job or the user's own NCCL_DEBUG says nothing about the node.

On the prolog's path (judge.FAMILIES): only the node state is read, nothing is imported.
"""

from __future__ import annotations

import time

from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

COMM_JOBS_KEPT = 20
# the verdict statuses (comm.verdict) that say this node's fabric path did not work as the profile expects
NODE_FAULTS = {"fallback": "fell back to sockets", "no_gdr": "ran without GPUDirect RDMA"}
# The logs are the users' files: one user's jobs alone (who could write a fallback into their own log) never
# mark a node; fallbacks in the jobs of this many users do.
MIN_USERS = 2
STATUS_MAX = 32  # characters of a status / reason kept per job (the state file is root's, but bounded)
WHY_MAX = 160


def record(state: dict, job_id: str, uid: int, status: str, why: str, now: float) -> None:
    """Add one judged job's verdict on this node to `state` (under the state's lock; the caller saves)."""
    jobs = [j for j in _jobs(state) if j[0] != job_id]
    jobs.append([job_id[:STATUS_MAX], round(now, 3), status[:STATUS_MAX], why[:WHY_MAX], int(uid)])
    state["comm_jobs"] = jobs[-COMM_JOBS_KEPT:]


def _jobs(state: dict) -> list:
    """The recorded jobs that read back as stune writes them (anything else is dropped, never trusted)."""
    jobs = state.get("comm_jobs") if isinstance(state, dict) else None
    return [j for j in (jobs if isinstance(jobs, list) else ()) if _well_formed(j)]


def _well_formed(j) -> bool:
    return (
        isinstance(j, list)
        and len(j) == 5
        and isinstance(j[0], str)
        and type(j[1]) in (int, float)
        and 0 <= j[1] < 1e11
        and isinstance(j[2], str)
        and isinstance(j[3], str)
        and type(j[4]) is int
    )


def faults(previous: dict, profile: Profile, now: float) -> tuple[list, int]:
    """(the jobs within the window that fell back here since the last one that passed, the jobs judged
    within the window)."""
    recent = [j for j in _jobs(previous) if now - j[1] <= profile.health.comm_window]
    found = [j for j in recent if j[2] in NODE_FAULTS]
    last_ok = max((j[1] for j in recent if j[2] == "ok"), default=None)  # the path worked again then
    if last_ok is not None:
        found = [j for j in found if j[1] > last_ok]
    return found, len(recent)


def counts(previous: dict, profile: Profile, now: float) -> dict:
    """For the periodic run's outputs (Prometheus): fallbacks counted toward degrading, and jobs judged."""
    found, judged = faults(previous, profile, now)
    return {"fallbacks": len(found), "judged": judged}


def check(snapshot, profile: Profile, previous: dict, now: float | None = None) -> tuple[list, dict]:
    after = profile.health.comm_degrade_after
    if not after or not _jobs(previous):
        return [], {}
    found, judged = faults(previous, profile, time.time() if now is None else now)
    users = len({j[4] for j in found})
    if len(found) < after or users < MIN_USERS:
        one_user = f" (one user's jobs only: {MIN_USERS} users' are needed)" if len(found) >= after else ""
        message = f"{len(found)} of {judged} judged multi-node jobs fell back{one_user}"
        return [result.ok("transport.fallback", "node", message)], {}
    kinds = sorted({NODE_FAULTS[j[2]] for j in found})
    ids = ", ".join(j[0] for j in found[-5:])
    message = (
        f"NCCL {' and '.join(kinds)} in {len(found)} multi-node jobs here within "
        f"{_days(profile.health.comm_window)} (jobs {ids}; last: {found[-1][3]}); expected at most "
        f"{after - 1}: check the HCA ports, nvidia-peermem and the NCCL net plugin on this node"
    )
    reason = f"NCCL {kinds[0]} in {len(found)} jobs (last {found[-1][0]})"
    return [result.degraded("transport.fallback", "node", message, reason)], {}


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} d" if seconds >= 86400 else f"{seconds / 3600:g} h"
