"""STUNE_MANAGED: which variables stune set for a job, and the value it set; and the other switches
stune-sbatch puts in a job's environment for its TaskProlog (their one definition).

stune-sbatch writes it, the TaskProlog (and stune-env) read and update it. A variable is stune's to refine
only while its value is still the one recorded here: a value the batch script exported, or `srun --export`
passed, differs, and then it is the user's and is left alone in every step.

Format: comma-separated items, `NAME=value` (the value stune set, `%` and `,` escaped as `%25` and `%2C`)
or a bare `NAME` (stune detects it on each node and has not set it yet, or unset it). Imports nothing: it
is read by stune-sbatch and before every task.
"""
from __future__ import annotations

MANAGED_VAR = "STUNE_MANAGED"
SUMMARY_VAR = "STUNE_NODE_SUMMARY"  # stune-sbatch --node-summary: each node says its final settings once
# MASTER_PORT per job: BASE + job id mod SPAN (the TaskProlog sets it; stune-sbatch --dry-run explains it)
MASTER_PORT_BASE, MASTER_PORT_SPAN = 12000, 8000


def parse_managed(text: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in (text or "").split(","):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name:
            out[name] = value.replace("%2C", ",").replace("%25", "%") if eq else None
    return out


def format_managed(managed: dict[str, str | None]) -> str:
    return ",".join(name if value is None else f"{name}={value.replace('%', '%25').replace(',', '%2C')}"
                    for name, value in managed.items())


def is_stunes(name: str, environ, managed: dict[str, str | None]) -> bool:
    """May stune (re)set `name`: it is absent, or its value is still the one stune recorded."""
    if name not in environ:
        return True
    recorded = managed.get(name)
    return recorded is not None and environ[name] == recorded
