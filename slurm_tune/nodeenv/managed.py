"""STUNE_MANAGED: which variables stune set for a job, and the value it set; and the other switches
stune-sbatch puts in a job's environment for its TaskProlog (their one definition).

stune-sbatch writes it, the TaskProlog (and stune-env) read and update it. A variable is stune's to refine
only while its value is still the one recorded here: a value the batch script exported, or `srun --export`
passed, differs, and then it is the user's and is left alone in every step.

Format: comma-separated items, `NAME=value` (the value stune set, `%` and `,` escaped as `%25` and `%2C`)
or a bare `NAME` (stune detects it on each node and has not set it yet, or unset it). Imports nothing: it
is read by stune-sbatch and before every task.

The TaskProlog also records the job it wrote it for, as `@job=<id>` (OWNER): a job submitted from inside
another without stune-sbatch (a plain sbatch, the cli_filter's) inherits the parent's STUNE_MANAGED and its
values, and the owner tells them apart from its own (`inherited_from_another_job`).

The old form (stune-sbatch before values were recorded: bare names only, every one a variable stune set)
is still read, so a job submitted before an upgrade keeps its node-side refinement: each name's value is
taken to be stune's when it is read (`parse_managed(text, environ)`), and the TaskProlog writes the new form
back for the job's later steps.
"""

from __future__ import annotations

MANAGED_VAR = "STUNE_MANAGED"
SUMMARY_VAR = "STUNE_NODE_SUMMARY"  # stune-sbatch --node-summary: each node says its final settings once
# MASTER_PORT per job: BASE + job id mod SPAN (the TaskProlog sets it; stune-sbatch --dry-run explains it)
MASTER_PORT_BASE, MASTER_PORT_SPAN = 12000, 8000
# The batch step's SLURM_STEP_ID in a TaskProlog: SLURM_BATCH_SCRIPT, 4294967294 on 22.05 and 24.11; 26.05
# gives its id (0xfffffffb) signed, as -5.
BATCH_STEP_IDS = frozenset({"4294967294", "4294967291", "-5"})
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")  # set once per job, the same on every rank; never refined
OWNER = "@job"  # not a variable: the job whose TaskProlog wrote STUNE_MANAGED


def parse_managed(text: str | None, environ=None) -> dict[str, str | None]:
    """{name: the value stune set, or None}. With `environ`, the old form (no `NAME=value` item at all) reads
    each name as set by stune to the value it has in `environ` (the rendezvous names stay bare)."""
    out: dict[str, str | None] = {}
    for item in (text or "").split(","):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name:
            out[name] = value.replace("%2C", ",").replace("%25", "%") if eq else None
    if environ is not None and out and text and "=" not in text:
        return {name: None if name in RENDEZVOUS else environ.get(name) for name in out}
    return out


def format_managed(managed: dict[str, str | None]) -> str:
    """The new form always holds a `=`: when no name has a value, an empty `=` item comes first (read as
    nothing), so it is never taken for the old form."""
    text = ",".join(
        name if value is None else f"{name}={value.replace('%', '%25').replace(',', '%2C')}"
        for name, value in managed.items()
    )
    return text if not text or "=" in text else "=," + text


def inherited_from_another_job(environ, job_id: str | None) -> dict[str, str | None]:
    """The variables a parent job's stune set that this job inherited ({name: the parent's value, None for a
    rendezvous name}), when STUNE_MANAGED names another job as its owner; else {}. A name whose value is no
    longer the parent stune's (the user exported their own) is the user's and not listed."""
    managed = parse_managed(environ.get(MANAGED_VAR), environ)
    owner = managed.pop(OWNER, None)
    if owner is None or job_id is None or owner == job_id:
        return {}
    return {n: v for n, v in managed.items() if n in environ and (v is None or environ[n] == v)}


def is_stunes(name: str, environ, managed: dict[str, str | None]) -> bool:
    """May stune (re)set `name`: it is absent, or its value is still the one stune recorded."""
    if name not in environ:
        return True
    recorded = managed.get(name)
    return recorded is not None and environ[name] == recorded
