"""What Slurm's node, job, partition, sshare and sprio records become, the same on every release, and the
parsers of each release's JSON record shapes.

22.05's `sinfo --json` (openapi v0.0.38) and 23.02+'s `scontrol --json show node` (data_parser) each have
their own node parser; squeue's job records differ only in value shapes (a state string or a list of state
and flags, a number or {set,infinite,number}), which _state() and _int() normalise in one place. A parser
raises one of RECORD_ERRORS on a record it does not understand; the adapter turns that into a SlurmError
naming the command and the release.
"""

from __future__ import annotations

from collections import namedtuple


class Node(
    namedtuple(
        "Node",
        "name state flags reason reason_user reason_time features active_features "
        "comment partitions gres gres_used tres",
    )
):
    """A node, the same on every Slurm release. `state` is the lower-case base state (idle, mixed,
    allocated, down...), `flags` the upper-case state flags (DRAIN, NOT_RESPONDING, ...), features
    comma-separated text, reason_time epoch seconds (0: none)."""

    __slots__ = ()

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def feature_set(self) -> frozenset[str]:
        return frozenset(f for f in self.features.split(",") if f)

    @property
    def active_feature_set(self) -> frozenset[str]:
        return frozenset(f for f in self.active_features.split(",") if f)


class Job(
    namedtuple(
        "Job",
        "job_id name user account partition state reason nodes node_count priority "
        "tres_req tres_alloc submit_time start_time end_time admin_comment comment "
        "requeue restart_count batch_host flags",
        defaults=((),),
    )
):
    """A job, the same on every Slurm release. `state` is one upper-case base state (PENDING, RUNNING,
    COMPLETED...), `flags` the upper-case state flags newer releases list beside it (REQUEUED, COMPLETING,
    ...). Numbers are plain ints: 0 when Slurm has no value, INFINITE when it says infinite."""

    __slots__ = ()

    @property
    def state_set(self) -> frozenset[str]:
        """The state and its flags: a completing job is {'COMPLETED', 'COMPLETING'} on 23.02+ and
        {'COMPLETING'} on 22.05, so test membership here rather than comparing `state` alone."""
        return frozenset((self.state, *self.flags))


class Partition(namedtuple("Partition", "name nodes default state total_nodes")):
    __slots__ = ()


class ShareRow(
    namedtuple(
        "ShareRow",
        "account user raw_shares norm_shares raw_usage norm_usage effective_usage fairshare level_fs",
    )
):
    """One `sshare -l` row. user is '' for an account row. Numbers are float, or None when Slurm prints none."""

    __slots__ = ()


class PrioRow(namedtuple("PrioRow", "job_id user priority site age fairshare fairshare_norm partition")):
    """One `sprio` row: weighted factors (site is the SiteFactor), plus the normalized fair-share factor."""

    __slots__ = ()


# Slurm's "no value" and "infinite" become 0 and INFINITE, so every number is a plain int.
INFINITE = 2**63 - 1
NODE_BASE_STATES = frozenset({"IDLE", "DOWN", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN"})
JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


def _int(value) -> int:
    """A Slurm JSON number as a plain int: 22.05 prints plain numbers, 23.02+ {set, infinite, number}."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return INFINITE
        if not value.get("set"):
            return 0
        value = value.get("number")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    return int(value)


def _text(value) -> str:
    """A text or a list of texts (23.02+ lists features and partitions) as comma-separated text."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    raise ValueError(f"not text: {value!r}")


def _state(value, base_states: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """(base state, flags), upper case. 22.05 gives one string, 23.02+ a list of the base state and flags.
    A 22.05 string that is a flag (COMPLETING) stands for the state as well."""
    if isinstance(value, str):
        words = [value.upper()] if value else []
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = [v.upper() for v in value]
    else:
        raise ValueError(f"state {value!r}")
    base = next((w for w in words if w in base_states), words[0] if words else "")
    return base, tuple(w for w in words if w != base)


def _str(value) -> str:
    """A text field: a string, or nothing (None) as ''. Anything else is a format stune does not know."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"not text: {value!r}")
    return value


def _name_tuple(value) -> tuple[str, ...]:
    """A list of names (23.02+) or a comma-separated text (22.05) as a tuple of names."""
    if isinstance(value, list):
        return tuple(_str(v) for v in value)
    return tuple(v for v in _str(value).split(",") if v)


def node_from_v0038(n: dict) -> Node:
    """A node record of 22.05's `sinfo --json` (openapi v0.0.38): state 'idle', state_flags ['DRAIN']."""
    base, flags = _state(n.get("state") or "", NODE_BASE_STATES)
    extra = tuple(f.upper() for f in _name_tuple(n.get("state_flags")))
    return Node(
        name=_name(n),
        state=base.lower(),
        flags=flags + extra,
        reason=_str(n.get("reason")),
        reason_user=_str(n.get("reason_set_by_user")),
        reason_time=_int(n.get("reason_changed_at")),
        features=_text(n.get("features")),
        active_features=_text(n.get("active_features")),
        comment=_str(n.get("comment")),
        partitions=_name_tuple(n.get("partitions")),
        gres=_str(n.get("gres")),
        gres_used=_str(n.get("gres_used")),
        tres=_str(n.get("tres")),
    )


def node_from_data_parser(n: dict) -> Node:
    """A node record of `scontrol --json show node` (data_parser v0.0.39+): state ['IDLE', 'DRAIN'],
    features and partitions as lists, times as {set, infinite, number}."""
    base, flags = _state(n.get("state") or [], NODE_BASE_STATES)
    return Node(
        name=_name(n),
        state=base.lower(),
        flags=flags,
        reason=_str(n.get("reason")),
        reason_user=_str(n.get("reason_set_by_user")),
        reason_time=_int(n.get("reason_changed_at")),
        features=_text(n.get("features")),
        active_features=_text(n.get("active_features")),
        comment=_str(n.get("comment")),
        partitions=_name_tuple(n.get("partitions")),
        gres=_str(n.get("gres")),
        gres_used=_str(n.get("gres_used")),
        tres=_str(n.get("tres")),
    )


def _name(record: dict) -> str:
    name = record["name"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"name {name!r}")
    return name


# What a record parser raises on a record it does not understand; the caller turns it into a SlurmError.
RECORD_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


def job_from_json(j: dict) -> Job:
    """A squeue --json job record of any release as a Job: one state string, plain ints."""
    state, flags = _state(j.get("job_state") or "", JOB_BASE_STATES)
    job_id = j["job_id"]
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise ValueError(f"job_id {job_id!r}")
    return Job(
        job_id=job_id,
        name=_str(j.get("name")),
        user=_str(j.get("user_name")),
        account=_str(j.get("account")),
        partition=_str(j.get("partition")),
        state=state,
        reason=_str(j.get("state_reason")),
        nodes=_str(j.get("nodes")),
        node_count=_int(j.get("node_count")),
        priority=_int(j.get("priority")),
        tres_req=_str(j.get("tres_req_str")),
        tres_alloc=_str(j.get("tres_alloc_str")),
        submit_time=_int(j.get("submit_time")),
        start_time=_int(j.get("start_time")),
        end_time=_int(j.get("end_time")),
        admin_comment=_str(j.get("admin_comment")),
        comment=_str(j.get("comment")),
        requeue=bool(j.get("requeue")),
        restart_count=_int(j.get("restart_cnt")),
        batch_host=_str(j.get("batch_host")),
        flags=flags,
    )
