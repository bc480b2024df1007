"""The scaling curve's judgement, pure (no Slurm, no files): which points to measure, each point's bus
bandwidth and efficiency, the knee, who joined at it (nodes, switches, slow pairs), the curve's record and the
check that a stored record is one stune wrote (`valid_record`, for store.load's accept=).

Efficiency (docs/active.md, "The scaling curve"):
- within a node (scope "node"): against the first multi-device point's bus bandwidth. A 1-device run moves
  nothing over the bus (nccl-tests' busbw is 0 by definition: busbw = algbw x 2(n-1)/n), so the 1-device
  point is reported with its algbw (a local copy rate) as a reference only: no efficiency, never the knee.
- across nodes (scope "nodes"): against the single-node figure (the 1-node point of the same multi-node
  command; where that has no result, the single-node curve's full-node point).
HCCL Test prints the algorithm bandwidth; it is turned into the bus bandwidth by the same definition, so every
vendor's curve is in busbw.
"""

from __future__ import annotations

from ..accelspec import ASCEND
from ..hostlist import expand_hostlist
from ..readback import EPOCH_MAX, problem
from .store import VALUE_MAX

NODE, NODES = "node", "nodes"
STATUSES = ("ok", "fail", "unknown", "unavailable")
VERDICTS = ("pass", "knee", "fail", "unknown", "skipped")
EFFICIENCY_MAX = 1e3  # a point faster than the baseline is fine; a thousand times faster is garbage


def device_points(devices, gpu_count: int) -> list[int]:
    """The single-node curve's device counts: scaling.devices up to gpu.count, and gpu.count itself (the full
    node: the multi-node curve's reference)."""
    top = max(1, gpu_count or 1)
    return sorted({d for d in devices if d <= top} | {top})


def node_counts(available: int, cap: int | None = None) -> list[int]:
    """1, 2, 4, ... nodes, and the largest count allowed (all the nodes, capped at scaling.max_nodes)."""
    top = min(available, cap) if cap else available
    if top < 1:
        return []
    out, n = [], 1
    while n < top:
        out.append(n)
        n *= 2
    return [*out, top]


def bus_bandwidth(vendor: str, value: float, ranks: int) -> float:
    """A result as bus bandwidth: nccl-tests and rccl-tests print it; HCCL Test prints the algbw."""
    if vendor != ASCEND:
        return value
    return value * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def point(n: int, nodes: list[str], result: dict | None, vendor: str, ranks: int) -> dict:
    """One point of a curve from the agent's result line (None: the job left none)."""
    if result is None:
        return {
            "n": n,
            "nodes": list(nodes),
            "value": None,
            "status": "unknown",
            "efficiency": None,
            "detail": "no result (the job was cancelled, did not start in time, or was killed at its limit)",
        }
    status, detail = result["status"], str(result.get("detail", ""))[:300]
    value = result.get("value")
    metric = "busbw"
    if status in ("ok", "fail") and value is not None:
        if ranks <= 1:  # no bus traffic: the algbw is the figure (nccl-tests' column; HCCL Test's value)
            algbw = value if vendor == ASCEND else result.get("algbw")
            value, metric = (float(algbw) if isinstance(algbw, (int, float)) else None), "algbw"
            if value is not None:
                detail = (
                    f"algbw {value:g} GB/s: one device moves nothing over the bus (busbw 0); reference only"
                )
        else:
            value = round(bus_bandwidth(vendor, float(value), ranks), 4)
    return {
        "n": n,
        "nodes": list(nodes),
        "value": value,
        "status": status,
        "efficiency": None,
        "detail": detail,
        "metric": metric,
    }


def judge_curve(points: list[dict], scope: str, knee: float, fallback: float | None = None) -> dict:
    """Efficiency of each point, the knee and the verdict. Returns {baseline, baseline_n, knee_at (index or
    None), verdict, detail}; sets each point's efficiency in place."""
    word = "device" if scope == NODE else "node"

    def where(n) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    ref = next((p for p in points if p["n"] >= (2 if scope == NODE else 1)), None)
    baseline, baseline_n = None, None
    if ref is not None and ref["status"] == "ok" and ref["value"]:
        baseline, baseline_n = ref["value"], ref["n"]
    elif scope == NODES and fallback:
        baseline, baseline_n = fallback, 1
    failed = [p for p in points if p["status"] == "fail"]
    knee_at = None
    if baseline:
        for i, p in enumerate(points):
            if p["status"] != "ok" or p["value"] is None or (scope == NODE and p["n"] < 2):
                continue
            p["efficiency"] = round(p["value"] / baseline, 4)
            if knee_at is None and p["efficiency"] < knee:
                knee_at = i
    if failed:
        p = failed[0]
        verdict, detail = "fail", f"the tool reported wrong results at {where(p['n'])}: {p['detail']}"
    elif knee_at is not None:
        p = points[knee_at]
        verdict = "knee"
        detail = (
            f"knee at {where(p['n'])}: {p['value']:g} GB/s is {p['efficiency']:.0%} of {baseline:g} GB/s at "
            f"{where(baseline_n)} (below {knee:.0%})"
        )
    elif not points:
        verdict, detail = "unknown", "no points to measure"
    elif baseline is None:
        what = ref["detail"] if ref else f"no multi-device point (the node has {points[-1]['n']} device)"
        verdict, detail = "unknown", f"no reference figure: {what}"
    elif any(p["status"] != "ok" for p in points):
        p = next(p for p in points if p["status"] != "ok")
        verdict, detail = "unknown", f"{p['status']} at {where(p['n'])}: {p['detail']}"
    else:
        low = min((p["efficiency"] for p in points if p["efficiency"] is not None), default=1.0)
        verdict, detail = (
            "pass",
            f"every point at or above {knee:.0%} of {baseline:g} GB/s (lowest {low:.0%})",
        )
    return {
        "baseline": baseline,
        "baseline_n": baseline_n,
        "knee_at": knee_at,
        "verdict": verdict,
        "detail": detail,
    }


# ---- who joined at the knee ------------------------------------------------------------------------------
def parse_topology(records: list[dict]) -> list[dict]:
    """`scontrol show topology` records (SwitchName= Level= Nodes= Switches=) as [{name, level, nodes}]; the
    Nodes of a switch above the leaves are every node beneath it."""
    out = []
    for rec in records:
        name = rec.get("SwitchName")
        if not name:
            continue
        level = rec.get("Level", "0")
        try:
            nodes = set(expand_hostlist(rec.get("Nodes", "") or ""))
        except ValueError:
            nodes = set()
        out.append({"name": name, "level": int(level) if level.isdigit() else 0, "nodes": nodes})
    return out


def switches_involved(topology: list[dict], nodes: list[str], added: list[str]) -> list[str]:
    """The leaf switches of the nodes that joined, then the lowest switch connecting every node of the point
    (when they span several leaves); [] when no topology is known."""
    leaves = sorted(
        {s["name"] for s in topology if s["level"] == 0 and s["nodes"] & set(added)},
    )
    spanning = [s for s in topology if set(nodes) <= s["nodes"]]
    top = min(spanning, key=lambda s: (s["level"], len(s["nodes"]), s["name"]), default=None)
    if top is not None and top["name"] not in leaves:
        leaves.append(top["name"])
    return leaves


def pairs_involving(verdicts, nodes: list[str]) -> list[dict]:
    """Stored pair-check outliers (judge.Verdict of nccl_pair, ib_write_bw, iperf3) with a member among
    `nodes`: a slow link that explains a knee."""
    wanted = set(nodes)
    out = []
    for v in verdicts:
        if "+" not in v.subject or v.status != "outlier":
            continue
        members = set(v.subject.split("/", 1)[0].split("+"))
        if members & wanted:
            value = None if v.value is None else round(v.value, 4)
            out.append({"check": v.check, "subject": v.subject, "value": value, "reason": v.reason[:300]})
    return out


def knee_of(
    points: list[dict], judged: dict, scope: str, topology: list[dict] | None, pairs_verdicts
) -> dict | None:
    """The record's knee: the point, what joined there and why it is named."""
    i = judged["knee_at"]
    if i is None:
        return None
    p = points[i]
    if scope == NODE:
        return {
            "n": p["n"],
            "efficiency": p["efficiency"],
            "nodes_added": [],
            "switches": [],
            "pairs": [],
            "why": judged["detail"] + f"; within {','.join(p['nodes'])}: the devices' own links or PCIe",
        }
    before = set(points[i - 1]["nodes"]) if i > 0 else set()
    added = [n for n in p["nodes"] if n not in before]
    switches = switches_involved(topology or [], p["nodes"], added)
    pairs = pairs_involving(pairs_verdicts, added)
    why = judged["detail"] + f"; joined: {','.join(added) or '-'}"
    why += f"; switches: {','.join(switches)}" if topology else "; no topology known (no topology plugin)"
    if pairs:
        why += "; slow pairs: " + ", ".join(f"{q['check']} {q['subject']}" for q in pairs)
    return {
        "n": p["n"],
        "efficiency": p["efficiency"],
        "nodes_added": added,
        "switches": switches,
        "pairs": pairs,
        "why": why[:1000],
    }


def record(
    at: float,
    partition: str,
    sweep: str,
    scope: str,
    check: str,
    points: list[dict],
    judged: dict,
    knee: dict | None,
    fingerprint: dict,
) -> dict:
    return {
        "at": round(at, 3),
        "partition": partition,
        "sweep": sweep,
        "scope": scope,
        "check": check,
        "unit": "GB/s",
        "points": points,
        "baseline": judged["baseline"],
        "knee": knee,
        "verdict": judged["verdict"],
        "detail": judged["detail"],
        "fingerprint": fingerprint,
    }


def skipped(at: float, partition: str, sweep: str, check: str, why: str, fingerprint=None) -> dict:
    """The multi-node curve not run (the single-node curve did not pass, or one node only), and why."""
    judged = {"baseline": None, "verdict": "skipped", "detail": why}
    return record(at, partition, sweep, NODES, check, [], judged, None, fingerprint or {})


# ---- reading records back ----------------------------------------------------------------------------------
def _strs(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def _num(x, hi: float) -> bool:
    return x is None or problem(x, 0, hi) is None


def _point_ok(p) -> bool:
    return (
        isinstance(p, dict)
        and problem(p.get("n"), 1, 1 << 20, integer=True) is None
        and _strs(p.get("nodes"))
        and _num(p.get("value"), VALUE_MAX)
        and p.get("status") in STATUSES
        and _num(p.get("efficiency"), EFFICIENCY_MAX)
        and isinstance(p.get("detail"), str)
    )


def _knee_ok(k) -> bool:
    return k is None or (
        isinstance(k, dict)
        and problem(k.get("n"), 1, 1 << 20, integer=True) is None
        and _num(k.get("efficiency"), EFFICIENCY_MAX)
        and _strs(k.get("nodes_added"))
        and _strs(k.get("switches"))
        and isinstance(k.get("pairs"), list)
        and all(isinstance(q, dict) for q in k["pairs"])
        and isinstance(k.get("why"), str)
    )


def valid_record(r) -> bool:
    """A scaling record stune could have written (store.load's accept=): the keys, their types, every number
    finite and in range."""
    return (
        isinstance(r, dict)
        and problem(r.get("at"), 0, EPOCH_MAX) is None
        and all(isinstance(r.get(k), str) for k in ("partition", "sweep", "check", "unit"))
        and r.get("scope") in (NODE, NODES)
        and isinstance(r.get("points"), list)
        and all(_point_ok(p) for p in r["points"])
        and _num(r.get("baseline"), VALUE_MAX)
        and _knee_ok(r.get("knee"))
        and r.get("verdict") in VERDICTS
        and isinstance(r.get("fingerprint"), dict)
    )
