"""What stune-validate prints: a run's records per node (`run`), the latest record per layer and node
(`show`), as output.table's columns and the version matrix under each node's table."""

from __future__ import annotations

import time

from ..output import table
from .records import version_matrix

RUN_HEADER = ("LAYER", "OPERATOR", "STATUS", "MAX_ABS", "MAX_REL", "TOLERANCE", "DETAIL")
SHOW_HEADER = ("LAYER", "NODE", "WHEN", "STATUS", "TORCH", "BACKEND", "DEVICE", "DETAIL")


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _cell(e: dict) -> str:
    """An operator's DETAIL cell: short (the layer's full detail and the version matrix follow the table)."""
    ref = e.get("ref") or {}
    if e["status"] == "fail":
        return (
            f"differs from {ref.get('against')}" if ref.get("status") == "fail" else "over tolerance vs fp64"
        )
    if e["status"] in ("unsupported", "unknown"):
        return e.get("detail", "")
    return f"{ref['status']} against {ref['against']}" if ref else "vs fp64"


def _short(detail: str) -> str:
    return detail.split("; version matrix:", 1)[0]


def rows(r: dict) -> list[tuple]:
    if r["layer"] == "ops" and r.get("ops"):
        return [
            (
                "ops",
                f"{e['op']}/{e['dtype']}",
                e["status"],
                _g(e.get("max_abs")),
                _g(e.get("max_rel")),
                f"abs {e['tol_abs']:g} rel {e['tol_rel']:g}" if "tol_abs" in e else "-",
                _cell(e)[:100],
            )
            for e in r["ops"]
        ]
    if r["layer"] == "converge" and r.get("losses"):
        what = f"{r['steps']} steps"
        return [
            (
                "converge",
                what,
                r["status"],
                "-",
                _g(r.get("max_dev")),
                f"band {r['band']:g}",
                _short(r["detail"])[:100],
            )
        ]
    return [(r["layer"], "-", r["status"], "-", "-", "-", r["detail"][:160])]


def _timing(r: dict) -> str:
    parts = []
    for key in ("cold", "steady"):
        p = r.get(key)
        if isinstance(p, dict):
            rate = p.get("steps_per_s")
            parts.append(
                f"{key} {p['steps']} steps {p['seconds']:.3g}s ({'-' if rate is None else f'{rate:.4g}'}/s)"
            )
    if r.get("peak_mem_bytes") is not None:
        parts.append(f"peak memory {r['peak_mem_bytes'] / 2**20:.1f} MiB ({r.get('peak_mem_kind', '')})")
    return ", ".join(parts)


def run_text(records: list[dict]) -> str:
    """One table per node, then its version matrix (and layer 2's timing), then the failures' details."""
    out = []
    for node in sorted({r["node"] for r in records}):
        mine = [r for r in records if r["node"] == node]
        jobs = ",".join(sorted({r["job"] for r in mine if r["job"]}))
        out.append(f"node {node} (job {jobs or '-'}):\n")
        out.append(table([row for r in mine for row in rows(r)], RUN_HEADER))
        fps = [r["fingerprint"] for r in mine if r["fingerprint"].get("torch")]
        if fps:
            out.append(f"  version matrix: {version_matrix(fps[0])}\n")
        for r in mine:
            if r["layer"] == "converge" and _timing(r):
                out.append(f"  layer 2: {_timing(r)}\n")
            if r["status"] != "pass":
                out.append(f"  {r['layer']}: {r['status']}: {r['detail']}\n")
    return "".join(out)


def latest_per_layer_node(records: list[dict]) -> list[dict]:
    newest: dict = {}
    for r in records:  # oldest first: the last one wins
        newest[(r["layer"], r["node"])] = r
    return [newest[k] for k in sorted(newest)]


def _ops_errors(r: dict) -> dict:
    return {f"{e['op']}/{e['dtype']}": e.get("max_rel") for e in r.get("ops") or ()}


def drift_lines(history: list[dict], shown: list[dict]) -> list[str]:
    """For each shown record, what changed since the same layer and node's previous record: the versions
    that differ and, for layer 1, the operators whose error changed with them."""
    out = []
    for r in shown:
        before = [
            p for p in history if p["layer"] == r["layer"] and p["node"] == r["node"] and p["at"] < r["at"]
        ]
        if not before or r["layer"] == "training":
            continue
        prev = before[-1]
        a, b = prev["fingerprint"], r["fingerprint"]
        changed = [
            f"{k} {a.get(k) or '?'} -> {b.get(k) or '?'}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
        if not changed:
            continue
        old, new = _ops_errors(prev), _ops_errors(r)
        moved = [
            f"{k} max rel {_g(old[k])} -> {_g(new[k])}" for k in sorted(new) if k in old and old[k] != new[k]
        ]
        line = f"{r['node']} {r['layer']}: versions changed since {time.strftime('%Y-%m-%d', time.gmtime(prev['at']))}"
        out.append(line + ": " + ", ".join(changed) + ("; " + ", ".join(moved[:6]) if moved else ""))
    return out


def show_text(records: list[dict], history: list[dict] | None = None) -> str:
    out = []
    for r in records:
        fp = r["fingerprint"]
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["at"]))
        detail = (
            _short(r["detail"])
            if r["layer"] != "training"
            else f"verdict {r['verdict']} by {r.get('by') or '?'}"
        )
        out.append(
            (
                r["layer"],
                r["node"] or "-",
                when,
                r["status"],
                fp.get("torch") or "-",
                fp.get("backend") or "-",
                (fp.get("device") or "-")[:40],
                detail[:100],
            )
        )
    text = table(out, SHOW_HEADER)
    matrices = sorted({version_matrix(r["fingerprint"]) for r in records if r["fingerprint"].get("torch")})
    if len(matrices) > 1:  # drift: a changed driver or library shows as a second matrix
        text += "version matrices seen (differing results after a change are drift):\n"
        text += "".join(f"  {m}\n" for m in matrices)
    text += "".join(f"{line}\n" for line in drift_lines(history or [], records))
    return text
