"""Generated site histories for the lemon and reliability tests: `sacct -P` text in the real format (the
header and row layout of `SLURM_TIME_FORMAT=%s sacct -a -X -D -P --noconvert`, as the dev cluster prints it:
tests/fixtures/reliability/sacct_node_fail_requeue_22.05.8.txt) and the matching `sacctmgr -n -P show event`
lines (tests/fixtures/reliability/sacctmgr_show_event_22.05.8.txt).

The model is the one the lemon test assumes and nothing more: every node-second of a multi-node run carries
one hazard, a planted lemon's `lemon_ratio` times it; a run fails at its first node failure, which that node
caused. How the failure shows: NODE_FAIL (with a node event on the culprit for a share of them) or FAILED with
NCCL errors in the stored transport verdict (the verdicts are the real judge's, of real NCCL logs from
tests/fixtures/comm: errors on the culprit alone for a share of them, else on every node). Besides: user
failures, cancellations and time-outs at random, single-node jobs, requeued runs of a NODE_FAIL (same job
id, a later run), placement in contiguous blocks half the time (so run-mates repeat, as Slurm's topology
placement makes them) and at random otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from slurm_tune import comm
from slurm_tune.hostlist import compress_hostlist
from slurm_tune.reliability.history import FIELDS
from slurm_tune.usage.jobfiles import job_tokens

COMM = Path(__file__).resolve().parent / "fixtures" / "comm"
T0 = 1_790_000_000
HEADER = "|".join(FIELDS)


def _verdict(name: str) -> str:
    expect = comm.Expectation(fabric="ib", gdr=True)
    return comm.judge([comm.parse((COMM / name).read_bytes())], expect).encode()


ERRORS = _verdict("nccl-warn-wcerr5-gdr-nccl1737.txt")
OK = _verdict("nccl-ib-gdr-a100-nccl707.txt")


@dataclass
class Site:
    seed: int = 1
    nodes: int = 64
    days: float = 60.0
    jobs_per_day: float = 40.0
    hazard_per_node_hour: float = 2.5e-3
    lemon: str | None = None
    lemon_ratio: float = 10.0
    nccl_share: float = 0.5  # of infrastructure failures, those that show as NCCL errors (else NODE_FAIL)
    localized: float = 0.5  # of either kind, those whose evidence names the culprit
    event_reason: str = "stune: gpu3 Xid 79"
    partition: str = "hdr"
    prefix: str = "gpu"
    sizes: tuple[int, ...] = (2, 2, 4, 4, 8, 16)
    single_node_share: float = 0.3
    user_fail: float = 0.05
    cancel: float = 0.05
    timeout: float = 0.03
    requeue: float = 0.5  # of NODE_FAIL runs, those requeued (a second run, same id)
    t0: int = T0
    planted: dict = field(default_factory=dict)  # filled: culprit per failed job id, for the tests

    def names(self) -> list[str]:
        return [f"{self.prefix}{i:03d}" for i in range(1, self.nodes + 1)]


def generate(site: Site) -> tuple[str, str]:
    """(sacct text, event text) of the site's history."""
    rng = random.Random(site.seed)
    names = site.names()
    lines, events = [HEADER], []
    jobs = int(site.jobs_per_day * site.days)
    job_id = 1000
    for _ in range(jobs):
        job_id += 1
        start = site.t0 + int(rng.random() * site.days * 86400)
        duration = int(rng.uniform(1, 12) * 3600)
        if rng.random() < site.single_node_share:
            k = 1
        else:
            k = min(rng.choice(site.sizes), site.nodes)
        if rng.random() < 0.5:
            first = rng.randrange(site.nodes - k + 1)
            hosts = names[first : first + k]
        else:
            hosts = sorted(rng.sample(names, k))
        rows = _run(site, rng, job_id, hosts, start, duration, events)
        lines += rows
    return "\n".join(lines) + "\n", "".join(events)


def _run(site: Site, rng: random.Random, job_id: int, hosts: list[str], start: int, duration: int, events):
    """The sacct rows of one job: one run, or a failed run and its requeued run."""
    fail_at, culprit = None, None
    if len(hosts) >= 2:
        for h in hosts:
            rate = site.hazard_per_node_hour / 3600 * (site.lemon_ratio if h == site.lemon else 1.0)
            t = rng.expovariate(rate)
            if t < duration and (fail_at is None or t < fail_at):
                fail_at, culprit = t, h
    if fail_at is not None:
        end = start + max(int(fail_at), 1)
        site.planted[str(job_id)] = culprit
        if rng.random() < site.nccl_share:
            one = rng.random() < site.localized
            summaries = [{"node": h, "comm": ERRORS if (h == culprit or not one) else OK} for h in hosts]
            comment = f"stune1 held=0.0 used=0.0 cov=0.0 busy=0.0 busy_w=- gpus={8 * len(hosts)} " + (
                f"nodes={len(hosts)}/{len(hosts)} per_gpu= {job_tokens(summaries)}"
            )
            return [_row(site, job_id, "FAILED", hosts, start, end, comment)]
        if rng.random() < site.localized:
            events.append(f"{culprit}|{end}|{end + 1800}|DOWN|{site.event_reason}\n")
        rows = [_row(site, job_id, "NODE_FAIL", hosts, start, end)]
        if rng.random() < site.requeue:
            again = end + rng.randrange(60, 3600)
            rows.append(_row(site, job_id, "COMPLETED", hosts, again, again + duration))
        return rows
    end = start + duration
    draw = rng.random()
    if draw < site.user_fail:
        state, end = "FAILED", start + rng.randrange(10, duration)
    elif draw < site.user_fail + site.cancel:
        state, end = "CANCELLED by 1001", start + rng.randrange(10, duration)
    elif draw < site.user_fail + site.cancel + site.timeout:
        state = "TIMEOUT"
    else:
        state = "COMPLETED"
    return [_row(site, job_id, state, hosts, start, end)]


def _row(site: Site, job_id: int, state: str, hosts: list[str], start: int, end: int, comment: str = ""):
    k = len(hosts)
    tres = f"billing={8 * k},cpu={64 * k},gres/gpu={8 * k},mem={512000 * k}M,node={k}"
    return (
        f"{job_id}|{job_id}|user{job_id % 7}|{site.partition}|{state}|{start}|{end}|{end - start}|{k}|"
        f"{tres}|{compress_hostlist(hosts)}|{comment}"
    )
