"""A sweep: the partition's active checks as ordinary Slurm jobs on its idle nodes, then judging and marking.

Jobs never push user work aside: they go only to nodes that are idle when the sweep starts (or to the nodes
of the maintenance reservation the admin names), at `--nice` below every user job (optionally a scavenger
QOS), with the check's time limit, `--no-requeue`, and a `--deadline` so a job that could not start in time
is dropped by Slurm instead of waiting. So a user job is delayed at most by one check's time limit.

Marking goes through the health hooks' path (slurm_tune.health.apply): an outlier gets the `stune_degraded`
feature and a comment `stune: degraded: active <check>: ...` (or, if the partition opted in, a drain with the
circuit breaker); a node whose latest sweep passes loses stune's active mark. Marks set by the passive checks
(a comment without the `active ` tag) are left to them.
"""

from __future__ import annotations

import os
import shlex
import sys
import time

from .. import fastjson
from ..errors import StuneError
from ..health import apply
from ..hostlist import expand_hostlist
from ..nodestate import ACTIVE_COMMENT, ACTIVE_DRAIN, REASON_PREFIX
from . import judge, store
from .agent import MARK, targets
from .checks import NODE, configured

POLL_S = 1.0
RUN_SLACK_S = 10  # per run: starting the tool, srun steps
TCP_PORT_BASE = 18515


class Options:
    def __init__(
        self,
        partition,
        store,
        spool=None,
        reservation=None,
        checks=None,
        nodes=None,
        runs=None,
        dry_run=False,
        wait_s=None,
        agent=None,
    ):
        self.partition, self.store, self.reservation = partition, store, reservation
        self.spool = spool or os.path.join(store, "spool")
        self.checks, self.nodes, self.runs, self.dry_run, self.wait_s = checks, nodes, runs, dry_run, wait_s
        self.agent = agent or [sys.executable, "-m", "slurm_tune.cli.sweep", "agent"]


def reservation_nodes(slurm, name: str) -> list[str]:
    record = slurm.reservation(name)
    if not record:
        raise StuneError(f"reservation {name!r} not found")
    return expand_hostlist(record.get("Nodes", ""))


def idle_nodes(slurm, partition: str, reservation: str | None, wanted: list[str] | None) -> list[str]:
    nodes = [n for n in slurm.nodes() if partition in n.partitions]
    allowed = set(reservation_nodes(slurm, reservation)) if reservation else None
    out = []
    for n in nodes:
        if wanted and n.name not in wanted:
            continue
        if allowed is not None and n.name not in allowed:
            continue
        if n.drain:
            continue  # drained: Slurm starts no job there (stune-sweep's own drains are re-checked apart)
        if n.state != "idle" and not (reservation and n.state in ("idle", "reserved")):
            continue
        out.append(n.name)
    return sorted(out)


def plan_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Neighbours in sorted order: (n0,n1), (n2,n3)... and, for an odd count, the last with the first (that
    pair runs after the first one: a node is in one job at a time). Partners are the same every sweep, so a
    pair's k-of-n compares like with like; a slow pair is resolved by bisection against other partners."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 1:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def _sbatch_args(profile, opts, check, settings, nodes, job_name) -> list[str]:
    a = profile.active
    limit_min = max(1, -(-int(settings.time_limit) // 60))
    args = [
        "--partition",
        opts.partition,
        "--nodelist",
        ",".join(nodes),
        "--nodes",
        str(len(nodes)),
        "--exclusive",
        f"--time={limit_min}",
        f"--nice={a.nice}",
        "--no-requeue",
        "--job-name",
        job_name,
        "--output",
        os.path.join(opts.spool, "%j.out"),
        "--open-mode=truncate",
        f"--deadline=now+{limit_min + 60}minutes",
    ]
    if check.gpus and profile.gpu.count:
        args.append(f"--gres=gpu:{profile.gpu.count}")
    reservation = opts.reservation or a.reservation
    if reservation:
        args += ["--reservation", reservation]
    if a.qos:
        args += ["--qos", a.qos]
    return args


def _spec(profile, opts, check, settings, subject, nodes, sweep_id, addrs, hcas=None, port_index=0) -> dict:
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
        "hcas": hcas or [],
        "server_addr": addrs.get(nodes[0], nodes[0]),
        "tcp_port": TCP_PORT_BASE + port_index % 1000,
    }


def submit_all(slurm, profile, opts, sweep_id: str, nodes: list[str], pairs=None, only=None) -> list[tuple]:
    """Submit the checks; [(job_id, spec)]. `pairs` overrides the pair plan (bisection); `only` limits checks."""
    if not opts.dry_run:
        os.makedirs(opts.spool, mode=0o755, exist_ok=True)
    addrs = slurm.node_addresses()
    jobs = []
    for check, settings in configured(profile):
        if (opts.checks and check.name not in opts.checks) or (only and check.name not in only):
            continue
        if check.kind == NODE:
            targets = [([n], n, None) for n in nodes] if pairs is None else []
        else:
            plan = pairs if pairs is not None else plan_pairs(nodes)
            hcas = (
                [f"{h.device}:{h.port}" for h in profile.fabric.hcas] if check.name == "ib_write_bw" else None
            )
            targets = [([a, b], f"{a}+{b}", hcas) for a, b in plan]  # one job per pair, its HCAs in turn
        for i, (members, subject, hcas) in enumerate(targets):
            spec = _spec(profile, opts, check, settings, subject, members, sweep_id, addrs, hcas, i)
            args = _sbatch_args(profile, opts, check, settings, members, f"stune-active:{check.name}")
            script = (
                "#!/bin/sh\nexec "
                + " ".join(shlex.quote(x) for x in opts.agent + ["--spec", fastjson.dumps(spec)])
                + "\n"
            )
            if opts.dry_run:
                jobs.append((None, spec, args))
                continue
            jobs.append((slurm.submit(args, script=script), spec, args))
    return jobs


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


def collect(spool: str, job_ids: list[int], specs: dict) -> list[dict]:
    """The agents' result lines from the jobs' output files. A job that left none (cancelled, failed to
    start, killed at its time limit) gives one unknown result per planned run."""
    from .. import safeio

    out = []
    for job_id in job_ids:
        spec = specs[job_id]
        expected = {subject for subject, _ in targets(spec)}
        found = []
        try:
            fd = safeio.open_file(os.path.join(spool, f"{job_id}.out"))
            try:
                data = safeio.read_bounded(fd, 16 << 20) or b""
            finally:
                os.close(fd)
        except (OSError, safeio.UnsafePathError):
            data = b""
        for line in data.split(b"\n"):
            if line.startswith(MARK.encode()):
                try:
                    r = fastjson.loads(line[len(MARK) :])
                except (ValueError, UnicodeDecodeError, RecursionError):
                    continue
                if store.valid(r) and r.get("check") == spec["check"] and r.get("subject") in expected:
                    r["job"] = str(job_id)
                    found.append(r)
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


def run_jobs(slurm, profile, opts, sweep_id, nodes, pairs=None, only=None) -> list[dict]:
    jobs = submit_all(slurm, profile, opts, sweep_id, nodes, pairs, only)
    if opts.dry_run or not jobs:
        return []
    specs = {j: spec for j, spec, _ in jobs}
    limit = max(s.time_limit for _, s in configured(profile))
    wait_jobs(slurm, list(specs), opts.wait_s if opts.wait_s is not None else limit * len(jobs) + 120)
    return collect(opts.spool, list(specs), specs)


# ---- marking ----------------------------------------------------------------------------------------------
def node_verdicts(verdicts: list[judge.Verdict], named: dict) -> dict:
    """node -> (want: 'degraded'/'ok'/None, reason, checks whose pass may clear the node's mark (None: any)).
    Node checks directly. Pair checks through the members they name, and both ways: a node whose pairs all
    pass (and that no node check or pair blame marks) is ok for those pair checks, so a node named through
    its pairs gets back once its pairs pass (a partition with pair checks alone has no other way back)."""
    out: dict = {}
    pairs: dict = {}  # node -> {check: [statuses of its pairs]}
    for v in verdicts:
        if "+" in v.subject:
            for m in judge.pair_members(v.subject):
                pairs.setdefault(m, {}).setdefault(v.check, []).append(v.status)
            continue
        node = v.subject
        if v.status == judge.OUTLIER:
            out[node] = ("degraded", v.reason, None)
        elif v.status == judge.OK and out.get(node, (None,))[0] != "degraded":
            out[node] = ("ok", "", None)
    for node, reason in named.items():
        out[node] = ("degraded", reason, None)
    for node, by_check in pairs.items():
        if node in out:
            continue
        statuses = {s for ss in by_check.values() for s in ss}
        if statuses == {judge.OK}:  # every pair it is in passed; one still slow or unknown leaves it as it is
            out[node] = ("ok", "", frozenset(by_check))
    return out


def _marked_check(node) -> str:
    """The check named in stune-sweep's own mark on the node (comment or drain reason), or ''."""
    for text, prefix in ((node.comment, ACTIVE_COMMENT), (node.reason if node.drain else "", ACTIVE_DRAIN)):
        if text.startswith(prefix):
            return text[len(prefix) :].split(":", 1)[0].strip()
    return ""


def apply_marks(slurm, profile, wants: dict, store_dir: str, now: float, dry_run=False) -> list[str]:
    """Mark or clear nodes through the health hooks' plan (feature + comment; drain when opted in)."""
    lines = []
    nodes = {n.name: n for n in slurm.nodes()}
    state = store.read_state(store_dir)
    marks = state.setdefault("marks", {})
    for name, (want, reason, *clears) in sorted(wants.items()):
        node = nodes.get(name)
        if node is None or want is None:
            continue
        ours = node.comment.startswith(ACTIVE_COMMENT) or (
            node.drain and node.reason.startswith(ACTIVE_DRAIN)
        )
        if want == "ok":
            if not ours:
                continue
            if clears and clears[0] is not None and _marked_check(node) not in clears[0]:
                continue  # passing pairs clear a pair check's mark, not a node check's still unjudged
            w = apply.Want(apply.CLEAR, "")
        else:
            if node.comment.startswith(REASON_PREFIX) and not ours:
                lines.append(f"{name}: {reason} (already marked by the passive checks: {node.comment!r})")
                continue
            w = apply.Want(apply.DRAIN if profile.active.drain else apply.DEGRADE, reason)
        if dry_run:
            lines.append(f"{name}: would {w.action}: {reason}")
            continue
        if w.action == apply.DRAIN:
            node_state = marks.setdefault(name, {})
            outcome = apply.sync(slurm, name, w, node_state, profile, now)
            lines.append(f"{name}: drain: {reason}" + "".join(f"; {n}" for n in outcome.notes))
            continue
        kind = "ours" if node.drain and node.reason.startswith(ACTIVE_DRAIN) else apply.drain_kind(node, {})
        fields, notes = apply.plan(node, w, kind, keep_active=False)
        if fields:
            slurm.update_node(name, **fields)
        marks[name] = {"action": w.action, "reason": reason, "at": round(now, 3)}
        if fields or notes:
            lines.append(
                f"{name}: {'marked degraded' if w.action == apply.DEGRADE else 'cleared'}"
                f"{': ' + reason if reason else ''}" + "".join(f"; {n}" for n in notes)
            )
    if not dry_run:
        store.write_state(store_dir, state)
    return lines


# ---- the whole sweep ----------------------------------------------------------------------------------------
def sweep(slurm, profile, opts, now=None, log=print) -> dict:
    now = time.time() if now is None else now
    sweep_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"-{os.getpid()}"
    if not configured(profile):
        raise StuneError(
            f"partition {opts.partition}: no active checks configured (active.checks in {profile.source})"
        )
    nodes = idle_nodes(slurm, opts.partition, opts.reservation or profile.active.reservation, opts.nodes)
    log(f"sweep {sweep_id}: {len(nodes)} idle node(s) in {opts.partition}: {','.join(nodes) or '-'}")
    recheck = [] if opts.dry_run else drained_by_active(slurm, opts.partition, opts.nodes)
    if not nodes and not recheck:
        return {"sweep": sweep_id, "nodes": [], "results": 0, "marks": []}
    results = run_jobs(slurm, profile, opts, sweep_id, nodes) if nodes else []
    if recheck:
        results += recheck_drained(slurm, profile, opts, sweep_id, recheck, log)
    if opts.dry_run:
        for _, spec, args in submit_all(slurm, profile, opts, sweep_id, nodes):
            log(f"would submit {spec['check']} on {spec['subject']}: sbatch {' '.join(args)}")
        return {"sweep": sweep_id, "nodes": nodes, "results": 0, "marks": []}
    missing: dict = {}
    for r in results:
        if r["status"] == "unavailable":
            missing.setdefault((r["check"], r["detail"]), set()).add(r["subject"])
    for (check, detail), subjects in sorted(missing.items()):
        names = sorted(subjects)
        log(
            f"{check}: not available on {len(names)} node(s) ({','.join(names[:5])}{',...' if len(names) > 5 else ''})"
            f": {detail}"
        )
    store.append(opts.store, opts.partition, results)
    return judge_and_mark(slurm, profile, opts, sweep_id, nodes, now, log)


def judge_and_mark(slurm, profile, opts, sweep_id, nodes, now, log) -> dict:
    settings = judge.Settings.from_profile(profile)
    history = store.load(opts.store, opts.partition, since=now - profile.active.window)
    bases, verdicts = judge.judge(history, settings)
    pair_verdicts = [v for v in verdicts if "+" in v.subject]
    named, still_open = judge.blame_pairs(pair_verdicts)
    findings = []
    if still_open and profile.active.bisect and not opts.dry_run:
        findings = bisect(slurm, profile, opts, sweep_id, still_open, pair_verdicts, bases, settings, log)
        for v, (members, why) in zip(still_open, findings):
            for m in members:
                named[m] = f"active {v.check}: {why}"[:300]
    wants = node_verdicts(verdicts, named)
    lines = apply_marks(slurm, profile, wants, opts.store, now, opts.dry_run)
    for line in lines:
        log(line)
    return {
        "sweep": sweep_id,
        "nodes": nodes,
        "verdicts": verdicts,
        "named": named,
        "marks": lines,
        "bisect": findings,
    }


def drained_by_active(slurm, partition: str, wanted) -> list[str]:
    """Nodes stune-sweep drained (or the passive checks handed over with active.gate_resume)."""
    return sorted(
        n.name
        for n in slurm.nodes()
        if partition in n.partitions
        and n.drain
        and n.reason.startswith(ACTIVE_DRAIN)
        and (not wanted or n.name in wanted)
    )


def recheck_drained(slurm, profile, opts, sweep_id, nodes: list[str], log) -> list[dict]:
    """Return to service gated on the active checks. Slurm starts no job on a drained node, so the nodes go
    into a maintenance reservation of their own (no user job can start there), are resumed, run their node
    checks inside it, and the reservation is deleted; judging then resumes (clears) or drains them again."""
    import getpass

    name = f"stune-recheck-{sweep_id}"[:60]
    checks = [s for c, s in configured(profile) if c.kind == NODE]
    if not checks:
        log(f"recheck: {','.join(nodes)} stay drained: no node check configured to judge them")
        return []
    minutes = sum(-(-int(s.time_limit) // 60) for s in checks) + 5
    reasons = {n.name: n.reason for n in slurm.nodes(nodes)}
    slurm.create_reservation(name, nodes, minutes=minutes, users=getpass.getuser(), flags="maint,ignore_jobs")
    try:
        for node in nodes:
            slurm.update_node(node, state="RESUME")
        log(f"recheck: {','.join(nodes)} resumed inside reservation {name} for their active checks")
        sub = Options(
            opts.partition,
            opts.store,
            opts.spool,
            name,
            opts.checks,
            nodes,
            opts.runs,
            False,
            opts.wait_s,
            opts.agent,
        )
        results = run_jobs(
            slurm,
            profile,
            sub,
            sweep_id,
            nodes,
            only={c.name for c, _ in configured(profile) if c.kind == NODE},
        )
        for node in nodes:  # drained again until the verdict says otherwise
            slurm.update_node(node, state="DRAIN", reason=reasons.get(node) or f"{ACTIVE_DRAIN}re-check")
        return results
    finally:
        slurm.delete_reservation(name)


def bisect(slurm, profile, opts, sweep_id, open_pairs, pair_verdicts, bases, settings, log) -> list:
    """Test each member of an open slow pair against a known-good partner; name the member(s) at fault."""
    bad = {m for v in open_pairs for m in judge.pair_members(v.subject)}
    good = sorted(
        {m for v in pair_verdicts if v.status == judge.OK for m in judge.pair_members(v.subject)} - bad
    )
    plan = judge.bisect_plan(open_pairs, good)
    if not plan:
        log(
            "bisection: no known-good partners; slow pairs stay unresolved: "
            + ", ".join(v.subject for v in open_pairs)
        )
        return [([], "no known-good partner to bisect with") for _ in open_pairs]
    log("bisection: testing " + ", ".join(f"{a} with {b}" for a, b in plan))
    checks = {v.check for v in open_pairs}
    results = run_jobs(
        slurm,
        profile,
        opts,
        sweep_id + "-bisect",
        sorted({x for p in plan for x in p}),
        pairs=plan,
        only=checks,
    )
    for r in results:
        r["bisect"] = True
    store.append(opts.store, opts.partition, results)
    findings = []  # one (members, why) per open pair, in order
    for v in open_pairs:
        base = v.baseline
        floor = settings.floors.get(v.check)
        tests = {}
        hca = judge.pair_hca(v.subject)
        for member in judge.pair_members(v.subject)[:2]:
            partner = next((b for a, b in plan if a == member), None)
            if partner is None:
                continue
            subject = f"{member}+{partner}" + (f"/{hca}" if hca else "")
            runs = [
                r
                for r in results
                if r["check"] == v.check and r["subject"] == subject and r["status"] in ("ok", "fail")
            ]
            if not runs:
                continue
            slow = sum(judge.slow_run(r, base, floor) for r in runs)
            values = [r["value"] for r in runs if r.get("value") is not None]
            tests[member] = (
                slow >= min(settings.k, len(runs)),
                partner,
                f"{judge.median(values):.4g} {runs[0].get('unit', '')} in {slow} of {len(runs)} runs slow"
                if values
                else f"{slow} of {len(runs)} runs failed",
            )
        members, why = judge.bisect_verdict(v.subject, tests)
        log(f"bisection of {v.subject}: {why}")
        findings.append((members, why))
    return findings
