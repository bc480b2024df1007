"""The node side of an Ascend partition's rules (envrules.py): HCCL_IF_IP, ASCEND_RT_VISIBLE_DEVICES and
RANK_TABLE_FILE, for stune-task-prolog and stune-env (taskenv.node_exports calls `exports` on such a partition).

Which NPUs a job holds: Slurm puts nothing naming a gres/npu job's devices in any environment (measured on
22.05.8 and 26.05.5: tests/fixtures/slurm-gres/README.md); `scontrol show job -d` does, for every node
(`Nodes=n1 ... GRES=npu:2(IDX:0-1)`). It is asked once per job and node, through the one Slurm adapter, and
its answer kept in the job's directory on the node (usage/jobdir.py), where the job's later tasks read it.
A site that schedules its NPUs as gres/gpu (`gpu.gres: gpu`) has them in SLURM_JOB_GPUS, and for a
single-node job no question is asked. The ids are Slurm's GRES ids, the positions of gres.conf's files: with
`File=/dev/davinci[0-7]` in order, the davinci numbers ASCEND_RT_VISIBLE_DEVICES takes.

Off the other vendors' path (a cold branch of the TaskProlog: tests/test_imports.py).
"""

from __future__ import annotations

import os

from ..safeio import read_small, write_atomic
from ..usage.jobdir import job_dir, usable_by_me
from ..usage.spool import gres_ids_from_detail, parse_gpu_ids
from ..vendors import DEFAULT_GRES
from . import ranktable
from .detect import ipv4_address, socket_interfaces

DETAIL_FILE = "slurm-job-detail.txt"  # `scontrol show job -d`'s answer, in the job's directory
RANK_TABLE = "rank_table.json"
DEFAULT_SPOOL = "/var/spool/stune/usage"  # usage.spool_dir's default (usage/config.py)
SCONTROL_TIMEOUT_S = 10.0


def spool_dir(environ, node: str) -> str:
    from ..thisnode import expand

    return expand(environ.get("STUNE_USAGE_SPOOL") or DEFAULT_SPOOL, node, environ)


def multi_node(environ) -> bool:
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
    return nodes.isdigit() and int(nodes) > 1


class Allocation:
    """What Slurm says of one job's devices: `on(node)` -> the GRES ids it holds there (None: not known, and
    `why`). `slurm`: an adapter (tests give a stand-in); made from the environment when needed."""

    def __init__(self, job, gres: str, slurm=None):
        self.job, self.gres, self.slurm = job, gres, slurm
        self.detail: str | None = None
        self.why = ""

    def on(self, node: str) -> list[int] | None:
        environ = self.job.environ
        if self.gres == "gpu" and node == self.job.node and environ.get("SLURM_JOB_GPUS"):
            try:
                return parse_gpu_ids(environ["SLURM_JOB_GPUS"])
            except ValueError:
                pass
        text = self._detail()
        if text is None:
            return None
        ids = gres_ids_from_detail(text, node, self.gres)
        if ids is None:
            self.why = f"scontrol show job -d {self.job.job_id} gives no {self.gres} allocation on {node}"
        return ids

    def _detail(self) -> str | None:
        if self.detail is not None:
            return self.detail
        job = self.job
        directory = job_dir(job.job_id, job.environ, job.node) if job.job_id else ""
        cache = os.path.join(directory, DETAIL_FILE) if directory and usable_by_me(directory) else None
        kept = read_small(cache, owner=os.geteuid(), single_link=True) if cache else None
        if kept:
            self.detail = kept.decode("utf-8", "replace")
            return self.detail
        try:
            if self.slurm is None:
                from ..slurm import Slurm

                self.slurm = Slurm.from_env(timeout=SCONTROL_TIMEOUT_S)
            rc, out, err = self.slurm.run_full(["scontrol", "show", "job", "-d", str(job.job_id)])
        except Exception as exc:  # Slurm not reachable from the task: said, the variables left unset
            self.why = f"scontrol show job -d {job.job_id}: {exc}"
            return None
        if rc != 0:
            self.why = f"scontrol show job -d {job.job_id}: {(err or out).strip()[:200] or f'exit {rc}'}"
            return None
        self.detail = out
        if cache:
            try:
                write_atomic(cache, out, mode=0o600)
            except OSError:
                pass  # only a cache: the next task asks again
        return out


def exports(job, sysfs, address_of, mine, out: dict, messages: list, slurm=None) -> None:
    """Add the Ascend node-side variables for `job` (a JobContext on an `accelerator: ascend` partition) to
    `out`; `mine(name)`: stune may set it (the user's value wins); `messages` for the job's stderr."""
    profile, environ = job.profile, job.environ
    ifname = profile.hccl.socket_ifname or profile.fabric.socket_ifname
    if profile.hccl.if_ip and ifname and mine("HCCL_IF_IP"):
        up, problem = socket_interfaces(sysfs, ifname)
        address = (address_of or ipv4_address)(up[0]) if up else None
        if address:
            out["HCCL_IF_IP"] = address
        else:
            messages.append(f"HCCL_IF_IP not set: {problem or f'{up[0]} has no IPv4 address'}")
    if job.job_id is None:
        return
    alloc = Allocation(job, profile.gpu.gres or DEFAULT_GRES[profile.accelerator], slurm)
    if mine("ASCEND_RT_VISIBLE_DEVICES"):
        ids = alloc.on(job.node)
        if ids:
            out["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
        elif ids is None:
            messages.append(f"ASCEND_RT_VISIBLE_DEVICES not set: {alloc.why}")
    if profile.hccl.rank_table and multi_node(environ) and mine("RANK_TABLE_FILE"):
        path, why = rank_table(job, alloc)
        if path:
            out["RANK_TABLE_FILE"] = path
        else:
            messages.append(f"RANK_TABLE_FILE not set: {why}")


def rank_table(job, alloc: Allocation) -> tuple[str | None, str]:
    """(the job's rank table on this node, "") or (None, why): built from the allocation of every node of the job
    and their published device maps, written once per job into the job's directory (0600), the same on every
    node."""
    from ..hostlist import expand_hostlist

    environ = job.environ
    directory = job_dir(job.job_id, environ, job.node)
    if not usable_by_me(directory):
        return None, f"the job's directory {directory} is not there (the prolog makes it)"
    path = os.path.join(directory, RANK_TABLE)
    if read_small(path, owner=os.geteuid(), single_link=True):
        return path, ""
    try:
        nodes = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")
    except ValueError:
        nodes = []
    if not nodes:
        return None, "the job's node list is not in the environment"
    spool = spool_dir(environ, job.node)
    servers = []
    for node in nodes:
        ids = alloc.on(node)
        if ids is None:
            return None, alloc.why
        published, why = ranktable.read_published(spool, node)
        if published is None:
            return None, why
        if ids:
            servers.append((published.server_id, ids, published.devices))
    try:
        table = ranktable.build(servers)
    except ValueError as exc:
        return None, str(exc)
    import json

    try:
        write_atomic(path, json.dumps(table, indent=1) + "\n", mode=0o600)
    except OSError as exc:
        return None, str(exc)
    return path, ""
