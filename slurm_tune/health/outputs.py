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
    lines += _incident_lines(doc, base)
    if "elapsed_s" in doc:
        lines += [
            "# HELP stune_health_duration_seconds How long the evaluation took.",
            "# TYPE stune_health_duration_seconds gauge",
            f'stune_health_duration_seconds{{{base},mode="{_label(doc["mode"])}"}} {doc["elapsed_s"]}',
        ]
    return "\n".join(lines) + "\n"


def incident_summary(state: dict, hold: float, now: float) -> dict:
    """The Xid events per code since the node's state began (state `incident_counts`), and the events held
    against the node now (drain-level, and degrade-level within `hold`), per code: the outputs' view of
    health/incidents.py's records, read without importing it (the prolog writes these lines too)."""
    counts = state.get("incident_counts")
    counts = {k: v for k, v in counts.items() if type(v) is int} if isinstance(counts, dict) else {}
    held: dict = {}
    found = state.get("incidents")
    for i in found if isinstance(found, list) else ():
        if (
            isinstance(i, dict)
            and i.get("released") is None
            and type(i.get("count")) is int
            and type(i.get("at")) in (int, float)
            and (i.get("level") == "drain" or (i.get("level") == "degrade" and i["at"] >= now - hold))
        ):
            held[str(i.get("xid"))] = held.get(str(i.get("xid")), 0) + i["count"]
    return {"by_code": counts, "held": held}


def _incident_lines(doc: dict, base: str) -> list:
    lines = []
    found = doc.get("incidents")
    if isinstance(found, dict):
        lines += [
            "# HELP stune_health_xid_events_total Xid events stune recorded on this node, by code, since its "
            "state began (health/incidents.py).",
            "# TYPE stune_health_xid_events_total counter",
        ]
        lines += [
            f'stune_health_xid_events_total{{{base},xid="{_label(code)}"}} {n}'
            for code, n in sorted(found.get("by_code", {}).items())
        ]
        lines += [
            "# HELP stune_health_xid_held Xid events held against this node now (drained or degraded for "
            "them), by code.",
            "# TYPE stune_health_xid_held gauge",
        ]
        lines += [
            f'stune_health_xid_held{{{base},xid="{_label(code)}"}} {n}'
            for code, n in sorted(found.get("held", {}).items())
        ]
    hangs = doc.get("hangs")
    if isinstance(hangs, dict) and hangs:
        lines += [
            "# HELP stune_health_probe_hung_runs Periodic runs in a row a hardware probe hit its deadline "
            "(health/hang.py).",
            "# TYPE stune_health_probe_hung_runs gauge",
        ]
        lines += [
            f'stune_health_probe_hung_runs{{{base},probe="{_label(probe)}"}} {h.get("runs", 0)}'
            for probe, h in sorted(hangs.items())
            if isinstance(h, dict) and type(h.get("runs")) is int
        ]
    return lines


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
