"""A sweep's checks as Slurm jobs: the pairs a pair check runs on, each job's sbatch arguments and the spec
its agent (agent.py) runs, submitting them, waiting until they are gone (cancelling those still there at the
timeout), and reading the agents' results back from the jobs' output files in the spool. A job that left
none gives one unknown result per planned run. The sweep (sweep.py) decides which nodes and checks.
"""

from __future__ import annotations

import json
import os
import shlex
import time

from .. import safeio
from ..accelspec import gres_name
from ..output import compact_json
from . import store
from .agent import MARK, targets
from .checks import NODE, configured

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

POLL_S = 1.0
RUN_SLACK_S = 10  # per run: starting the tool, srun steps
TCP_PORT_BASE = 18515


def plan_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Neighbours in sorted order: (n0,n1), (n2,n3)... and, for an odd count, the last with the first (that
    pair runs after the first one: a node is in one job at a time). Partners are the same every sweep, so a
    pair's k-of-n compares like with like; a slow pair is resolved by bisection against other partners."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 1:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def job_args(
    partition: str,
    nodes: list[str],
    time_limit_s: float,
    job_name: str,
    spool: str,
    *,
    nice: int,
    qos: str | None = None,
    reservation: str | None = None,
    gres: str | None = None,
) -> list[str]:
    """sbatch arguments of a job that must never push user work aside (the sweep's checks, stune-validate's
    layers): the whole node, far below every user job (`nice`, optionally a scavenger QOS), its own time
    limit, no requeue, and a deadline so Slurm drops it rather than let it wait; output to `spool/<job>.out`."""
    limit_min = max(1, -(-int(time_limit_s) // 60))
    args = [
        "--partition",
        partition,
        "--nodelist",
        ",".join(nodes),
        "--nodes",
        str(len(nodes)),
        "--exclusive",
        f"--time={limit_min}",
        f"--nice={nice}",
        "--no-requeue",
        "--job-name",
        job_name,
        "--output",
        os.path.join(spool, "%j.out"),
        "--open-mode=truncate",
        f"--deadline=now+{limit_min + 60}minutes",
    ]
    if gres:
        args.append(f"--gres={gres}")
    if reservation:
        args += ["--reservation", reservation]
    if qos:
        args += ["--qos", qos]
    return args


def partition_gres(profile: Profile) -> str | None:
    """All of the partition's devices (gpu:N, or npu:N on Ascend), or None where it has none."""
    return f"{gres_name(profile)}:{profile.gpu.count}" if profile.gpu.count else None


def job_script(argv: list[str]) -> str:
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(x) for x in argv) + "\n"


def sbatch_args(profile: Profile, opts, check, time_limit: float, nodes, job_name) -> list[str]:
    """A sweep job's sbatch arguments (the checks', and the scaling curve's: scaling.py)."""
    a = profile.active
    return job_args(
        opts.partition,
        nodes,
        time_limit,
        job_name,
        opts.spool,
        nice=a.nice,
        qos=a.qos,
        reservation=opts.reservation or a.reservation,
        gres=partition_gres(profile) if check.gpus else None,
    )


def job_spec(
    profile: Profile, opts, check, settings, subject, nodes, sweep_id, addrs, hcas=None, port_index=0
) -> dict:
    a = profile.active
    runs = opts.runs or a.runs
    run_timeout = max(5.0, settings.time_limit / (runs * max(1, len(hcas or ()))) - RUN_SLACK_S)
    return {
        "check": check.name,
        "subject": subject,
        "nodes": nodes,
        "runs": runs,
        "run_timeout": run_timeout,
        "command": settings.command,
        "tools": a.tools.to_dict(),
        "gpus": profile.gpu.count or 1,
        "path": a.disk_path or profile.cache.path,
        "size": a.disk_size,
        "sweep": sweep_id,
        "partition": opts.partition,
        "accelerator": profile.accelerator,  # the agent's fingerprint reads this vendor's versions
        "hcas": hcas or [],
        "server_addr": addrs.get(nodes[0], nodes[0]),
        "tcp_port": TCP_PORT_BASE + port_index % 1000,
    }


def submit_all(
    slurm, profile: Profile, opts, sweep_id: str, nodes: list[str], pairs=None, only=None
) -> list[tuple]:
    """Submit the checks; [(job_id, spec)]. `pairs` overrides the pair plan (bisection); `only` limits checks."""
    if not opts.dry_run:
        os.makedirs(opts.spool, mode=0o755, exist_ok=True)
    addrs = slurm.node_addresses()
    jobs = []
    for check, settings in configured(profile):
        if (opts.checks and check.name not in opts.checks) or (only and check.name not in only):
            continue
        if check.kind == NODE:
            targets: list[tuple[list[str], str, list[str] | None]] = (
                [([n], n, None) for n in nodes] if pairs is None else []
            )
        else:
            plan = pairs if pairs is not None else plan_pairs(nodes)
            hcas = (
                [f"{h.device}:{h.port}" for h in profile.fabric.hcas] if check.name == "ib_write_bw" else None
            )
            targets = [([a, b], f"{a}+{b}", hcas) for a, b in plan]  # one job per pair, its HCAs in turn
        for i, (members, subject, hcas) in enumerate(targets):
            spec = job_spec(profile, opts, check, settings, subject, members, sweep_id, addrs, hcas, i)
            args = sbatch_args(
                profile, opts, check, settings.time_limit, members, f"stune-active:{check.name}"
            )
            script = agent_script(opts.agent, spec)
            if opts.dry_run:
                jobs.append((None, spec, args))
                continue
            jobs.append((slurm.submit(args, script=script), spec, args))
    return jobs


def agent_script(agent: list[str], spec: dict) -> str:
    """A sweep job's batch script: the agent (`stune-sweep agent`) with its spec."""
    return job_script([*agent, "--spec", compact_json(spec)])


def wait_jobs(slurm, job_ids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of the jobs is pending or running; the ones still there at the timeout are cancelled
    and returned."""
    deadline = time.monotonic() + timeout_s
    left = list(job_ids)
    while left:
        alive = {
            j.job_id
            for j in slurm.jobs(job_ids=left)
            if j.state.upper() in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
        }
        left = [j for j in left if j in alive]
        if not left:
            break
        if time.monotonic() > deadline:
            slurm.cancel(left)
            return left
        time.sleep(POLL_S)
    return []


def read_marked(spool: str, job_id: int, mark: str) -> list[dict]:
    """The JSON objects a job's agent printed after `mark` (one a line) in its output file; a line that does
    not parse is skipped, and a missing or unsafe file gives none."""
    try:
        fd = safeio.open_file(os.path.join(spool, f"{job_id}.out"))
        try:
            data = safeio.read_bounded(fd, 16 << 20) or b""
        finally:
            os.close(fd)
    except (OSError, safeio.UnsafePathError):
        return []
    out = []
    for line in data.split(b"\n"):
        if line.startswith(mark.encode()):
            try:
                r = json.loads(line[len(mark) :])
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(r, dict):
                out.append(r)
    return out


def collect(spool: str, job_ids: list[int], specs: dict) -> list[dict]:
    """The agents' result lines from the jobs' output files. A job that left none (cancelled, failed to
    start, killed at its time limit) gives one unknown result per planned run."""
    out = []
    for job_id in job_ids:
        spec = specs[job_id]
        expected = {subject for subject, _ in targets(spec)}
        found = [
            r for r in read_marks(spool, job_id) if r["check"] == spec["check"] and r["subject"] in expected
        ]
        seen = {r["subject"] for r in found}
        for subject, hca in targets(spec):
            if subject not in seen:
                found.append(
                    {
                        "at": round(time.time(), 3),
                        "sweep": spec["sweep"],
                        "partition": spec["partition"],
                        "check": spec["check"],
                        "subject": subject,
                        "nodes": spec["nodes"],
                        "hca": hca,
                        "run": 0,
                        "status": "unknown",
                        "value": None,
                        "unit": "",
                        "job": str(job_id),
                        "detail": "the job left no result (cancelled, not started in time, or killed at "
                        "its limit)",
                        "fingerprint": {},
                    }
                )
        out.extend(found[: max(1, spec["runs"]) * len(expected)])
    return out


def read_marks(spool: str, job_id: int) -> list[dict]:
    """The sweep agent's results (store.valid ones) in a job's output file, each with its job id."""
    out = [r for r in read_marked(spool, job_id, MARK) if store.valid(r)]
    for r in out:
        r["job"] = str(job_id)
    return out


def run_jobs(slurm, profile: Profile, opts, sweep_id, nodes, pairs=None, only=None) -> list[dict]:
    jobs = submit_all(slurm, profile, opts, sweep_id, nodes, pairs, only)
    if opts.dry_run or not jobs:
        return []
    specs = {j: spec for j, spec, _ in jobs}
    limit = max(s.time_limit for _, s in configured(profile))
    wait_jobs(slurm, list(specs), opts.wait_s if opts.wait_s is not None else limit * len(jobs) + 120)
    return collect(opts.spool, list(specs), specs)
