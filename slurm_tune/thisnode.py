"""Which node and job this process runs for, and `%n` in configured paths.

On a real cluster each node has its own disk and sysfs; on the one-machine development cluster the three
nodes share one, so per-node paths (sysfs fixture trees, state, the cache tier) are written once with `%n`.

A command that runs for a job on a node (stune-task-prolog, stune-env, stune-stage fetch) builds one
`JobContext` at its entry point and passes it down; nothing below it reads SLURM_JOB_PARTITION or
SLURMD_NODENAME again, or loads the profile again. Imports only `os` and `text`: it is on every hook's path,
the prolog's included.
"""

from __future__ import annotations

import os

from .text import is_digits

NODE_VAR = "SLURMD_NODENAME"  # set by slurmd for prologs, epilogs, TaskProlog and job steps
PARTITION_VAR = "SLURM_JOB_PARTITION"
JOB_ID_VAR = "SLURM_JOB_ID"
# stune-sbatch's encoded --stage list (stage/spec.py). Defined here, below the stage package, so the
# TaskProlog can tell whether a job stages anything without importing that package.
STAGE_VAR = "STUNE_STAGE"


def host_name() -> str:
    """The short host name: what slurmd expands %N to in a job's file names (not always the NodeName)."""
    return os.uname().nodename.split(".")[0]


def node_name(environ=None) -> str:
    """Slurm's name for this node ($SLURMD_NODENAME in hooks and jobs), else the short host name."""
    environ = os.environ if environ is None else environ
    return environ.get(NODE_VAR) or host_name()


def job_partition(environ=None) -> str:
    """The job's partition from $SLURM_JOB_PARTITION: the first, when Slurm gives a list; '' outside a job."""
    environ = os.environ if environ is None else environ
    return (environ.get(PARTITION_VAR) or "").split(",")[0].strip()


def expand(text: str, node: str | None = None, environ=None) -> str:
    """The one `%n` expander: `%n` becomes `node` (None: this node's name, from `environ`); `%%` is a literal
    `%`, so `%%n` is the text `%n`. Every configured path that may name the node goes through here."""
    if "%" not in text:
        return text
    parts = text.split("%%")
    if node is None and any("%n" in part for part in parts):
        node = node_name(environ)
    return "%".join(part.replace("%n", node or "") for part in parts)


def uses_node(text: str) -> bool:
    """Does `text` name the node (`%n`, not the literal `%%n`)?"""
    return any("%n" in part for part in text.split("%%"))


class JobContext:
    """What runs for a job on this node needs to know, resolved once where the command starts.

    environ: the task's environment (read-only here); node: this node's Slurm name; partition: the job's
    (the first, when Slurm gives a list; '' when unknown); job_id: digits, or None outside a job; profile: the
    partition's profile, or None with the StuneError that said why in profile_error (None when no partition
    or not loaded yet). A plain class, not a namedtuple: the prolog imports this module, not `collections`."""

    __slots__ = ("environ", "node", "partition", "job_id", "profile", "profile_error")

    def __init__(
        self, environ, node: str, partition: str, job_id: str | None, profile=None, profile_error=None
    ):
        self.environ, self.node, self.partition, self.job_id = environ, node, partition, job_id
        self.profile, self.profile_error = profile, profile_error

    def __repr__(self):
        return (
            f"JobContext(node={self.node!r}, partition={self.partition!r}, job_id={self.job_id!r}, "
            f"profile={getattr(self.profile, 'name', None)!r}, profile_error={self.profile_error!r})"
        )

    def with_profile(self, load) -> JobContext:
        """This context with `load(partition)`'s profile, or the StuneError it raised in profile_error. The
        caller passes its loader: this module sits below the profiles."""
        if not self.partition:
            return self
        from .errors import StuneError

        try:
            profile, error = load(self.partition), None
        except StuneError as exc:
            profile, error = None, exc
        return JobContext(self.environ, self.node, self.partition, self.job_id, profile, error)


def job_context(
    environ=None, *, partition: str | None = None, node: str | None = None, profile=None
) -> JobContext:
    """The context from the task's environment: $SLURMD_NODENAME (else the host name), the first of
    $SLURM_JOB_PARTITION and $SLURM_JOB_ID (ASCII digits only; anything else is no job). `partition` and
    `node`, when given (a -p or --node option), win over the environment."""
    environ = os.environ if environ is None else environ
    if partition is None:
        partition = job_partition(environ)
    job_id = environ.get(JOB_ID_VAR) or None
    if job_id is not None and not is_digits(job_id):
        job_id = None
    return JobContext(environ, node or node_name(environ), partition, job_id, profile, None)
