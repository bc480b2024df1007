"""The verdict for machines: a Prometheus textfile (node_exporter's textfile collector) and JSON.

Both are written atomically (safeio.write_atomic: a temp file renamed into place), as node_exporter requires. The text format
is written directly: prometheus_client would cost more to import than the prolog's whole budget.
"""

from __future__ import annotations

import os

from .. import fastjson
from . import result

STATUS_VALUE = {result.OK: 0, result.WARNING: 0, result.UNKNOWN: 1, result.DEGRADED: 2, result.FAIL: 3}


def report(
    node: str,
    partition: str,
    policy: str,
    mode: str,
    at: float,
    verdict: result.Verdict,
    extra: dict | None = None,
) -> dict:
    """The JSON form of one evaluation."""
    doc = {
        "node": node,
        "partition": partition,
        "policy": policy,
        "mode": mode,
        "at": round(at, 3),
        "status": verdict.status,
        "reason": verdict.reason,
        "counts": {s: sum(1 for r in verdict.results if r.status == s) for s in result.STATUSES},
        "results": [r.as_dict() for r in verdict.results],
    }
    if extra:
        doc.update(extra)
    return doc


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(doc: dict) -> str:
    """Text exposition format for one report (see report())."""
    base = f'node="{_label(doc["node"])}",partition="{_label(doc["partition"])}"'
    lines = [
        "# HELP stune_health_status Node health verdict: 0 ok, 1 unknown, 2 degraded, 3 fail.",
        "# TYPE stune_health_status gauge",
        f'stune_health_status{{{base},mode="{_label(doc["mode"])}",reason="{_label(doc["reason"])}"}} '
        f"{STATUS_VALUE[doc['status']]}",
        "# HELP stune_health_check_status One check's result: 0 ok (or a warning about the policy), 1 unknown, "
        "2 degraded, 3 fail.",
        "# TYPE stune_health_check_status gauge",
    ]
    lines.extend(
        f'stune_health_check_status{{{base},check="{_label(r["check"])}",'
        f'subject="{_label(r["subject"])}"}} {STATUS_VALUE[r["status"]]}'
        for r in doc["results"]
    )
    lines += [
        "# HELP stune_health_results Number of check results by status.",
        "# TYPE stune_health_results gauge",
    ]
    lines += [f'stune_health_results{{{base},status="{s}"}} {n}' for s, n in doc["counts"].items()]
    breaker = doc.get("breaker") or {}
    lines += [
        "# HELP stune_health_breaker_open 1 when the circuit breaker held back a drain of this node.",
        "# TYPE stune_health_breaker_open gauge",
        f"stune_health_breaker_open{{{base}}} {1 if breaker.get('open') else 0}",
        "# HELP stune_health_last_run_timestamp_seconds When this verdict was reached.",
        "# TYPE stune_health_last_run_timestamp_seconds gauge",
        f'stune_health_last_run_timestamp_seconds{{{base},mode="{_label(doc["mode"])}"}} {doc["at"]}',
    ]
    transport = doc.get("transport")
    if isinstance(transport, dict):
        lines += [
            "# HELP stune_health_transport_fallbacks Multi-node jobs whose NCCL fell back on this node (sockets on "
            "an RDMA fabric, or no GPUDirect RDMA where expected) within health.comm_window, since the last "
            "that passed.",
            "# TYPE stune_health_transport_fallbacks gauge",
            f"stune_health_transport_fallbacks{{{base}}} {transport.get('fallbacks', 0)}",
            "# HELP stune_health_transport_judged Multi-node jobs whose transport was judged on this node within "
            "health.comm_window.",
            "# TYPE stune_health_transport_judged gauge",
            f"stune_health_transport_judged{{{base}}} {transport.get('judged', 0)}",
        ]
    if "elapsed_s" in doc:
        lines += [
            "# HELP stune_health_duration_seconds How long the evaluation took.",
            "# TYPE stune_health_duration_seconds gauge",
            f'stune_health_duration_seconds{{{base},mode="{_label(doc["mode"])}"}} {doc["elapsed_s"]}',
        ]
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    """safeio.write_atomic (an exclusive random temporary and a rename: node_exporter never reads half a
    file, and a name planted beside the target is never written through), its directory made first."""
    from ..safeio import write_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, text, mode=0o644)


def write_json(path: str, doc: dict) -> None:
    _write(path, fastjson.dumps(doc) + "\n")


def write_prometheus(path: str, doc: dict) -> None:
    _write(path, prometheus(doc))
