"""The opt-in idle-GPU policy (`stune-fairshare idle-policy`), run on each GPU node by a timer.

Per running job on this node whose partition profile has `idle_policy.enabled`: the GPU utilization over a
sliding window ending now, from the sampler's bounded series (accum.py), judged against the profile's
threshold. Not the job's average (Princeton's Job Defense Shield judges the average, so a job that was busy
for its first hour escapes for hours): the last `warn_after` below the threshold warns, the last
`cancel_after` below it cancels.

- Warn (once per job): a line in the job's stderr file, written as the job's user (never as root: a user
  can point that path at a FIFO, a symlink or a hard link to a root file), and the job's Comment, so
  `squeue -o %k` shows it.
- Cancel: a last line in the stderr file, the reason in the job's Comment (the record `scontrol show job`,
  and sacct with AccountingStoreFlags=job_comment, keep), then scancel.
- Never: interactive jobs (BatchFlag=0) unless the profile says otherwise, exempt QOS and accounts, and any
  job whose window is not covered by samples (sampler down, NVML cannot measure the GPU: MIG,
  NOT_SUPPORTED): missing is not idle.
- --dry-run lists what it would do; every action (and every skip) is logged, one line each.

A multi-node job is judged by its GPUs on this node: a node whose GPUs sit idle in a multi-node job is the
same waste.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from ..durations import compact
from ..errors import ConfigError
from ..hostlist import expand_hostlist
from ..output import json_text
from ..safeio import write_atomic
from ..usage import accum, spool

WARNED_DIR = "policy"


@dataclass
class Decision:
    job_id: str
    user: str
    account: str
    partition: str
    action: str  # warn, cancel, ok, skip
    why: str
    util: float | None = None
    window_s: float = 0.0
    done: bool = False  # the action was carried out (False in a dry run)
    stderr: str = ""  # the job's stderr file (scontrol's StdErr)
    uid: str = ""  # scontrol's UserId, e.g. alice(1001)


def window_util(series: dict, gpus: int, now: float, window_s: float) -> tuple[float | None, float]:
    """(mean utilization % over [now - window_s, now], sampled share of that window x GPUs). Buckets that
    overlap the window's edge count by their overlap."""
    if not series or window_s <= 0 or gpus <= 0:
        return None, 0.0
    t0, width = series["t0"], series["width"]
    lo = now - window_s
    sm_total = dt_total = 0.0
    for b, (sm, dt) in enumerate(zip(series["sm"], series["dt"])):
        if dt <= 0:
            continue
        start, end = t0 + b * width, t0 + (b + 1) * width
        seen_until = min(end, now)  # the newest bucket is still filling: its samples cover start..now
        overlap = seen_until - max(start, lo)
        if overlap <= 0 or seen_until <= start:
            continue
        share = min(1.0, overlap / (seen_until - start))
        sm_total += sm * share
        dt_total += dt * share
    coverage = dt_total / (window_s * gpus)
    return (100.0 * sm_total / dt_total if dt_total > 0 else None), coverage


def _policy_of(profiles: dict, partition: str):
    profile = profiles.get(partition.split(",", 1)[0])
    if profile is None:
        return None, None
    policy = profile.idle_policy
    if policy.enabled and policy.cancel_after <= policy.warn_after:
        raise ConfigError(
            profile.origin("idle_policy.cancel_after"),
            None,
            "idle_policy.cancel_after",
            f"{policy.cancel_after:g}s is not after warn_after ({policy.warn_after:g}s)",
        )
    return profile, policy


def evaluate(slurm, profiles: dict, local_dir: str, node: str, now: float | None = None) -> list[Decision]:
    """What the policy would do for every running GPU job on this node (nothing is changed). The jobs are the
    sampler's accumulator files here; one `scontrol show job` per job (a node runs a handful), and none at all
    when no partition enables the policy: thousands of nodes must not each list the whole queue."""
    now = time.time() if now is None else now
    if not any(p.idle_policy.enabled for p in profiles.values()):
        return []
    acc_dir = os.path.join(local_dir, "acc")
    try:
        names = sorted((n for n in os.listdir(acc_dir) if n.isdigit()), key=int)
    except FileNotFoundError:
        return []
    out = []
    for job_id in names:
        record = slurm.job_record(job_id)
        if record.get("JobState") != "RUNNING" or node not in expand_hostlist(record.get("NodeList", "")):
            continue  # finished (its epilog has not removed the file yet), or not here
        partition = record.get("Partition", "")
        _, policy = _policy_of(profiles, partition)
        if policy is None or not policy.enabled:
            continue  # off for this partition: not even listed
        user = record.get("UserId", "").partition("(")[0]
        d = Decision(
            job_id,
            user,
            record.get("Account", ""),
            partition,
            "ok",
            "",
            stderr=record.get("StdErr", ""),
            uid=record.get("UserId", ""),
        )
        qos = record.get("QOS", "")
        if policy.exempt_interactive and record.get("BatchFlag") == "0":
            d.action, d.why = "skip", "interactive job (exempt)"
        elif qos in policy.exempt_qos:
            d.action, d.why = "skip", f"QOS {qos} is exempt"
        elif d.account in policy.exempt_accounts:
            d.action, d.why = "skip", f"account {d.account} is exempt"
        else:
            _judge(d, spool.acc_file(local_dir, job_id), policy, now)
        out.append(d)
    return out


def _judge(d: Decision, path: str, policy, now: float) -> None:
    try:
        created, gpus, series = accum.read_with_series(path)
    except (OSError, accum.AccumulatorError) as exc:
        d.action, d.why = "skip", f"accumulators unreadable ({exc}): not judged"
        return
    if series is None:
        d.action, d.why = "skip", "no utilization series (an older sampler): not judged"
        return
    last = max((g["last_ts"] for g in gpus), default=0.0)
    if last < now - 3 * 60:
        d.action, d.why = "skip", "no recent samples (sampler down?): not judged"
        return
    for action, window in (("cancel", policy.cancel_after), ("warn", policy.warn_after)):
        if now - created < window:
            continue
        util, coverage = window_util(series, len(gpus), last, window)
        d.util, d.window_s = util, window
        if util is None or coverage < policy.min_coverage:
            d.action = "skip"
            d.why = (
                f"only {100 * coverage:.0f}% of the last {compact(window)} was measured (unmeasurable GPU or "
                "sampler gaps): not judged"
            )
            return
        if util < policy.threshold:
            d.action = action
            d.why = f"GPU utilization {util:.1f}% < {policy.threshold:g}% over the last {compact(window)}"
            return
    if d.util is not None:
        d.why = f"GPU utilization {d.util:.1f}% over the last {compact(d.window_s)}"
    else:
        d.why = "younger than the warning window"


def act(slurm, decisions: list[Decision], profiles: dict, local_dir: str, *, dry_run: bool, log) -> None:
    """Carry out warn/cancel decisions (each once), logging every decision."""
    state_dir = os.path.join(local_dir, WARNED_DIR)
    for d in decisions:
        marker = os.path.join(state_dir, d.job_id)
        if d.action == "warn" and os.path.exists(marker):
            d.action, d.why = "ok", d.why + " (already warned)"
        if d.action in ("warn", "cancel") and not dry_run:
            _, policy = _policy_of(profiles, d.partition)
            if d.action == "warn":
                message = (
                    f"stune: this job's GPUs have been idle ({d.why}); it will be cancelled once they stay "
                    f"idle for {compact(policy.cancel_after)}"
                )
                _write_as_owner(d.stderr, d.uid, message, log)
                slurm.set_job_comment(d.job_id, f"stune: idle GPUs warned: {d.why}")
                os.makedirs(state_dir, exist_ok=True)
                write_atomic(marker, f"{int(time.time())}\n")
            else:
                reason = f"stune: cancelled for idle GPUs: {d.why}"
                _write_as_owner(d.stderr, d.uid, reason, log)
                slurm.set_job_comment(d.job_id, reason)
                slurm.cancel(int(d.job_id))
            d.done = True
        verb = {"warn": "warned", "cancel": "cancelled"}.get(d.action, d.action)
        if dry_run and d.action in ("warn", "cancel"):
            verb = f"would {d.action}"
        log(f"job {d.job_id} ({d.user}/{d.account}, {d.partition}): {verb}: {d.why}")


# The child that appends to the job's stderr file, run as the job's user (-I -S: argv[3] puts stune's own
# package first): safeio.open_append, with no creation, no symlink, no FIFO, only a regular file.
_APPEND = r"""
import os, sys
sys.path.insert(0, sys.argv[3])
from slurm_tune.safeio import UnsafePathError, open_append
try:
    fd = open_append(sys.argv[1], create_mode=None, single_link=False)
except OSError as exc:
    sys.exit(f"cannot open: {exc.strerror}")
except UnsafePathError as exc:
    sys.exit(f"cannot open: {exc.problem}")
try:
    os.write(fd, (sys.argv[2] + "\n").encode("utf-8", "replace"))
finally:
    os.close(fd)
"""


def _write_as_owner(path: str, user_id: str, message: str, log) -> bool:
    """Append `message` to the job's stderr file with the job owner's uid and gids (UserId=alice(1001))."""
    if not path or path in ("(null)", "/dev/null"):
        return False
    uid_text = user_id.rpartition("(")[2].rstrip(")")
    if not uid_text.isdigit():
        log(f"  stderr of the job not written: unknown owner {user_id!r}")
        return False

    uid = int(uid_text)
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        log(f"  stderr of the job not written: no passwd entry for uid {uid}")
        return False
    kwargs: dict = {}
    if os.getuid() != uid:
        kwargs = {
            "user": uid,
            "group": entry.pw_gid,
            "extra_groups": os.getgrouplist(entry.pw_name, entry.pw_gid),
        }
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _APPEND, path, message, _PACKAGE_PARENT],
            capture_output=True,
            text=True,
            timeout=10,
            cwd="/",
            **kwargs,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"  stderr of the job not written: {exc}")
        return False
    if proc.returncode != 0:
        log(f"  {path} not written: {proc.stderr.strip() or proc.returncode}")
        return False
    return True


_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def to_json(decisions: list[Decision]) -> str:
    return json_text([asdict(d) for d in decisions])
