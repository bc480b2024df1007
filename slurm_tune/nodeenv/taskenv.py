"""The node-side environment of one task: what stune-task-prolog and stune-env export.

The node side of the environment rule table (envrules.py: its rows decided `node` or `submit, node`, by the
same conditions and the one `=device:port` form). On each node, for the partition's profile:
- NCCL_IB_HCA: the fabric HCA ports that are ACTIVE here, in exact-match form (none ACTIVE: unset);
- NCCL_IB_GID_INDEX (roce, unless the profile fixes it): the RoCE v2, IPv4-mapped GID on each port's netdev;
- NCCL_SOCKET_IFNAME: the profile's interface, once it is seen to exist and be up (else unset);
- GLOO_SOCKET_IFNAME: the first interface up that matches the profile's (gloo takes exact names);
- MASTER_ADDR, MASTER_PORT: once per job (set when absent; later steps inherit the batch step's).
A variable the user set is never touched: stune only sets one that is absent, or whose value is still the
one stune set (STUNE_MANAGED records names and values). When the node proves a value stune set wrong, it is
unset (a value None in the exports) and a message says so.

Everything here takes the job context (thisnode.JobContext) its entry point built: the environment, node,
partition's profile and job id are never re-derived below it.
"""

from __future__ import annotations

from ..hw.sysfs import Sysfs, resolve_root
from ..thisnode import STAGE_VAR, JobContext
from .detect import Port, active_ports, gid_type, ipv4_address, roce_v2_gid_index, socket_interfaces
from .envrules import (
    TRANSPORT_LOG_LEVEL,
    TRANSPORT_LOG_SUBSYS,
    ascend,
    gid_detected,
    gid_fixed,
    hca_value,
    nccl,
    rdma,
    socket,
)
from .managed import (
    BATCH_STEP_IDS,
    MANAGED_VAR,
    MASTER_PORT_BASE,
    MASTER_PORT_SPAN,
    OWNER,
    RENDEZVOUS,
    format_managed,
    inherited_from_another_job,
    is_stunes,
    parse_managed,
)


def node_exports(
    job, sysfs: Sysfs | None = None, address_of=None, slurm=None
) -> tuple[dict[str, str | None], list[str]]:
    """For `job` (a JobContext with its profile): ({NAME: value, or None to unset it}, messages for the
    job's stderr). Messages do not name the node: the caller says where (and may say a message once per
    job). `sysfs` defaults to $STUNE_SYSFS_ROOT (`%n`: the job's node). On an Ascend partition the NCCL rows
    give way to HCCL's (nodeenv/ascendenv.py, which asks Slurm through `slurm` or an adapter of its own)."""
    environ = job.environ
    sysfs = sysfs or Sysfs(resolve_root(None, environ, job.node))
    managed = parse_managed(environ.get(MANAGED_VAR), environ)

    def mine(name: str) -> bool:  # stune may (re)set it
        return is_stunes(name, environ, managed)

    def unset(name: str, why: str) -> None:  # a value stune set is proven wrong here
        if mine(name):  # the same words whether this step still had it or an earlier one unset it: said once
            if name in environ:
                exports[name] = None
            messages.append(f"{name} unset: {why}")
        else:
            messages.append(f"{why}; {name} is yours: left as you set it")

    fabric = job.profile.fabric
    exports: dict[str, str | None] = {}
    messages: list[str] = []
    uses_nccl = nccl(job.profile)
    if rdma(fabric) and uses_nccl:
        ports = [Port(h.device, h.port, h.netdev) for h in fabric.hcas]
        active, down = active_ports(sysfs, ports)
        if not active:
            unset(
                "NCCL_IB_HCA",
                f"none of the fabric HCA ports is ACTIVE ({_states(down)}): NCCL will not find a "
                "usable RDMA port of the fabric",
            )
        elif mine("NCCL_IB_HCA"):
            exports["NCCL_IB_HCA"] = hca_value(active)
            if down:
                messages.append(f"NCCL_IB_HCA narrowed to the ACTIVE ports; left out {_states(down)}")
        if active and gid_detected(fabric) and mine("NCCL_IB_GID_INDEX"):
            index, problem = _gid_index(sysfs, active)
            if index is not None:
                exports["NCCL_IB_GID_INDEX"] = str(index)
            if problem:
                messages.append(problem)
        elif active and gid_fixed(fabric):
            wrong = [str(p) for p in active if gid_type(sysfs, p, fabric.gid_index) != "RoCE v2"]
            if wrong:
                messages.append(
                    f"fabric.gid_index {fabric.gid_index} is not a RoCE v2 GID on {', '.join(wrong)}"
                )
    up: list[str] = []
    if socket(fabric):
        up, problem = socket_interfaces(sysfs, fabric.socket_ifname)
        if up:
            if mine("NCCL_SOCKET_IFNAME") and uses_nccl:
                exports["NCCL_SOCKET_IFNAME"] = fabric.socket_ifname
            if mine("GLOO_SOCKET_IFNAME"):
                exports["GLOO_SOCKET_IFNAME"] = up[0]
        else:
            if uses_nccl:
                unset("NCCL_SOCKET_IFNAME", f"{problem}: NCCL picks an interface itself")
            if "GLOO_SOCKET_IFNAME" in environ and mine("GLOO_SOCKET_IFNAME"):
                exports["GLOO_SOCKET_IFNAME"] = None
    if address_of is None and (sysfs.root or "/").rstrip("/"):
        address_of = _no_address  # a relocated (fixture) tree: the kernel's interfaces are not the tree's
    exports.update(rendezvous(job, up, address_of))
    job_files(job, mine, exports, messages)
    if ascend(job.profile):
        from . import ascendenv  # an Ascend partition's task only (HCCL, its NPUs, the rank table)

        ascendenv.exports(job, sysfs, address_of, mine, exports, messages, slurm)
    return exports, messages


TRANSPORT_LOG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def job_files(job, mine, exports: dict[str, str | None], messages: list[str]) -> None:
    """STUNE_STEPS_FILE, and for a multi-node job NCCL's transport log, into the job's directory on this node
    (usage/jobdir.py), when the prolog made it and it is this user's. The user's NCCL_DEBUG or
    NCCL_DEBUG_FILE wins: then stune sets none of the three, takes back the ones it set in an earlier step,
    and the job's transport is not judged."""
    from ..usage.jobdir import NCCL_LOG_PATTERN, STEPS_FILE, job_dir, usable_by_me

    environ = job.environ
    if job.job_id is None:
        return
    path = job_dir(job.job_id, environ, job.node)
    if not usable_by_me(path):
        return
    if mine("STUNE_STEPS_FILE"):
        exports["STUNE_STEPS_FILE"] = f"{path}/{STEPS_FILE}"
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
    if not (job.profile.nccl.transport_log and nccl(job.profile) and nodes.isdigit() and int(nodes) > 1):
        return
    if mine("NCCL_DEBUG") and mine("NCCL_DEBUG_FILE"):
        exports["NCCL_DEBUG"] = TRANSPORT_LOG_LEVEL
        if mine("NCCL_DEBUG_SUBSYS"):
            exports["NCCL_DEBUG_SUBSYS"] = TRANSPORT_LOG_SUBSYS
        exports["NCCL_DEBUG_FILE"] = f"{path}/{NCCL_LOG_PATTERN}"
        return
    yours = [n for n in ("NCCL_DEBUG", "NCCL_DEBUG_FILE") if not mine(n)]
    for name in TRANSPORT_LOG_VARS:
        if name in environ and mine(name):  # stune's value from an earlier step: the user's now decides
            exports[name] = None
    messages.append(
        " and ".join(f"{n}={environ[n]}" for n in yours)
        + " is yours: NCCL logs as you asked, and the job's transport is not judged"
    )


def _no_address(ifname: str) -> None:
    return None


def rendezvous(job, interfaces: list[str], address_of=None) -> dict[str, str]:
    """MASTER_ADDR and MASTER_PORT for `job` (a JobContext), when absent (a later step inherits the batch
    step's, and a value set in the script is the user's). One value per job, the same on every rank:
    MASTER_ADDR is the job's first node, as its IPv4 address on the first up socket interface when the batch
    step sets it there (the batch step runs on the first node, and every later step inherits its value:
    stune-sbatch names MASTER_ADDR in an --export list too); in a step that did not inherit it (`srun
    --export=NONE`, no batch step) every rank takes the first node's name, as no rank can see the first
    node's interfaces but the first."""
    environ = job.environ
    out: dict[str, str] = {}
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    if "MASTER_ADDR" not in environ and nodelist:
        from ..hostlist import expand_hostlist

        first = (expand_hostlist(nodelist) or [""])[0]
        address = None
        batch_step = environ.get("SLURM_STEP_ID", "") in BATCH_STEP_IDS | {""}
        if first and first == job.node and interfaces and batch_step:
            address = (address_of or ipv4_address)(interfaces[0])
        if address or first:
            out["MASTER_ADDR"] = address or first
    if "MASTER_PORT" not in environ and job.job_id is not None:
        out["MASTER_PORT"] = str(MASTER_PORT_BASE + int(job.job_id) % MASTER_PORT_SPAN)
    return out


def with_managed(exports: dict[str, str | None], environ, job_id: str | None = None) -> dict[str, str | None]:
    """`exports` (node_exports') plus STUNE_MANAGED recording their values and the job (OWNER): the job's
    later steps inherit these values from the batch step, and re-detect them on their own nodes only while
    they still have stune's value. The rendezvous is recorded by name only: set once per job, never refined.
    A STUNE_MANAGED another job wrote is rewritten for this one even with nothing to export."""
    managed = parse_managed(environ.get(MANAGED_VAR), environ)
    owner = managed.pop(OWNER, None)
    if not exports and (not managed or job_id is None or owner == job_id):
        return exports
    if job_id is not None:
        managed = {OWNER: job_id, **managed}
    for name, value in exports.items():
        if name in RENDEZVOUS:
            managed.setdefault(name, None)
            continue
        managed[name] = value
    return dict(exports, **{MANAGED_VAR: format_managed(managed)})


def _states(down: dict[str, str]) -> str:
    return ", ".join(f"{port} {state}" for port, state in down.items())


def _gid_index(sysfs: Sysfs, active: list[Port]) -> tuple[int | None, str]:
    """One GID index for every ACTIVE port (NCCL takes one for all). When the ports disagree the most common
    index wins and the message names the ports that differ."""
    found: dict[int, list[str]] = {}
    missing = []
    for port in active:
        index, why = roce_v2_gid_index(sysfs, port)
        if index is None:
            missing.append(why)
        else:
            found.setdefault(index, []).append(str(port))
    if not found:
        return None, f"no RoCE v2 GID index found, NCCL_IB_GID_INDEX not set: {_first(missing)}"
    best = max(found, key=lambda i: (len(found[i]), -i))
    problems = []
    if len(found) > 1:
        others = "; ".join(f"{', '.join(ports)} use {i}" for i, ports in sorted(found.items()) if i != best)
        problems.append(
            f"the ports disagree on the RoCE v2 GID index: NCCL_IB_GID_INDEX={best} "
            f"(from {', '.join(found[best])}) but {others}"
        )
    if missing:
        problems.append(_first(missing))
    return best, " | ".join(problems)


def _first(reasons: list[str], shown: int = 2) -> str:
    """A few reasons, then a count: eight ports that all lack the GID need not be eight sentences."""
    more = len(reasons) - shown
    return "; ".join(reasons[:shown]) + (f"; and {more} more port(s)" if more > 0 else "")


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def as_shell(exports: dict[str, str | None]) -> str:
    """`export NAME=value` (or `unset NAME`) lines for eval in a job script."""
    return "".join(
        f"unset {name}\n" if value is None else f"export {name}={shell_quote(value)}\n"
        for name, value in exports.items()
    )


def as_taskprolog(exports: dict[str, str | None]) -> str:
    """TaskProlog lines: Slurm takes the rest of an `export NAME=` line verbatim (no quoting, one line), and
    `unset NAME` removes a variable."""
    return "".join(
        f"unset {name}\n" if value is None else f"export {name}={value}\n"
        for name, value in exports.items()
        if value is None or "\n" not in value
    )


def plain_job_exports(job) -> dict[str, str]:
    """For a job that did not come through stune-sbatch (no STUNE_MANAGED) on a site that enabled stune's
    cli_filter: the variables stune-sbatch would have set at submission that the job lacks. The filter gives
    a plain sbatch job these here rather than as --export items: sbatch reads any --export list as
    --get-user-env (SLURM_GET_USER_ENV=1), and the node would load the user's login environment. A variable
    the job has (the user's, or the filter's --export item) is kept; the batch step's values, recorded in
    STUNE_MANAGED, go to every later step, which then skips this."""
    environ = job.environ
    if MANAGED_VAR in environ:
        return {}
    from ..clifilter.render import enabled_here, plain_job_environment

    if not enabled_here(environ):
        return {}
    return {name: value for name, value in plain_job_environment(job.profile).items() if name not in environ}


def task_environment(
    job, progress=None, sysfs: Sysfs | None = None
) -> tuple[dict[str, str | None], list[str]]:
    """Everything a task of `job` (a JobContext with its profile) gets on this node: the NCCL exports above,
    then the staged datasets (STUNE_STAGE_<NAME>) when the job asked for any or the profile stages some for
    every job. Staging writes its own messages to `progress`; raises StageRequiredError when
    --stage-required fails."""
    parents = inherited_from_another_job(job.environ, job.job_id)
    if parents:  # a submission from inside a stune job that did not go through stune-sbatch: not this job's
        environ = {k: v for k, v in job.environ.items() if k not in parents and k != MANAGED_VAR}
        job = JobContext(environ, job.node, job.partition, job.job_id, job.profile, job.profile_error)
    exports, messages = node_exports(job, sysfs)
    exports = dict(plain_job_exports(job), **exports)
    # what the parent's stune set and this job's does not: unset (another partition's settings)
    exports.update({name: None for name in parents if name not in exports})
    exports = with_managed(exports, job.environ, job.job_id)
    if job.environ.get(STAGE_VAR, "").strip() or job.profile.cache.stage:
        from ..stage.jobenv import prepare_for_task

        staged, _ = prepare_for_task(job, progress=progress)
        exports.update(staged)
    return exports, messages
