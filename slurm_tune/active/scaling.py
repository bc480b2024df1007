"""`stune-sweep scaling`: the partition's all-reduce scaling curve, as sweep jobs (docs/active.md).

The vendor's all-reduce tool (checks.ALLREDUCE: nccl-tests, rccl-tests, HCCL Test) measures the bus bandwidth
- within one node, at scaling.devices (capped at gpu.count, and the full node): one job on the first idle
  node, the agent running the points in turn with {gpus} filled;
- across nodes, at 1, 2, 4, ... nodes and the largest count allowed: one job per point, the multi-node command.
The multi-node jobs are submitted only when the single-node curve passes: a knee inside one node (or a curve
that failed or could not be measured) would be read as the fabric's, and the cluster's time spent for nothing.

The jobs are sweep jobs (jobs.py: exclusive, nice, no requeue, a deadline, the reservation, the GRES), run by
the agent (agent.py, each run under its deadline). The judgement is scaling_judge.py's; each curve is stored as
one record (store.append(kind="scaling")).
"""

from __future__ import annotations

import os
import string
import time
from collections import namedtuple

from ..accelspec import AMD, ASCEND, NVIDIA
from ..errors import StuneError
from ..hostlist import compress_hostlist
from . import jobs, judge, store
from . import scaling_judge as sj
from .checks import ALLREDUCE, CATALOGUE
from .sweep import Options as SweepOptions
from .sweep import idle_nodes

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

# The multi-node command per vendor ({gpus} per node, {nodes}, {ranks} = gpus x nodes): nccl_pair's launch for
# nccl-tests and rccl-tests (one task per device, srun spans the job's nodes); HCCL Test through mpirun, which
# takes the nodes from the Slurm allocation.
MULTINODE = {
    NVIDIA: "srun --overlap --ntasks-per-node={gpus} all_reduce_perf -b 1G -e 8G -f 2 -g 1",
    AMD: "srun --overlap --ntasks-per-node={gpus} all_reduce_perf -b 1G -e 8G -f 2 -g 1",
    ASCEND: "mpirun -n {ranks} --map-by ppr:{gpus}:node all_reduce_test -b 8K -e 1G -f 2 -d fp32 -o sum "
    "-p {gpus}",
}
PLACEHOLDERS = ("gpus", "nodes", "ranks")
Setting = namedtuple("Setting", "time_limit command")


class Options(SweepOptions):
    def __init__(self, partition, store, *, max_nodes=None, **kw):
        super().__init__(partition, store, **kw)
        self.max_nodes = max_nodes


def commands(profile: Profile) -> tuple[str, str, str]:
    """(check name, single-node command, multi-node command) for the partition's vendor; a command with a
    placeholder stune does not fill is refused in one line naming the profile key."""
    name = ALLREDUCE.get(profile.accelerator)
    if name is None:
        raise StuneError(
            f"partition {profile.name}: no all-reduce check for accelerator {profile.accelerator}"
        )
    sc = profile.scaling
    own = profile.active.checks.get(name)
    single = sc.command or (own.command if own is not None and own.command else CATALOGUE[name].command)
    multi = sc.multinode_command or MULTINODE[profile.accelerator]
    for key, text in (("scaling.command", single), ("scaling.multinode_command", multi)):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        except ValueError as exc:
            raise StuneError(f"{profile.source}: {key}: {exc}") from None
        bad = [f for f in fields if f not in PLACEHOLDERS]
        if bad:
            raise StuneError(
                f"{profile.source}: {key}: unknown placeholder {{{bad[0]}}} (it may use "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                + ")"
            )
    return name, single, multi


def _spec(profile, opts, name, command, nodes, sweep_id, points=None) -> dict:
    sc = profile.scaling
    spec = jobs.job_spec(
        profile, opts, CATALOGUE[name], Setting(sc.time_limit, command), nodes[0], nodes, sweep_id, {}
    )
    per_run = sc.time_limit / max(1, len(points or ())) - jobs.RUN_SLACK_S
    spec.update(runs=1, scaling=True, run_timeout=max(5.0, per_run), subject=",".join(nodes))
    if points:
        spec["points"] = list(points)
    return spec


def _submit(slurm, profile, opts, spec, nodes, label) -> tuple[int | None, list[str]]:
    check = CATALOGUE[spec["check"]]
    args = jobs.sbatch_args(profile, opts, check, profile.scaling.time_limit, nodes, f"stune-scaling:{label}")
    if opts.dry_run:
        return None, args
    return slurm.submit(args, script=jobs.agent_script(opts.agent, spec)), args


def _fingerprint(results: list[dict]) -> dict:
    ok = [r for r in results if r["status"] == "ok"] or results
    return dict(ok[0].get("fingerprint") or {}) if ok else {}


def run(slurm, profile: Profile, opts: Options, now: float | None = None, log=print) -> dict:
    """Measure both curves, store one record each; {"sweep", "curves": [node record, nodes record]}."""
    now = time.time() if now is None else now
    sweep_id = "scaling-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"-{os.getpid()}"
    name, single, multi = commands(profile)
    vendor, sc = profile.accelerator, profile.scaling
    nodes = idle_nodes(slurm, opts.partition, opts.reservation or profile.active.reservation, opts.nodes)
    if not nodes:
        raise StuneError(f"partition {opts.partition}: no idle node to measure the scaling curve on")
    devices = sj.device_points(sc.devices, profile.gpu.count)
    counts = sj.node_counts(len(nodes), opts.max_nodes or sc.max_nodes)
    log(
        f"scaling {sweep_id}: {name} on {opts.partition}: {len(nodes)} idle node(s) {compress_hostlist(nodes)}"
    )
    if not opts.dry_run:
        os.makedirs(opts.spool, mode=0o755, exist_ok=True)
    spec = _spec(profile, opts, name, single, nodes[:1], sweep_id, devices)
    job, args = _submit(slurm, profile, opts, spec, nodes[:1], "node")
    if opts.dry_run:
        log(
            f"would submit the single-node curve on {nodes[0]} ({','.join(map(str, devices))} devices): sbatch {' '.join(args)}"
        )
        for n in counts if len(nodes) > 1 else ():
            _, args = _submit(
                slurm,
                profile,
                opts,
                _spec(profile, opts, name, multi, nodes[:n], sweep_id),
                nodes[:n],
                f"{n}",
            )
            log(f"then, if it passes, {n} node(s) {compress_hostlist(nodes[:n])}: sbatch {' '.join(args)}")
        return {"sweep": sweep_id, "curves": [], "dry_run": True}
    assert job is not None
    jobs.wait_jobs(slurm, [job], opts.wait_s if opts.wait_s is not None else sc.time_limit + 120)
    results = [r for r in jobs.read_marks(opts.spool, job) if r["check"] == name]
    by_point = {r.get("point"): r for r in reversed(results)}
    points = [sj.point(d, nodes[:1], by_point.get(d), vendor, d) for d in devices]
    judged = sj.judge_curve(points, sj.NODE, sc.knee)
    node_rec = sj.record(
        now, opts.partition, sweep_id, sj.NODE, name, points, judged,
        sj.knee_of(points, judged, sj.NODE, None, []), _fingerprint(results),
    )  # fmt: skip
    log(f"single-node curve on {nodes[0]}: {judged['verdict']}")
    if judged["verdict"] != "pass":
        why = f"not run: the single-node curve did not pass ({judged['verdict']}: {judged['detail']})"
        nodes_rec = sj.skipped(now, opts.partition, sweep_id, name, why)
    elif len(nodes) < 2:
        nodes_rec = sj.skipped(now, opts.partition, sweep_id, name, "not run: one idle node only")
    else:
        full = points[-1]["value"] if points[-1]["status"] == "ok" and points[-1]["n"] > 1 else None
        log(f"multi-node curve: {','.join(map(str, counts))} nodes")
        nodes_rec = _multinode(slurm, profile, opts, sweep_id, name, multi, nodes, counts, full, now)
    store.append(opts.store, opts.partition, [node_rec, nodes_rec], kind="scaling")
    return {"sweep": sweep_id, "curves": [node_rec, nodes_rec]}


def _multinode(slurm, profile, opts, sweep_id, name, multi, nodes, counts, full, now) -> dict:
    sc, vendor, gpus = profile.scaling, profile.accelerator, profile.gpu.count or 1
    submitted = []
    for n in counts:
        spec = _spec(profile, opts, name, multi, nodes[:n], sweep_id)
        job, _ = _submit(slurm, profile, opts, spec, nodes[:n], str(n))
        submitted.append((n, job))
    ids = [j for _, j in submitted if j is not None]
    jobs.wait_jobs(slurm, ids, opts.wait_s if opts.wait_s is not None else sc.time_limit * len(ids) + 120)
    points, results = [], []
    for n, job in submitted:
        found = [r for r in jobs.read_marks(opts.spool, job) if r["check"] == name] if job is not None else []
        results += found
        points.append(sj.point(n, nodes[:n], found[0] if found else None, vendor, n * gpus))
    judged = sj.judge_curve(points, sj.NODES, sc.knee, fallback=full)
    topology: list[dict] | None = None
    verdicts: list = []
    if judged["knee_at"] is not None:  # only then: who joined, under which switches, which pairs were slow
        topology = sj.parse_topology(slurm.topology())
        history = store.load(opts.store, opts.partition, since=now - profile.active.window)
        _, verdicts = judge.judge(history, judge.Settings.from_profile(profile))
    knee = sj.knee_of(points, judged, sj.NODES, topology, verdicts)
    return sj.record(
        now, opts.partition, sweep_id, sj.NODES, name, points, judged, knee, _fingerprint(results)
    )


def exit_attention(curves: list[dict]) -> bool:
    """Attention (exit 3): a knee or a failure in either curve, or a single-node curve that did not pass (the
    multi-node curve then did not run)."""
    node = [c for c in curves if c["scope"] == sj.NODE]
    return any(c["verdict"] in ("knee", "fail") for c in curves) or any(c["verdict"] != "pass" for c in node)
