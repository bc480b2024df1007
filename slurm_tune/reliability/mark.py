"""`stune-health lemons --mark`: lemons marked degraded, opt-in per partition (`health.lemon_mark`), through the
health hooks' marking (health/apply.py's plan): the `stune_degraded` feature (multi-node jobs then avoid the
node) and the Comment `stune: degraded: lemon: ...`. The lemon scoring is a cluster-wide statistic, computed
where sacct is (a timer beside the accountant), not on the node, so it marks from there as the active checks
(stune-sweep) do, and clears only its own marks: a node no longer a lemon loses its mark on the next run;
the passive health run leaves a lemon mark alone (apply.plan), as it leaves the active checks' marks.

Never more than the partition's `health.drain_max_fraction` of its nodes carry a lemon mark (the circuit
breaker's share, apply.breaker_limit): the strongest lemons first. A node drained or marked by another part
of stune is left as it is (it is out of multi-node jobs already); an admin's drain is left alone, the node
is marked beside it. Nothing here resumes a node.
"""

from __future__ import annotations

from ..health import apply
from ..nodestate import LEMON_COMMENT, REASON_PREFIX
from .lemons import LemonReport, NodeScore
from .render import span


def reason(score: NodeScore, report: LemonReport) -> str:
    ratio = "" if score.ratio is None else f", {score.ratio:.1f}x its share (>= {score.ratio_low:.1f}x)"
    return f"lemon: {score.failures} failed multi-node runs in {span(report.until - report.since)}{ratio}"


def apply_marks(slurm, report: LemonReport, profile, dry_run: bool = False) -> list[str]:
    """Mark the report's lemons and clear the lemon marks of the partition's other nodes; one line per node
    touched (or, dry, that would be)."""
    nodes = [n for n in slurm.nodes() if report.partition in n.partitions]
    limit = apply.breaker_limit(len(nodes), profile.health.drain_max_fraction)
    by_name = {n.name: n for n in nodes}
    lines, wanted = [], []
    for s in report.lemons:
        node = by_name.get(s.node)
        if node is None:
            continue
        kind = apply.drain_kind(node, {})
        if not node.comment.startswith(LEMON_COMMENT) and node.comment.startswith(REASON_PREFIX):
            lines.append(
                f"{node.name}: lemon, already marked by stune ({node.comment[:80]!r}): left as it is"
            )
        elif kind in ("ours", "hook", "active"):
            lines.append(f"{node.name}: lemon, drained by stune ({node.reason[:80]!r}): left as it is")
        else:
            wanted.append((s, node, kind))
    if len(wanted) > limit:
        lines.append(
            f"{report.partition}: {len(wanted)} lemons to mark, but at most {limit} of {len(nodes)} nodes are "
            f"marked (health.drain_max_fraction {profile.health.drain_max_fraction:g}): the strongest first; "
            f"not marked: {', '.join(s.node for s, _, _ in wanted[limit:])}"
        )
        wanted = wanted[:limit]
    keep = {s.node for s, _, _ in wanted}
    for s, node, kind in wanted:
        lines += _update(slurm, node, apply.Want(apply.DEGRADE, reason(s, report)), kind, dry_run)
    for node in nodes:
        if node.name not in keep and node.comment.startswith(LEMON_COMMENT):
            lines += _update(slurm, node, apply.Want(apply.CLEAR, ""), "none", dry_run)
    return lines


def _update(slurm, node, want: apply.Want, kind: str, dry_run: bool) -> list[str]:
    fields, notes = apply.plan(node, want, kind, keep_active=False)
    fields.pop("state", None)  # a lemon mark never drains nor resumes
    if not fields:
        return []
    what = f"marked degraded: {want.reason}" if want.action == apply.DEGRADE else "lemon mark cleared"
    if dry_run:
        return [f"{node.name}: would be {what}"]
    slurm.update_node(node.name, **fields)
    return [f"{node.name}: {what}" + "".join(f"; {n}" for n in notes if not n.startswith("resumed"))]
