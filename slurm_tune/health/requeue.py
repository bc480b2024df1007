"""Requeue that avoids the culprit: a multi-node job that failed on a node stune then drains or marks is
requeued once, without that node (issue 25 section 5; docs/health.md has the admin's view).

The rule. apply.sync calls `avoid_culprit` once the node stands under stune's drain (its own, or Slurm's
prolog/epilog drain it took over) or its degraded mark: never under an admin's drain, never when the circuit
breaker held the drain back. Each job is then requeued once, with this node added to its ExcNodeList, that
- ran on this node, on two nodes or more (a single-node job keeps no other node);
- failed: it ended FAILED or NODE_FAIL (one that completed, was cancelled, timed out or ran out of memory did
  not fail because of the node);
- ended no earlier than the node's last healthy verdict (`healthy.at` in its state, any mode: the prolog of
  the job itself counts; at Slurm's one-second resolution). A job that failed before the node was last seen
  healthy failed for another reason.
  A node never seen healthy, or judged by a policy it never passed (the trust rule), requeues nothing;
- ran in a partition whose profile says `recovery.avoid_culprit: true`;
- may be requeued: a batch job with Requeue=1 (--no-requeue, or JobRequeue=0 without --requeue, is Requeue=0);
- and was never requeued by stune before: no `stune: requeued` mark in its Comment (every node's run checks
  it), and not in this node's `requeued` list.
A job still running on the node when stune drains it is left to run; if it then fails, the epilog's failure
there brings the next sync, which finds it.

The forms, by release (the adapter):
- every release, a job Slurm left failed: `scontrol requeue J` (pending again, eligible after Slurm's requeue
  delay), then one `scontrol update JobId=J ExcNodeList=<its list>,<node> Comment=<mark>` (ExcNodeList changes
  only while a job is pending);
- from 25.11.3 (Slurm.expedited_requeue), a job submitted with --requeue=expedite: when an epilog fails or a node
  fails, Slurm requeues it itself, at once, first in the queue and on its held nodes, and stune finds no failed
  job. When it failed while every epilog passed, Slurm holds it (REQUEUE_HOLD, "job requeued in held state");
  if its last run (sacct) ran here and exited non-zero, stune excludes the node and releases it
  (`scontrol update ...`, then `scontrol release J`).

Recorded three times: the job's Comment (`stune: requeued once without n1: <reason>`, after the user's own),
the node's state (`requeued`), and a note in the periodic run's health.log line and JSON. Never raises: a
Slurm error or a bug here is a note, and the drain stands.
"""

from __future__ import annotations

from collections import namedtuple

from ..errors import SlurmError, StuneError

MARK = "stune: requeued"
KEEP = 32  # job records in the node's state
FAILED_STATES = ("FAILED", "NODE_FAIL")
HELD = "REQUEUE_HOLD"
REQUEUE, RELEASE = "requeue", "release"
MARK_MAX = 200


class Run(namedtuple("Run", "job_id partition nodes ended comment form")):
    """One failed run of a job: its nodes (names), when it ended (epoch s), its Comment, and the form that
    would requeue it (REQUEUE: Slurm left it failed; RELEASE: Slurm holds it after an expedited requeue)."""

    __slots__ = ()


def window_start(state: dict) -> float | None:
    """Since when a failed job is blamed on this node: its last healthy verdict, under a policy it passed."""
    healthy, last, trusted = state.get("healthy"), state.get("last"), state.get("trusted")
    at = healthy.get("at") if isinstance(healthy, dict) else None
    policy = last.get("policy") if isinstance(last, dict) else None
    if not isinstance(at, (int, float)) or not isinstance(trusted, list) or policy not in trusted:
        return None
    return float(at)


def done_ids(state: dict) -> set[int]:
    entries = state.get("requeued")
    return {
        e["job"]
        for e in (entries if isinstance(entries, list) else ())
        if isinstance(e, dict) and type(e.get("job")) is int
    }


def judge_run(run: Run, node: str, since: float, opted, done) -> tuple[bool, str]:
    """(whether to look further, why not). (False, '') for a job this node has nothing to do with: it did not
    run here, ended before the window, or its partition did not opt in. Pure."""
    # Slurm's times have 1 s resolution: a job that ended in the second the node was judged healthy counts
    if node not in run.nodes or run.ended < int(since) or run.partition not in opted:
        return False, ""
    if len(run.nodes) < 2:
        return False, f"job {run.job_id} not requeued: a single-node job"
    if run.job_id in done or MARK in run.comment:
        return False, f"job {run.job_id} not requeued: stune requeued it once already"
    return True, ""


def judge_record(run: Run, record: dict) -> str:
    """Why Slurm's own record (`scontrol show job -o`) rules the requeue out, or ''. Pure."""
    if not record:
        return f"job {run.job_id} not requeued: Slurm no longer knows it"
    if record.get("BatchFlag") != "1":
        return f"job {run.job_id} not requeued: not a batch job (Slurm requeues batch jobs only)"
    if record.get("Requeue") != "1":
        return (
            f"job {run.job_id} not requeued: Requeue=0 (the user's --no-requeue, or JobRequeue=0 without "
            "--requeue)"
        )
    state = record.get("JobState", "")
    if run.form == REQUEUE and state not in FAILED_STATES:
        return f"job {run.job_id} not requeued: it is {state} now"
    if run.form == RELEASE and (state != HELD or record.get("ExpeditedRequeue") != "Yes"):
        return f"job {run.job_id} not released: it is {state} now"
    return ""


def exclusion(current: str, node: str) -> str:
    """The job's ExcNodeList with `node` added ('(null)' is none)."""
    from ..hostlist import compress_hostlist, expand_hostlist

    names = [] if current in ("", "(null)") else expand_hostlist(current)
    return compress_hostlist(sorted(set(names) | {node}))


def marked_comment(comment: str, node: str, reason: str) -> str:
    """The user's Comment, kept, then stune's mark."""
    mark = f"{MARK} once without {node}: {reason}"[:MARK_MAX]
    return f"{comment}; {mark}" if comment else mark


def opted_partitions(profiles) -> frozenset[str]:
    return frozenset(name for name, p in profiles.items() if p.recovery.avoid_culprit)


def failed_runs(slurm, expedite: bool) -> list[Run]:
    """The failed runs Slurm still knows: failed jobs, and (expedite) the jobs it holds after an expedited
    requeue, with their last run from sacct (Slurm clears a requeued job's node list)."""
    from ..hostlist import expand_hostlist

    states = [*FAILED_STATES, HELD] if expedite else list(FAILED_STATES)
    runs, held = [], {}
    for job in slurm.jobs(states=states):
        if job.state in FAILED_STATES and job.nodes:
            runs.append(
                Run(job.job_id, job.partition, expand_hostlist(job.nodes), job.end_time, job.comment, REQUEUE)
            )
        elif job.state == "PENDING" and HELD in job.flags:
            held[job.job_id] = job
    if held:
        rows = slurm.sacct(
            ["JobIDRaw", "State", "NodeList", "End", "ExitCode"],
            job_ids=[str(j) for j in sorted(held)],
            extra=["-D"],
        )
        last: dict[int, dict] = {}
        for row in rows:  # runs in order: the last REQUEUED one is the run Slurm held it after
            if row["State"] == "REQUEUED" and row["JobIDRaw"].isdigit() and row["End"].isdigit():
                last[int(row["JobIDRaw"])] = row
        for job_id, row in last.items():
            if job_id in held and not row["ExitCode"].startswith("0:"):  # the run failed (not a requeuehold)
                job = held[job_id]
                nodes = expand_hostlist(row["NodeList"])
                runs.append(Run(job_id, job.partition, nodes, int(row["End"]), job.comment, RELEASE))
    return runs


def act(slurm, run: Run, record: dict, node: str, reason: str) -> str:
    """Requeue (or release) `run`'s job without `node`; returns the note. Raises SlurmError when Slurm refused
    the requeue itself (nothing was done)."""
    exclude = exclusion(record.get("ExcNodeList", ""), node)
    comment = marked_comment(run.comment, node, reason)
    if run.form == RELEASE:
        slurm.update_job(run.job_id, exclude_nodes=exclude, comment=comment)
        slurm.release(run.job_id)
        return f"released job {run.job_id} without {node} (Slurm held it after its expedited requeue)"
    slurm.requeue(run.job_id)
    note = f"requeued job {run.job_id} without {node} (it failed on {','.join(run.nodes)})"
    try:
        slurm.update_job(run.job_id, exclude_nodes=exclude, comment=comment)
    except SlurmError as exc:  # requeued all the same: drained, the node takes no new job anyway
        note += f"; its ExcNodeList/Comment could not be set: {exc}"
    return note


def avoid_culprit(slurm, node: str, reason: str, state: dict, now: float, profiles=None) -> list[str]:
    """The rule above for `node`, now under stune's drain or mark for `reason`. Records what it did in
    `state['requeued']`; returns notes for the run's log line. Never raises."""
    try:
        return _avoid(slurm, node, reason, state, now, profiles)
    except (SlurmError, StuneError) as exc:
        return [f"requeue: not looked at: {exc}"]
    except Exception as exc:  # a bug here must never undo the drain or fail the run
        return [f"requeue: internal error, nothing requeued: {type(exc).__name__}: {exc}"]


def _avoid(slurm, node: str, reason: str, state: dict, now: float, profiles) -> list[str]:
    if profiles is None:
        from ..profilestore import load_profiles

        profiles = load_profiles()
    opted = opted_partitions(profiles)
    if not opted:
        return []  # nobody opted in: no Slurm call
    since = window_start(state)
    if since is None:
        return [f"requeue: {node} was never seen healthy under this policy: no job requeued"]
    done = done_ids(state)
    notes = []
    for run in failed_runs(slurm, slurm.expedited_requeue()):
        look, why = judge_run(run, node, since, opted, done)
        if not look:
            notes += [why] if why else []
            continue
        record = slurm.job_record(run.job_id)
        why = judge_record(run, record)
        if why:
            notes.append(why)
            continue
        try:
            notes.append(act(slurm, run, record, node, reason))
        except SlurmError as exc:
            notes.append(f"job {run.job_id} not requeued: {exc}")
            continue
        entry = {"job": run.job_id, "at": round(now, 3), "node": node, "form": run.form}
        kept = state.get("requeued")
        state["requeued"] = [entry, *(kept if isinstance(kept, list) else [])][:KEEP]
        done.add(run.job_id)
    return notes
