"""The health modes on one node: prolog, epilog, periodic run, and offline check.

    prolog  fast checks before every job; no Slurm command, no NVML. Exit 1 (Slurm drains the node and
            requeues the job) only for a failure under a policy this node has passed before.
    epilog  the full checks after every job (NVML, Xids); same exit rule.
    run     the HealthCheckProgram: full checks, then drain / resume / mark through the Slurm adapter, only
            when the wanted state changed, with the circuit breaker.
    check   judge a snapshot file offline: health/offline.py (no hook or Slurm code on its path).

Which profile applies to a node: $STUNE_HEALTH_PARTITION (per node, from /etc/default/stune) or
--partition; else the one this node used before (kept in its state); else, for a hook, the job's partition
when it has a profile, and for the periodic run, the node's first partition with a profile (one Slurm
lookup). The first answer is kept, so a node in several partitions judges itself by one profile.
"""

from __future__ import annotations

import os
import time

from ..errors import EXIT_BREAKER, EXIT_HOOK_FAIL, ConfigError
from ..frozen import Record
from ..hw.sysfs import resolve_root
from ..thisnode import expand, job_partition, node_name
from . import judge, outputs, result, state, transport

HOOK_MODES = ("prolog", "epilog")


class Settings(Record):
    """Where one evaluation reads and writes. partition may be None until resolved."""

    __slots__ = ("node", "partition", "root", "state_dir", "gpu_snapshot", "prom_path", "json_path")
    node: str
    partition: str | None
    root: str
    state_dir: str
    gpu_snapshot: str | None
    prom_path: str | None
    json_path: str | None


def settings(options: dict, environ=None) -> Settings:
    environ = os.environ if environ is None else environ
    node = options.get("node") or node_name(environ)
    gpu_snapshot = options.get("gpu_snapshot") or environ.get("STUNE_GPU_SNAPSHOT") or None
    return Settings(
        node=node,
        partition=options.get("partition") or environ.get("STUNE_HEALTH_PARTITION") or None,
        root=resolve_root(options.get("sysfs_root"), environ, node),
        state_dir=state.state_dir(options.get("state_dir"), environ, node),
        gpu_snapshot=expand(gpu_snapshot, node) if gpu_snapshot else None,
        prom_path=options.get("prom") or environ.get("STUNE_HEALTH_PROM") or None,
        json_path=options.get("json_out") or environ.get("STUNE_HEALTH_JSON") or None,
    )


def _profiles():
    from ..profilestore import load_profiles

    return load_profiles()


def resolve_profile(cfg: Settings, held: dict, mode: str, environ=None, slurm=None):
    """(profile, how it was chosen). Raises ConfigError when no profile applies."""
    from ..profilestore import load_profile, profile_dir

    environ = os.environ if environ is None else environ
    if cfg.partition:
        return load_profile(cfg.partition), "set for this node"
    known = held.get("partition")
    if isinstance(known, str) and known:
        try:
            return load_profile(known), "used by this node before"
        except ConfigError:
            pass  # the profile went away: choose again
    if mode in HOOK_MODES:
        partition = job_partition(environ)
        if partition:
            return load_profile(partition), f"the job's partition {partition}"
    if mode == "run" and slurm is not None:
        profiles = _profiles()
        node = next((n for n in slurm.nodes() if n.name == cfg.node), None)
        for name in node.partitions if node is not None else ():
            if name in profiles:
                return profiles[name], f"first profiled partition of {cfg.node} in Slurm"
    raise ConfigError(
        profile_dir(),
        None,
        "",
        f"no profile applies to node {cfg.node}: set STUNE_HEALTH_PARTITION "
        "(e.g. in /etc/default/stune) or pass --partition",
    )


def _record_last(
    held: dict,
    mode: str,
    now: float,
    verdict: result.Verdict,
    policy: str,
    enforced: bool,
    seen: str | None = None,
) -> None:
    """`seen`: the status before unknowns were escalated (an unknown marked degraded passed nothing)."""
    held["last"] = {
        "mode": mode,
        "at": round(now, 3),
        "status": verdict.status,
        "reason": verdict.reason,
        "policy": policy,
        "enforced": enforced,
    }
    if verdict.status == result.OK:  # the start of the window a failed job is blamed in (health/requeue.py)
        held["healthy"] = {"at": round(now, 3)}
    if (seen or verdict.status) in (
        result.OK,
        result.DEGRADED,
    ):  # passed: not a failure, and not merely unseen
        trusted = [p for p in held.get("trusted") or [] if p != policy]
        held["trusted"] = [policy, *trusted][: state.TRUSTED_KEEP]


def breaker_open(held: dict, policy: str) -> bool:
    breaker = held.get("breaker")
    return isinstance(breaker, dict) and bool(breaker.get("open")) and breaker.get("policy") == policy


def enforce_decision(held: dict, verdict: result.Verdict, policy: str) -> tuple[bool, str]:
    """Whether a hook fails the job for this verdict, and why (or why not)."""
    if verdict.status != result.FAIL:
        return False, ""
    if breaker_open(held, policy):
        return False, "not failing the job: the circuit breaker is open for this policy"
    if policy not in (held.get("trusted") or []):
        return False, (
            f"not failing the job: this node has never passed policy {policy}, so the policy itself "
            "may be wrong; the periodic run judges it, with the circuit breaker"
        )
    return True, "failing the job: Slurm drains the node and requeues the job"


def _outputs(cfg: Settings, doc: dict, mode: str) -> list:
    """Write the JSON and Prometheus outputs; returns problems (never raises: outputs are not the verdict).
    The node keeps the last full report of each mode in its state dir, for triage; a hook only when it
    found something (its common, healthy case stays cheap)."""
    problems = []
    targets = []
    if mode not in HOOK_MODES or doc["status"] != result.OK:
        targets.append((os.path.join(cfg.state_dir, f"last-{mode}.json"), outputs.write_json))
    if cfg.json_path:
        targets.append((cfg.json_path, outputs.write_json))
    if cfg.prom_path:
        targets.append((cfg.prom_path, outputs.write_prometheus))
    for path, write in targets:
        try:
            write(path, doc)
        except OSError as exc:
            problems.append(f"cannot write {path}: {exc.strerror}")
    return problems


def _ladder():
    from . import ladder

    return ladder


def _incident_outputs(held: dict, profile, now: float) -> dict:
    """The Xid events and held Xids per code, and the hung probes, for the outputs: when the node has any."""
    out: dict = {}
    if held.get("incident_counts") or held.get("incidents"):
        out["incidents"] = outputs.incident_summary(held, profile.health.xid.hold, now)
    if held.get("hangs"):
        out["hangs"] = held["hangs"]
    return out


def hook(mode: str, cfg: Settings, environ=None) -> tuple[int, dict]:
    """prolog or epilog: judge, remember, and exit 1 only for an enforced failure. No Slurm command."""
    from . import collect

    start = time.monotonic()
    now = time.time()
    before = state.read(cfg.state_dir)[0]
    profile, _how = resolve_profile(cfg, before, mode, environ)
    policy = state.policy_digest(profile)
    if mode == "prolog":
        snap = collect.fast(cfg.root, profile, cfg.node, before.get("gpu_pci"))
    else:
        snap = collect.full(cfg.root, profile, cfg.node, cfg.gpu_snapshot, known_gpus=before.get("gpu_pci"))
    with state.Locked(cfg.state_dir) as st:
        verdict, updates = judge.judge(snap, profile, st.state)
        judge.merge_state(st.state, updates, rebaseline=False)
        st.state.setdefault("partition", profile.partition)
        enforced, why = enforce_decision(st.state, verdict, policy)
        _record_last(st.state, mode, now, verdict, policy, enforced)
        if enforced:
            st.state["hook_fail"] = {
                "mode": mode,
                "at": round(now, 3),
                "reason": verdict.reason,
                "policy": policy,
            }
        st.state["node"] = cfg.node
        st.save()
        problem = st.problem
        issue25 = _incident_outputs(st.state, profile, now)
    doc = outputs.report(
        cfg.node,
        profile.partition,
        policy,
        mode,
        now,
        verdict,
        {"enforced": enforced, "note": why, "elapsed_s": round(time.monotonic() - start, 4), **issue25},
    )
    problems = _outputs(cfg, doc, mode) + ([problem] if problem else [])
    line = (
        f"{mode} {verdict.status}"
        + (f": {verdict.reason}" if verdict.reason else "")
        + (f"; {why}" if why else "")
    )
    state.log(cfg.state_dir, line + "".join(f"; {p}" for p in problems), now)
    return (1 if enforced else 0), doc


def run_hook(mode: str, options: dict | None = None, prog: str = "stune-health") -> int:
    """A hook from start to end, as `stune-health prolog|epilog` and prolog/10-stune-health run it: 10 only
    for a failure enforced under a trusted policy; 0 for anything else, a bad profile, an untrusted file or
    a bug in stune included (said on stderr and in health.log): a hook must never drain the fleet by mistake."""
    import sys

    from ..errors import StuneError

    cfg = None
    try:
        cfg = settings(options or {})
        code, doc = hook(mode, cfg)
    except StuneError as exc:
        _say_and_log(prog, cfg, f"{mode}: not judged: {exc}")
        return 0
    except Exception as exc:  # a bug in stune must never drain a node
        _say_and_log(prog, cfg, f"{mode}: internal error, not judged: {type(exc).__name__}: {exc}")
        return 0
    if doc["status"] == result.FAIL:
        print(f"{prog}: {mode}: {doc['reason']} ({doc['note']})", file=sys.stderr)
    return EXIT_HOOK_FAIL if code == 1 else 0


def _say_and_log(prog: str, cfg, line: str) -> None:
    import sys

    from ..streams import say

    say(sys.stderr, f"{prog}: {line}")
    if cfg is not None:
        state.log(cfg.state_dir, line)


def _publish_devices(cfg: Settings, profile, snap: dict, environ=None) -> list[str]:
    """An Ascend node's NPU port addresses into the shared usage spool, for the rank tables of its multi-node
    jobs (nodeenv/ranktable.py), where the profile asks for rank tables. Never part of the verdict: a spool
    that cannot be written is a note in the node's log."""
    if profile.accelerator != "ascend" or not profile.hccl.rank_table:
        return []
    from ..hw.sysfs import Sysfs
    from ..nodeenv import ascendenv, ranktable
    from ..nodeenv.detect import ipv4_address, socket_interfaces
    from ..nodeenv.envrules import hccl_ifname

    env = os.environ if environ is None else environ
    ifname, host = hccl_ifname(profile), None
    if ifname and not cfg.root.rstrip("/"):  # the host's own interfaces (a relocated tree has no address)
        up, _ = socket_interfaces(Sysfs("/"), ifname)
        host = ipv4_address(up[0]) if up else None
    try:
        ranktable.publish(ascendenv.spool_dir(env, cfg.node), cfg.node, snap.get("accel"), host)
    except OSError as exc:
        return [f"NPU device map not published: {exc}"]
    return []


def run(cfg: Settings, slurm, dry_run: bool = False, environ=None) -> tuple[int, dict]:
    """The periodic run: full checks, then apply to Slurm only if the wanted state changed."""
    from ..errors import SlurmError
    from . import apply, collect

    start = time.monotonic()
    now = time.time()
    before = state.read(cfg.state_dir)[0]
    profile, how = resolve_profile(cfg, before, "run", environ, slurm)
    policy = state.policy_digest(profile)
    snap = collect.full(
        cfg.root, profile, cfg.node, cfg.gpu_snapshot, known_gpus=before.get("gpu_pci"), drift=True
    )
    with state.Locked(cfg.state_dir) as st:
        verdict, updates = judge.judge(snap, profile, st.state)
        seen = verdict.status
        verdict = judge.escalate_unknowns(verdict, st.state, profile.health.unknown_degrade_after)
        from . import hang

        verdict = hang.escalate(verdict, snap, st.state, profile.health, now)
        judge.merge_state(st.state, updates, rebaseline=True)
        st.state.setdefault("partition", profile.partition)
        _record_last(st.state, "run", now, verdict, policy, False, seen)
        st.state["node"] = cfg.node
        want = apply.want_for(verdict)
        if (
            profile.remediation.enabled
            and want.action == apply.DRAIN
            and _ladder().waiting(st.state, profile, now)
        ):
            want = apply.Want(apply.HOLD, "")  # the reboot stune asked for is to come: the node is Slurm's
        why = apply.needs_sync(want, st.state, now)
        snapshot_of_state = dict(st.state)
        if not dry_run:  # a dry run judges and says what it would do; it moves no baseline
            st.save()
    outcome, error = None, None
    if why and not dry_run:
        try:
            outcome = apply.sync(slurm, cfg.node, want, snapshot_of_state, profile, now)
        except SlurmError as exc:
            error = str(exc)
    breaker = outcome.breaker if outcome is not None else None
    held_back = breaker is not None and not breaker.allowed
    breaker_message = ""
    with state.Locked(cfg.state_dir) as st:
        if outcome is not None:
            st.state["applied"] = snapshot_of_state["applied"]
            if "requeued" in snapshot_of_state:  # the jobs apply.sync requeued without this node
                st.state["requeued"] = snapshot_of_state["requeued"]
            st.state["breaker"] = {
                "open": held_back,
                "at": round(now, 3),
                "policy": policy,
                "message": breaker.message if breaker else "",
            }
        elif error is not None:
            applied = st.state.get("applied")
            applied = applied if isinstance(applied, dict) else {}
            applied["retry_at"] = round(now + apply.RETRY_S, 3)
            st.state["applied"] = applied
        elif want.action == apply.DRAIN and breaker_open(st.state, policy):
            held_back = True  # still held back, waiting for the retry: say so on every run
            breaker_message = st.state["breaker"].get("message", "")
        if not dry_run:
            st.save()
    if held_back and breaker is None:
        breaker = apply.Breaker(False, None, None, [], breaker_message)
    remedy = None
    if profile.remediation.enabled and not dry_run and not held_back and error is None:
        remedy = _ladder().act(cfg, slurm, profile, verdict, now)
    extra = {
        "action": want.action,
        "sync": why or "",
        "profile_from": how,
        "applied": [] if outcome is None else outcome.updates,
        "notes": [] if outcome is None else outcome.notes,
        "breaker": {
            "open": held_back,
            "message": breaker.message if breaker else "",
            "limit": breaker.limit if breaker else None,
            "recent": list(breaker.recent) if breaker else [],
        },
        "dry_run": dry_run,
        "error": error,
        "elapsed_s": round(time.monotonic() - start, 4),
        "transport": transport.counts(snapshot_of_state, profile, now),
        **_incident_outputs(snapshot_of_state, profile, now),
        **({"remediation": remedy} if remedy else {}),
    }
    doc = outputs.report(cfg.node, profile.partition, policy, "run", now, verdict, extra)
    if dry_run:
        return 0, doc
    problems = _outputs(cfg, doc, "run") + _publish_devices(cfg, profile, snap, environ)
    line = f"run {verdict.status}" + (f": {verdict.reason}" if verdict.reason else "")
    if why:
        line += f"; Slurm: {why}" + (f", changed {','.join(outcome.updates) or 'nothing'}" if outcome else "")
    held = [breaker_message] if held_back and outcome is None and breaker_message else []
    for note in (
        (outcome.notes if outcome else [])
        + held
        + ([f"Slurm error: {error}"] if error else [])
        + ([remedy["note"]] if remedy else [])
        + problems
    ):
        line += f"; {note}"
    state.log(cfg.state_dir, line, now)
    if held_back:
        return EXIT_BREAKER, doc
    return (1 if error else 0), doc
