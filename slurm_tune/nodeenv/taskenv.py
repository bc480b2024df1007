"""The node-side environment of one task: what stune-task-prolog and stune-env export.

On each node, for the partition's profile:
- NCCL_IB_HCA: the fabric HCA ports that are ACTIVE here, in exact-match form;
- NCCL_IB_GID_INDEX (roce, unless the profile fixes it): the RoCE v2, IPv4-mapped GID on each port's netdev;
- NCCL_SOCKET_IFNAME: the profile's interface, once it is seen to exist and be up.
A variable the user set is never touched: stune only sets one that is absent, or that stune itself set
(listed in STUNE_MANAGED by stune-sbatch). When nothing matches, a message says so and nothing is exported.
"""
from __future__ import annotations


from ..hw.sysfs import Sysfs, resolve_root
from ..thisnode import node_name
from .detect import Port, active_ports, gid_type, roce_v2_gid_index, socket_interfaces

MANAGED_VAR = "STUNE_MANAGED"  # the same name stune-sbatch writes (slurm_tune.sbatch.plan.MANAGED_VAR)


def may_set(name: str, environ) -> bool:
    managed = environ.get(MANAGED_VAR, "").split(",")
    return name not in environ or name in managed


def node_exports(environ, profile, sysfs: Sysfs | None = None) -> tuple[dict[str, str], list[str]]:
    """({NAME: value} to export, messages for the job's stderr)."""
    sysfs = sysfs or Sysfs(resolve_root(None, environ))
    node = node_name(environ)
    fabric = profile.fabric
    exports: dict[str, str] = {}
    messages: list[str] = []
    if fabric.type in ("ib", "roce"):
        ports = [Port(h.device, h.port, h.netdev) for h in fabric.hcas]
        active, down = active_ports(sysfs, ports)
        wants_hca = may_set("NCCL_IB_HCA", environ)
        if not active:
            messages.append(f"{node}: none of the fabric HCA ports is ACTIVE ({_states(down)}); "
                            "NCCL_IB_HCA is left as it was: NCCL will not find a usable RDMA port")
        elif wants_hca:
            exports["NCCL_IB_HCA"] = "=" + ",".join(str(p) for p in active)
            if down:
                messages.append(f"{node}: NCCL_IB_HCA narrowed to the ACTIVE ports; left out {_states(down)}")
        if fabric.type == "roce" and active:
            if fabric.gid_index is None:
                if may_set("NCCL_IB_GID_INDEX", environ):
                    index, problem = _gid_index(sysfs, active, node)
                    if index is not None:
                        exports["NCCL_IB_GID_INDEX"] = str(index)
                    if problem:
                        messages.append(problem)
            else:
                wrong = [str(p) for p in active if gid_type(sysfs, p, fabric.gid_index) != "RoCE v2"]
                if wrong:
                    messages.append(f"{node}: fabric.gid_index {fabric.gid_index} is not a RoCE v2 GID on "
                                    f"{', '.join(wrong)}")
    if fabric.socket_ifname and may_set("NCCL_SOCKET_IFNAME", environ):
        up, problem = socket_interfaces(sysfs, fabric.socket_ifname)
        if up:
            exports["NCCL_SOCKET_IFNAME"] = fabric.socket_ifname
        else:
            messages.append(f"{node}: {problem}; NCCL_SOCKET_IFNAME is left as it was")
    return exports, messages


def with_managed(exports: dict[str, str], environ) -> dict[str, str]:
    """`exports` plus STUNE_MANAGED naming them: the job's later steps inherit these values from the batch
    step, and must still re-detect them on their own nodes rather than take them for the user's."""
    if not exports:
        return exports
    managed = [n for n in environ.get(MANAGED_VAR, "").split(",") if n]
    managed += [n for n in exports if n not in managed]
    return dict(exports, **{MANAGED_VAR: ",".join(managed)})


def _states(down: dict[str, str]) -> str:
    return ", ".join(f"{port} {state}" for port, state in down.items())


def _gid_index(sysfs: Sysfs, active: list[Port], node: str) -> tuple[int | None, str]:
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
        return None, f"{node}: no RoCE v2 GID index found, NCCL_IB_GID_INDEX not set: {_first(missing)}"
    best = max(found, key=lambda i: (len(found[i]), -i))
    problems = []
    if len(found) > 1:
        others = "; ".join(f"{', '.join(ports)} use {i}" for i, ports in sorted(found.items()) if i != best)
        problems.append(f"{node}: the ports disagree on the RoCE v2 GID index: NCCL_IB_GID_INDEX={best} "
                        f"(from {', '.join(found[best])}) but {others}")
    if missing:
        problems.append(f"{node}: {_first(missing)}")
    return best, " | ".join(problems)


def _first(reasons: list[str], shown: int = 2) -> str:
    """A few reasons, then a count: eight ports that all lack the GID need not be eight sentences."""
    more = len(reasons) - shown
    return "; ".join(reasons[:shown]) + (f"; and {more} more port(s)" if more > 0 else "")


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def as_shell(exports: dict[str, str]) -> str:
    """`export NAME=value` lines for eval in a job script."""
    return "".join(f"export {name}={shell_quote(value)}\n" for name, value in exports.items())


def as_taskprolog(exports: dict[str, str]) -> str:
    """TaskProlog lines: Slurm takes the rest of an `export NAME=` line verbatim (no quoting, one line)."""
    return "".join(f"export {name}={value}\n" for name, value in exports.items() if "\n" not in value)


def task_environment(environ, profile, progress=None, sysfs: Sysfs | None = None) -> tuple[dict[str, str], list[str]]:
    """Everything a task gets on this node: the NCCL exports above, then the staged datasets
    (STUNE_STAGE_<NAME>) when the job asked for any or the profile stages some for every job. Staging
    writes its own messages to `progress`; raises StageRequiredError when --stage-required fails."""
    exports, messages = node_exports(environ, profile, sysfs)
    exports = with_managed(exports, environ)
    if environ.get("STUNE_STAGE", "").strip() or profile.cache.stage:
        from ..stage.jobenv import prepare_for_task

        staged, _ = prepare_for_task(environ, progress=progress)
        exports.update(staged)
    return exports, messages
