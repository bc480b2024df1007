"""A sweep: the partition's active checks as ordinary Slurm jobs on its idle nodes, then judging and marking.

Jobs never push user work aside: they go only to nodes that are idle when the sweep starts (or to the nodes
of the maintenance reservation the admin names), at `--nice` below every user job (optionally a scavenger
QOS), with the check's time limit, `--no-requeue`, and a `--deadline` so a job that could not start in time
is dropped by Slurm instead of waiting. So a user job is delayed at most by one check's time limit.

The jobs themselves (their sbatch arguments, the agent's spec, waiting for them and reading their results
back) are jobs.py's; this module picks the nodes, judges, marks, re-checks drained nodes and bisects slow
pairs.

Marking goes through the health hooks' path (slurm_tune.health.apply): an outlier gets the `stune_degraded`
feature and a comment `stune: degraded: active <check>: ...` (or, if the partition opted in, a drain with the
circuit breaker); a node whose latest sweep passes loses stune's active mark. Marks set by the passive checks
(a comment without the `active ` tag) are left to them.
"""

from __future__ import annotations

import getpass
import os
import sys
import time

from ..errors import StuneError
from ..health import apply
from ..hostlist import expand_hostlist
from ..nodestate import ACTIVE_COMMENT, ACTIVE_DRAIN, REASON_PREFIX
from . import judge, store
from .checks import NODE, configured, skipped
from .jobs import run_jobs, submit_all

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile


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


def apply_marks(slurm, profile: Profile, wants: dict, store_dir: str, now: float, dry_run=False) -> list[str]:
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
def sweep(slurm, profile: Profile, opts, now=None, log=print) -> dict:
    now = time.time() if now is None else now
    sweep_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"-{os.getpid()}"
    for _check, why in skipped(profile):
        log(why)
    if not configured(profile):
        raise StuneError(
            f"partition {opts.partition}: no active checks configured for its accelerator "
            f"({profile.accelerator}; active.checks in {profile.source})"
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


def judge_and_mark(slurm, profile: Profile, opts, sweep_id, nodes, now, log) -> dict:
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


def recheck_drained(slurm, profile: Profile, opts, sweep_id, nodes: list[str], log) -> list[dict]:
    """Return to service gated on the active checks. Slurm starts no job on a drained node, so the nodes go
    into a maintenance reservation of their own (no user job can start there), are resumed, run their node
    checks inside it, and the reservation is deleted; judging then resumes (clears) or drains them again."""
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


def bisect(slurm, profile: Profile, opts, sweep_id, open_pairs, pair_verdicts, bases, settings, log) -> list:
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
