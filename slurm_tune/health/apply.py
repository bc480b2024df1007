"""Apply a verdict to Slurm: drain, resume, mark degraded, or nothing.

Rules (see docs/health.md):
- A node with a failed check is drained with `stune: <what broke>`; a degraded one gets the feature
  `stune_degraded` (the admin's own features are kept) and its reason in the node Comment, and stays in
  service; a healthy one loses stune's marks and, if stune drained it, is resumed. An "unknown" verdict changes
  nothing: stune never acts on what it could not see.
- stune only resumes or re-reasons a drain that is its own: a reason with the `stune: ` prefix, or Slurm's
  "Prolog error"/"Epilog error" when the node's own record says stune's hook failed it at that time.
  Any other drain is the admin's and is never touched.
- Slurm is called only when the wanted state differs from what this node last applied (plus one re-check an
  hour while the node is not healthy), so an unchanged node makes no RPC.
- Requeue that avoids the culprit (opt-in, health/requeue.py): once the node stands under stune's drain or
  mark, the multi-node jobs that failed on it since it was last healthy are requeued once without it.
- Circuit breaker: before a drain, the partition's nodes are read once; if draining this one would put more
  than `health.drain_max_fraction` of the partition under stune drains set within `health.drain_window`,
  stune does not drain. Concurrent runs on many nodes could all pass that check at once, so after draining
  each node reads again and keeps its drain only if it is among the first `limit` (by drain time, then name);
  otherwise it resumes itself. It reads only after waiting out the drain time's resolution (BREAKER_SETTLE_S),
  so every drain that sorts before its own is visible: every node computes its true place in one order,
  and at most `limit` drains survive.
"""

from __future__ import annotations

import time
from collections import namedtuple

from ..errors import SlurmError
from ..nodestate import ACTIVE_COMMENT, ACTIVE_DRAIN, DEGRADED_FEATURE, LEMON_COMMENT, REASON_PREFIX
from . import result

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

DRAIN, DEGRADE, CLEAR, HOLD = "drain", "degraded", "ok", "hold"
# What slurmctld writes as the reason when a prolog or epilog exits non-zero.
HOOK_REASONS = ("Prolog error", "Epilog error", "prolog error", "epilog error")
HOOK_SLACK_S = (
    120  # the drain follows the hook's exit by a moment; clocks of node and controller differ a bit
)
RESYNC_S = 3600  # re-read Slurm this often while a node is not healthy (an admin may have resumed it)
RETRY_S = 600  # and this often while the breaker holds a drain back or Slurm did not answer
BREAKER_SETTLE_S = 2.0  # reason times have 1 s resolution: wait past it before reading the others' drains


class Want(namedtuple("Want", "action reason")):
    __slots__ = ()


class Breaker(namedtuple("Breaker", "allowed limit members recent message")):
    """recent: names of the partition's nodes under a stune drain set within the window (this one included
    when it is drained)."""

    __slots__ = ()


class Outcome(namedtuple("Outcome", "synced kind updates notes breaker")):
    """synced: whether Slurm was read; kind: how the node's drain was classified (none/ours/hook/admin);
    updates: the scontrol fields changed ([] when none); notes: human lines; breaker: Breaker or None."""

    __slots__ = ()


def want_for(verdict: result.Verdict) -> Want:
    if verdict.status == result.FAIL:
        return Want(DRAIN, verdict.reason)
    if verdict.status == result.DEGRADED:
        return Want(DEGRADE, verdict.reason)
    if verdict.status == result.UNKNOWN:
        return Want(HOLD, "")
    return Want(CLEAR, "")


def _num(value, default=0.0) -> float:
    return value if type(value) in (int, float) else default


def needs_sync(want: Want, state: dict, now: float) -> str | None:
    """Why Slurm must be read now, or None: the decision that keeps unchanged nodes off slurmctld."""
    if want.action == HOLD:
        return None
    applied, hook = state.get("applied"), state.get("hook_fail")
    applied = applied if isinstance(applied, dict) else {}
    hook = hook if isinstance(hook, dict) else {}
    synced_at = _num(applied.get("synced_at"))
    if hook and _num(hook.get("at")) > synced_at:
        return f"the {hook.get('mode', 'hook')} failed this node"
    if applied.get("action") != want.action or applied.get("reason", "") != want.reason:
        return "the verdict changed"
    if applied.get("retry_at") and now >= _num(applied.get("retry_at")):
        return "retrying"
    if want.action != CLEAR and now - synced_at >= RESYNC_S:
        return "periodic re-check"
    return None


def drain_kind(node, state: dict) -> str:
    """none (not drained), ours (a stune reason), hook (Slurm's prolog/epilog drain that our own record
    explains) or admin (anything else: never touched)."""
    if not node.drain:
        return "none"
    if node.reason.startswith(ACTIVE_DRAIN):
        return "active"  # stune-sweep's drain: only a passing active check resumes it
    if node.reason.startswith(REASON_PREFIX):
        return "ours"
    hook = state.get("hook_fail") if isinstance(state.get("hook_fail"), dict) else {}
    if (
        hook
        and node.reason.startswith(HOOK_REASONS)
        and _num(node.reason_time) >= _num(hook.get("at")) - HOOK_SLACK_S
    ):
        return "hook"
    return "admin"


def marks(node) -> tuple[bool, bool]:
    """(has stune's degraded feature, has a stune comment)."""
    return DEGRADED_FEATURE in (node.feature_set | node.active_feature_set), node.comment.startswith(
        REASON_PREFIX
    )


def plan(node, want: Want, kind: str, keep_active: bool = True) -> tuple[dict, list]:
    """The scontrol fields to change (update_node keyword arguments) and notes. Pure. With keep_active (the
    passive checks), a healthy verdict leaves the active checks' degraded mark to them."""
    marked, commented = marks(node)
    admin_features = sorted(node.feature_set - {DEGRADED_FEATURE})
    fields: dict = {}
    notes: list = []
    if want.action == DRAIN:
        reason = REASON_PREFIX + want.reason
        if kind == "admin":
            notes.append(f"drained by someone else ({node.reason!r}): left alone")
        elif kind == "ours" and node.reason == reason:
            pass
        else:
            fields.update(state="DRAIN", reason=reason)
            if marked:
                fields["features"] = admin_features
            if commented:
                fields["comment"] = ""
    elif want.action == DEGRADE:
        comment = f"{REASON_PREFIX}degraded: {want.reason}"
        if kind in ("ours", "hook"):
            fields["state"] = "RESUME"
            notes.append(f"resumed from {node.reason!r}: only degraded now")
        elif kind == "admin":
            notes.append(f"drained by someone else ({node.reason!r}): drain left alone, marked degraded")
        if not marked:
            fields["features"] = [*admin_features, DEGRADED_FEATURE]
        if node.comment != comment:
            fields["comment"] = comment
    elif want.action == CLEAR:
        if kind in ("ours", "hook"):
            fields["state"] = "RESUME"
            notes.append(f"resumed from {node.reason!r}: healthy")
        elif kind == "admin":
            notes.append(f"drained by someone else ({node.reason!r}): left alone")
        if keep_active and node.comment.startswith(ACTIVE_COMMENT):
            notes.append("marked degraded by the active checks: left to them")
            return fields, notes
        if keep_active and node.comment.startswith(LEMON_COMMENT):
            notes.append("marked degraded as a lemon: left to `stune-health lemons --mark`")
            return fields, notes
        if marked:
            fields["features"] = admin_features
        if commented:
            fields["comment"] = ""
    return fields, notes


def breaker_limit(members: int, fraction: float) -> int:
    """How many of `members` nodes may be under stune drains within the window. At least one when the
    fraction is not zero, so a small partition can still lose a broken node."""
    limit = int(members * fraction + 1e-9)
    return max(limit, 1) if fraction > 0 and members else limit


def _recent(nodes, partition: str, since: float) -> list:
    return [
        n
        for n in nodes
        if partition in n.partitions
        and n.drain
        and n.reason.startswith(REASON_PREFIX)
        and _num(n.reason_time) >= since
    ]


def breaker_check(nodes, partition: str, me: str, now: float, window: float, fraction: float) -> Breaker:
    """Before draining `me`: would one more stune drain exceed the partition's share?"""
    members = [n for n in nodes if partition in n.partitions]
    limit = breaker_limit(len(members), fraction)
    recent = sorted(n.name for n in _recent(members, partition, now - window) if n.name != me)
    allowed = len(recent) + 1 <= limit
    message = (
        ""
        if allowed
        else (
            f"circuit breaker open: {len(recent)} of {len(members)} nodes in partition {partition} were drained by "
            f"stune within {window:g}s (limit {fraction:.0%} = {limit}); not draining {me}"
        )
    )
    return Breaker(allowed, limit, len(members), recent, message)


def breaker_confirm(nodes, partition: str, me: str, now: float, window: float, fraction: float) -> Breaker:
    """After draining `me`: keep the drain only if `me` is among the first `limit` recent stune drains."""
    members = [n for n in nodes if partition in n.partitions]
    limit = breaker_limit(len(members), fraction)
    recent = sorted(_recent(members, partition, now - window), key=lambda n: (_num(n.reason_time), n.name))
    names = [n.name for n in recent]
    allowed = me not in names or names.index(me) < limit
    message = (
        ""
        if allowed
        else (
            f"circuit breaker open: {names.index(me)} of {len(members)} nodes in partition {partition} were drained "
            f"by stune just before {me} (limit {fraction:.0%} = {limit}); undid the drain of {me}"
        )
    )
    return Breaker(allowed, limit, len(members), names, message)


def sync(slurm, node_name: str, want: Want, state: dict, profile: Profile, now: float, sleep=None) -> Outcome:
    """Read the node (and, before a drain, its partition), change what differs, record what was applied.
    Raises SlurmError when Slurm does not answer; the caller records a retry."""
    nodes = slurm.nodes()
    node = next((n for n in nodes if n.name == node_name), None)
    if node is None:
        raise SlurmError(["sinfo", "--json"], 0, f"node {node_name} is not known to Slurm")
    kind = drain_kind(node, state)
    fields, notes = plan(node, want, kind)
    if fields.get("state") == "RESUME" and profile.active.gate_resume:
        # the partition gates return to service on the active checks: hand the drain over to stune-sweep
        fields.update(
            state="DRAIN", reason=f"{ACTIVE_DRAIN}awaiting active checks (was: {node.reason})"[:200]
        )
        notes = [n for n in notes if not n.startswith("resumed")] + [
            "passive checks pass: awaiting the active checks"
        ]
    breaker = None
    health = profile.health
    if fields.get("state") == "DRAIN" and kind == "none":
        breaker = breaker_check(
            nodes, profile.partition, node_name, now, health.drain_window, health.drain_max_fraction
        )
        if not breaker.allowed:
            _record(state, want, now, retry=True)
            return Outcome(True, kind, [], [*notes, breaker.message], breaker)
    if fields:
        _update(slurm, node_name, fields, notes)
    if fields.get("state") == "DRAIN" and kind == "none":
        if sleep is None:
            sleep = time.sleep
        sleep(BREAKER_SETTLE_S)
        after = breaker_confirm(
            slurm.nodes(), profile.partition, node_name, now, health.drain_window, health.drain_max_fraction
        )
        if not after.allowed:
            _update(slurm, node_name, {"state": "RESUME"}, notes)
            _record(state, want, now, retry=True)
            return Outcome(True, kind, [], [*notes, after.message], after)
        breaker = after
    _record(state, want, now, retry=False)
    if want.action in (DRAIN, DEGRADE) and kind != "admin":  # under stune's drain or mark: its failed jobs
        from .requeue import avoid_culprit  # at first use: off the hooks' path

        notes += avoid_culprit(slurm, node_name, want.reason, state, now)
    return Outcome(True, kind, sorted(fields), notes, breaker)


# What slurmctld answers to State=RESUME for a node that is not drained or down (someone resumed it between
# our read and our update): the node is already where we wanted it.
ALREADY_IN_STATE = "Invalid node state specified"


def _update(slurm, node_name: str, fields: dict, notes: list) -> None:
    """One `scontrol update`; a RESUME of a node that is already resumed is done, not a failure (the other
    fields, if any, are then applied on their own)."""
    try:
        slurm.update_node(node_name, **fields)
    except SlurmError as exc:
        if fields.get("state") != "RESUME" or ALREADY_IN_STATE not in exc.message:
            raise
        rest = {k: v for k, v in fields.items() if k != "state"}
        if rest:
            slurm.update_node(node_name, **rest)
        notes.append(f"{node_name} was already resumed (Slurm: {ALREADY_IN_STATE}): nothing to undo")


def _record(state: dict, want: Want, now: float, retry: bool) -> None:
    state["applied"] = {
        "action": want.action,
        "reason": want.reason,
        "synced_at": round(now, 3),
        "retry_at": round(now + RETRY_S, 3) if retry else None,
    }
