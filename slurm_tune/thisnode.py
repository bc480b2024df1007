"""Which node this process runs on, and `%n` in configured paths.

On a real cluster each node has its own disk and sysfs; on the one-machine development cluster the three
nodes share one, so per-node paths (sysfs fixture trees, state, the cache tier) are written once with `%n`.
"""
from __future__ import annotations

import os


def node_name(environ=None) -> str:
    """Slurm's name for this node ($SLURMD_NODENAME in hooks and jobs), else the short host name."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def expand_node(text: str, node: str) -> str:
    """`%n` becomes `node`; `%%` is a literal `%`."""
    if "%" not in text:
        return text
    return text.replace("%%", "\0").replace("%n", node).replace("\0", "%")


def uses_node(text: str) -> bool:
    return "%n" in text.replace("%%", "")
