"""merge(per_node) -> JobVerdict: the nodes' verdicts as the job's.

The job's status is its nodes' worst, in this order: fallback, no_gdr, plugin_failed, errors, unknown, ok,
not_judged. A finding anywhere outweighs proof elsewhere, an unknown node leaves the proof incomplete, and a
node without any NCCL log (not_judged) weighs least: the other nodes may still prove the transport. Its
messages say each thing once for all the nodes it holds on, nodes in Slurm's host-list form: `IB
partition, but ranks on n[3-4] used NET/Socket over eth0`, then a count of the errors and warnings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..hostlist import compress_hostlist
from .verdict import FINDINGS, NOT_JUDGED, OK, UNKNOWN, NodeVerdict
from .words import tagged

JOB_ORDER = (*FINDINGS, UNKNOWN, OK, NOT_JUDGED)
_KIND_ORDER = (*FINDINGS, UNKNOWN, "note", OK, NOT_JUDGED)
_NODE = "\x00"  # where a message names its node; replaced by the group's host list


@dataclass(frozen=True)
class JobVerdict:
    """status: the nodes' worst (JOB_ORDER); messages: the job-level lines, worst first; nodes: (node,
    NodeVerdict) by name; by_status: (status, nodes) for each status that some node has; errors: errors
    counted on all nodes (WARN errors, watchdog timeouts, HCCL codes and lines, test failures); benign:
    harmless warnings counted."""

    status: str
    messages: tuple[str, ...]
    nodes: tuple[tuple[str, NodeVerdict], ...]
    by_status: tuple[tuple[str, tuple[str, ...]], ...]
    errors: int = 0
    benign: int = 0

    def nodes_with(self, status: str) -> tuple[str, ...]:
        return dict(self.by_status).get(status, ())


def merge(per_node: Mapping[str, NodeVerdict]) -> JobVerdict:
    nodes = tuple(sorted((str(k), v) for k, v in per_node.items() if isinstance(v, NodeVerdict)))
    if not nodes:
        return JobVerdict(
            NOT_JUDGED, ("not judged: no node's verdict (no NCCL log on any node)",), (), ((NOT_JUDGED, ()),)
        )
    by: dict[str, list[str]] = {}
    for node, v in nodes:
        by.setdefault(v.status if v.status in JOB_ORDER else UNKNOWN, []).append(node)
    status = min(by, key=JOB_ORDER.index)
    by_status = tuple((s, tuple(by[s])) for s in JOB_ORDER if s in by)

    groups: dict[tuple[str, str], list[str]] = {}
    for node, v in nodes:
        for kind, text in tagged(v, _NODE, short=True):
            groups.setdefault((kind, text), []).append(node)
    ordered = sorted(groups.items(), key=lambda item: _KIND_ORDER.index(item[0][0]))
    lines = [text.replace(_NODE, compress_hostlist(members)) for (_, text), members in ordered]

    errors = sum(v.error_count() for _, v in nodes)
    benign = sum(v.benign for _, v in nodes)
    if errors:
        counted = [f"{node}: {v.error_count()}" for node, v in nodes if v.error_count()]
        more = f", +{len(counted) - 8} nodes" if len(counted) > 8 else ""
        lines.append(f"errors counted: {errors} ({', '.join(counted[:8])}{more})")
    return JobVerdict(status, tuple(lines), nodes, by_status, errors, benign)
