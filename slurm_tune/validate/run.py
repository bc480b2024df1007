"""`stune-validate run`: one Slurm job per chosen node (the sweep's job arguments: the whole node, far below
every user job, no requeue, a deadline; active/jobs.py), each running the agent (agent.py) for the chosen
layers; then the agents' records read back from the spool, judged (judge.py) against fp64 and the reference,
and stored (kind "validate"). A job that left no record gives an unknown record per layer.

The reference: the newest passing record of the layer from the partition `validate.reference` names, or with
`against_previous` this partition's own newest passing one from before this run. With neither, layer 2's run
is recorded as the partition's reference.
"""

from __future__ import annotations

import os
import sys
import time

from ..active import jobs, store
from ..active.sweep import idle_nodes
from ..errors import ConfigError, StuneError
from ..output import compact_json
from . import judge
from .agent import RECORD_MARK, base_record
from .records import latest, valid_record

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

LAYERS = ("ops", "converge")
OPS_SHARE, OPS_MAX_S, SLACK_S = 0.3, 180.0, 30.0


class Options:
    def __init__(
        self,
        partition: str,
        store: str,
        layers=LAYERS,
        nodes=None,
        reservation=None,
        wait_s=None,
        against_previous=False,
        spool=None,
        agent=None,
        dry_run=False,
    ):
        self.partition, self.store, self.layers, self.nodes = partition, store, tuple(layers), nodes
        self.reservation, self.wait_s, self.against_previous = reservation, wait_s, against_previous
        self.spool, self.dry_run = spool or os.path.join(store, "spool"), dry_run
        self.agent = agent or [sys.executable, "-m", "slurm_tune.cli.validate", "agent"]


def tolerances(profile: Profile) -> dict:
    """validate.tolerances as {"op.dtype": {abs, rel}}; a key naming no operator of the suite is refused in
    one line naming the profile and the key (a typo would otherwise loosen nothing, silently)."""
    out = profile.validate.tolerances.to_dict()
    for key in out:
        op, _, dtype = key.partition(".")
        known = {k.split(".")[0] for k in judge.DEFAULT_TOLERANCES}
        if op not in known or dtype not in judge.FALLBACK:
            where = profile.lines.get(f"validate.tolerances.{key}") or [profile.source, None]
            raise ConfigError(
                where[0],
                where[1],
                f"validate.tolerances.{key}",
                f"not an operator.dtype of the suite (operators {', '.join(sorted(known))}; dtypes "
                f"{', '.join(judge.FALLBACK)})",
            )
    return out


def python_of(profile: Profile) -> tuple[str | None, str]:
    if profile.validate.python:
        return profile.validate.python, "validate.python"
    tool = profile.active.tools.get("python")
    return (tool, "active.tools.python") if tool else (None, "")


def spec(profile: Profile, opts: Options) -> dict:
    v = profile.validate
    ops_s = min(OPS_MAX_S, OPS_SHARE * v.time_limit) if "converge" in opts.layers else v.time_limit - SLACK_S
    python, source = python_of(profile)
    return {
        "partition": opts.partition,
        "layers": list(opts.layers),
        "python": python,
        "python_from": source,
        "seed": v.seed,
        "steps": v.steps,
        "cold_steps": v.cold_steps,
        "band": v.band,
        "accelerator": profile.accelerator,
        "timeouts": {"ops": max(5.0, ops_s), "converge": max(5.0, v.time_limit - ops_s - SLACK_S)},
    }


def choose_nodes(slurm, opts: Options, reservation: str | None) -> list[str]:
    """The idle nodes asked for (`--nodes`), else one idle node of the partition."""
    idle = idle_nodes(slurm, opts.partition, reservation, opts.nodes)
    if opts.nodes:
        busy = sorted(set(opts.nodes) - set(idle))
        if busy:
            raise StuneError(
                f"not idle in partition {opts.partition}{' and reservation ' + reservation if reservation else ''}"
                f": {','.join(busy)} (a validation job takes the whole node; pick idle ones)"
            )
        return idle
    if not idle:
        raise StuneError(f"no idle node in partition {opts.partition} to validate on (or name one: --nodes)")
    return idle[:1]


def submit(slurm, profile: Profile, opts: Options, nodes: list[str], log=print) -> dict:
    """{job_id: node}, one job per node (with dry_run: none, each said)."""
    if not opts.dry_run:
        os.makedirs(opts.spool, mode=0o755, exist_ok=True)
    job_spec = spec(profile, opts)
    a = profile.active
    script = jobs.job_script([*opts.agent, "--spec", compact_json(job_spec)])
    out = {}
    for node in nodes:
        args = jobs.job_args(
            opts.partition,
            [node],
            profile.validate.time_limit,
            "stune-validate",
            opts.spool,
            nice=a.nice,
            qos=a.qos,
            reservation=opts.reservation or a.reservation,
            gres=jobs.partition_gres(profile),
        )
        if opts.dry_run:
            log(f"would submit on {node}: sbatch {' '.join(args)}")
            continue
        out[slurm.submit(args, script=script)] = node
    if opts.dry_run:
        log(f"the agent's spec: {compact_json(job_spec)}")
    return out


def collect(spool: str, submitted: dict, job_spec: dict) -> list[dict]:
    out: list[dict] = []
    for job_id, node in submitted.items():
        found = {}
        for r in jobs.read_marked(spool, job_id, RECORD_MARK):
            if valid_record(r, raw=True) and r["layer"] in job_spec["layers"] and r["node"] == node:
                found[r["layer"]] = dict(r, job=str(job_id), partition=job_spec["partition"])
        for layer in job_spec["layers"]:
            if layer not in found:
                found[layer] = dict(
                    base_record(job_spec, layer, node, str(job_id), {}),
                    detail="the job left no result (cancelled, not started in time, or killed at its limit)",
                )
        out.extend(found[layer] for layer in job_spec["layers"])
    return out


def references(profile: Profile, opts: Options, before: float) -> tuple[dict, str]:
    """{layer: the reference record or None}, and whose it is ('' when layer 2 records this run instead)."""
    if opts.against_previous:
        label, partition = f"{opts.partition} (previous run)", opts.partition
    elif profile.validate.reference:
        label = partition = profile.validate.reference
    else:
        return dict.fromkeys(LAYERS), ""
    stored = store.load(opts.store, partition, until=before, kind="validate", accept=valid_record)
    stored = [r for r in stored if r["at"] < before]
    return {layer: latest(stored, layer, passed=True) for layer in LAYERS}, label


def judge_records(records: list[dict], profile: Profile, refs: dict, label: str) -> list[dict]:
    overrides = tolerances(profile)
    out = []
    for r in records:
        if r["layer"] == "ops":
            out.append(judge.judge_ops(r, overrides, refs.get("ops"), label))
        else:
            out.append(judge.judge_converge(r, refs.get("converge"), profile.validate.band, label, not label))
    return out


def run(slurm, profile: Profile, opts: Options, log=print) -> list[dict]:
    started = time.time()
    tolerances(profile)  # a bad key stops before anything is submitted
    reservation = opts.reservation or profile.active.reservation
    nodes = choose_nodes(slurm, opts, reservation)
    log(f"validating {opts.partition} ({', '.join(opts.layers)}) on {','.join(nodes)}")
    submitted = submit(slurm, profile, opts, nodes, log)
    if opts.dry_run:
        return []
    wait = opts.wait_s if opts.wait_s is not None else profile.validate.time_limit * len(submitted) + 120
    jobs.wait_jobs(slurm, list(submitted), wait)
    records = collect(opts.spool, submitted, spec(profile, opts))
    refs, label = references(profile, opts, started)
    judged = judge_records(records, profile, refs, label)
    store.append(opts.store, opts.partition, judged, kind="validate")
    return judged
