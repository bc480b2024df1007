"""Two partitions' stored results side by side (`stune-sweep report --compare A B`, docs-compare.md).

A side is `PART` (each check and subject under its latest fingerprint, as the judge sees it) or
`PART@previous` (under the fingerprint before that one: the same partition before a driver, NCCL, ROCm or
CANN change). For each metric both sides have: the median over subjects of each subject's median, the
subject counts and the ratio B/A. The three vendors' all-reduce checks are one metric, "all-reduce busbw"
(HCCL Test reports algorithm bandwidth there: the row names each side's check). Then the scaling curves'
efficiencies at each node or device count both have, and their knees; the validation layers' latest status
and the worst operator error; and each side's version matrix, per vendor, with counts where nodes differ.

Everything but `load_side` is pure over loaded records.
"""

from __future__ import annotations

from ..errors import StuneError
from ..output import table
from ..validate.records import LAYERS
from . import streams
from .judge import median, pair_members
from .store import BASE_KEYS, VALUE_MAX, VENDOR_PARTS, fingerprint_key, load, vendor_of

LATEST, PREVIOUS = "latest", "previous"
ALLREDUCE = "all-reduce busbw"
METRICS = {
    "nccl_allreduce": ALLREDUCE,
    "rccl_allreduce": ALLREDUCE,
    "hccl_allreduce": ALLREDUCE,
    "nvbandwidth": "host-device bandwidth",
    "disk_read": "disk read",
    "ib_write_bw": "RDMA bandwidth",
    "iperf3": "TCP bandwidth",
    "nccl_pair": "2-node all-reduce busbw",
    "numeric": "numeric",
    "dcgm_diag": "dcgm diag",
}
PASS_SHARE = (
    "pass share"  # the unit of a pass/fail check's figure: the share of subjects whose latest run passed
)
PASS_FAIL = ("numeric", "dcgm_diag")
STATUS_ORDER = ("fail", "unknown", "unavailable", "pass")  # a layer is as bad as its worst node
HISTORY_FACTOR = 12  # @previous looks back this many windows, as `report --drift` does


def parse_side(text: str) -> tuple[str, str]:
    partition, at, which = text.partition("@")
    if not partition or (at and which != PREVIOUS):
        raise StuneError(f"--compare {text!r}: a side is PARTITION or PARTITION@previous")
    return partition, PREVIOUS if at else LATEST


def metric_of(check: str) -> str:
    return METRICS.get(check, check)


def select(records, group, which: str = LATEST) -> dict:
    """group(record) -> its rows under the group's latest fingerprint (or, `previous`, the one before it),
    oldest first; groups without such rows are left out."""
    by: dict = {}
    for r in records:
        by.setdefault(group(r), []).append(r)
    out = {}
    for key, rows in by.items():
        keys = [fingerprint_key(r["fingerprint"]) for r in rows]
        want = keys[-1]
        if which == PREVIOUS:
            want = next((k for k in reversed(keys) if k != want), "")
            if not want:
                continue
        out[key] = [r for r, k in zip(rows, keys) if k == want]
    return out


def measured(results) -> list[dict]:
    """The results a baseline is made of: a measurement (ok or fail), not a bisection's one-off pair."""
    return [r for r in results if r["status"] in ("ok", "fail") and not r.get("bisect")]


def side(partition: str, which: str, results, validate=(), scaling=()) -> dict:
    res = select(measured(results), lambda r: (r["check"], r["subject"]), which)
    val = select(validate, lambda r: (r["layer"], r.get("node") or ""), which)
    sca = select(scaling, lambda r: (r["check"], r["scope"]), which)
    return {
        "side": partition if which == LATEST else f"{partition}@{which}",
        "partition": partition,
        "which": which,
        "results": sum(len(rows) for rows in res.values()),
        "last_at": max((rows[-1]["at"] for rows in res.values()), default=None),
        "metrics": metrics(res),
        "matrix": matrix(res, val),
        "scaling": curves(sca),
        "validate": layers(val),
    }


def metrics(groups: dict) -> dict:
    """metric -> {checks, unit, value, subjects}: the median over subjects of each subject's median (a
    pass/fail check: the share of subjects whose latest run passed)."""
    per: dict = {}
    for (check, _subject), rows in groups.items():
        m = per.setdefault(metric_of(check), {"checks": set(), "unit": "", "values": []})
        m["checks"].add(check)
        if check in PASS_FAIL:
            m["unit"] = PASS_SHARE
            m["values"].append(1.0 if rows[-1]["status"] == "ok" else 0.0)
            continue
        values = [r["value"] for r in rows if r["status"] == "ok" and r.get("value") is not None]
        if values:
            m["values"].append(median(values))
            m["unit"] = m["unit"] or rows[-1].get("unit") or ""
    out = {}
    for name, m in per.items():
        vals = m["values"]
        share = m["unit"] == PASS_SHARE
        value = (sum(vals) / len(vals) if share else median(vals)) if vals else None
        out[name] = {
            "checks": sorted(m["checks"]),
            "unit": m["unit"],
            "value": None if value is None else round(value, 4),
            "subjects": len(vals),
        }
    return out


def matrix(results: dict, validate: dict | None = None) -> dict:
    """vendor -> {nodes, parts: {part: {version: nodes}}, differs: [parts whose nodes differ]}: each node's
    versions from its latest record of each check (a check whose tool does not report a part leaves it
    to the others), then counted over the side's nodes."""
    nodes: dict = {}  # node -> (vendor, {part: version})
    groups = list((results or {}).items()) + list((validate or {}).items())
    for (_kind, subject), rows in groups:
        fp = rows[-1]["fingerprint"]
        vendor = vendor_of(fp)
        parts = (*BASE_KEYS, *VENDOR_PARTS.get(vendor, ()), *streams.VALIDATE_PARTS)
        members = pair_members(subject) if "+" in subject else [subject or rows[-1].get("node") or "?"]
        for node in members:
            have = nodes.setdefault(node, (vendor, {}))[1]
            for part in parts:
                v = fp.get(part)
                if v and part not in have:
                    have[part] = v
    out: dict = {}
    for _node, (vendor, have) in sorted(nodes.items()):
        entry = out.setdefault(vendor, {"nodes": 0, "parts": {}})
        entry["nodes"] += 1
        for part, v in have.items():
            counts = entry["parts"].setdefault(part, {})
            counts[v] = counts.get(v, 0) + 1
    for entry in out.values():
        n = entry["nodes"]
        for part, counts in entry["parts"].items():  # a node that never reported a part: '?'
            missing = n - sum(counts.values())
            if missing and part not in streams.VALIDATE_PARTS:  # (only validated nodes report those)
                counts["?"] = missing
        entry["differs"] = sorted(p for p, c in entry["parts"].items() if len(c) > 1)
    return out


def curves(groups: dict) -> dict:
    """scope ("node", "nodes") -> the latest curve of that scope: {metric, check, points {n: efficiency},
    knee, verdict}."""
    out: dict = {}
    for (check, scope), rows in groups.items():
        r = rows[-1]
        if scope in out and out[scope]["at"] >= r["at"]:
            continue
        out[scope] = {
            "at": r["at"],
            "metric": metric_of(check),
            "check": check,
            "points": {p["n"]: p.get("efficiency") for p in r["points"]},
            "knee": r.get("knee"),
            "verdict": r["verdict"],
        }
    return out


def worst_status(statuses) -> str:
    present = set(statuses)
    return next((s for s in STATUS_ORDER if s in present), "unknown")


def op_score(o: dict) -> float:
    """How far an operator's error is from its tolerance (>1: beyond it); the relative error without one."""
    ratios = [
        o[err] / o[tol]
        for err, tol in (("max_abs", "tol_abs"), ("max_rel", "tol_rel"))
        if o.get(err) is not None and o.get(tol)
    ]
    return min(max(ratios), VALUE_MAX) if ratios else (o.get("max_rel") or 0.0)  # a tiny tolerance: inf


def layers(groups: dict) -> dict:
    """layer -> {status (the worst node's latest), nodes {status: count}, at, worst (ops: the operator
    furthest from its tolerance, with its node), failing (nodes)}."""
    per: dict = {}
    for (layer, node), rows in groups.items():
        r = rows[-1]
        e = per.setdefault(layer, {"nodes": {}, "at": 0.0, "worst": None, "failing": [], "records": []})
        e["nodes"][r["status"]] = e["nodes"].get(r["status"], 0) + 1
        e["at"] = max(e["at"], r["at"])
        e["records"].append(r)
        if r["status"] == "fail":
            e["failing"].append(node)
        for o in r.get("ops") or ():
            score = op_score(o)
            if e["worst"] is None or (o["status"] == "fail", score) > (
                e["worst"]["status"] == "fail",
                e["worst"]["score"],
            ):
                e["worst"] = dict(o, node=node, score=round(score, 4))
    for e in per.values():
        e["status"] = worst_status(e["nodes"])
        e["failing"].sort()
        e["records"].sort(key=lambda r: r["at"])
    return per


def compare(a: dict, b: dict) -> dict:
    """Two sides (`side`) -> the comparison's document (its JSON)."""
    rows = []
    for name in sorted(set(a["metrics"]) & set(b["metrics"])):
        ma, mb = a["metrics"][name], b["metrics"][name]
        ratio = round(mb["value"] / ma["value"], 3) if ma["value"] and mb["value"] is not None else None
        rows.append(
            {
                "metric": name,
                "unit": ma["unit"] or mb["unit"],
                "check_a": ",".join(ma["checks"]),
                "check_b": ",".join(mb["checks"]),
                "a": ma["value"],
                "b": mb["value"],
                "subjects_a": ma["subjects"],
                "subjects_b": mb["subjects"],
                "ratio": ratio,
            }
        )
    scaling = []
    for scope in sorted(set(a["scaling"]) & set(b["scaling"])):
        ca, cb = a["scaling"][scope], b["scaling"][scope]
        common = sorted(set(ca["points"]) & set(cb["points"]))
        scaling.append(
            {
                "scope": scope,
                "metric": ca["metric"],
                "points": [{"n": n, "a": ca["points"][n], "b": cb["points"][n]} for n in common],
                "knee_a": ca["knee"],
                "knee_b": cb["knee"],
                "verdict_a": ca["verdict"],
                "verdict_b": cb["verdict"],
            }
        )
    validation = []
    for layer in [x for x in LAYERS if x in a["validate"] or x in b["validate"]]:
        la, lb = a["validate"].get(layer), b["validate"].get(layer)
        validation.append(
            {
                "layer": layer,
                "a": la["status"] if la else None,
                "b": lb["status"] if lb else None,
                "nodes_a": la["nodes"] if la else {},
                "nodes_b": lb["nodes"] if lb else {},
                "worst_a": _op_public(la["worst"]) if la else None,
                "worst_b": _op_public(lb["worst"]) if lb else None,
            }
        )

    def public(s: dict) -> dict:
        keep = ("side", "partition", "which", "results", "last_at", "matrix")
        return {k: s[k] for k in keep}

    return {
        "a": public(a),
        "b": public(b),
        "rows": rows,
        "only_a": sorted(set(a["metrics"]) - set(b["metrics"])),
        "only_b": sorted(set(b["metrics"]) - set(a["metrics"])),
        "scaling": scaling,
        "validate": validation,
    }


def _op_public(o: dict | None) -> dict | None:
    if o is None:
        return None
    keys = ("op", "dtype", "node", "status", "max_abs", "max_rel", "tol_abs", "tol_rel", "score")
    return {k: o.get(k) for k in keys}


def load_side(directory: str, text: str, now: float, window_s: float) -> dict:
    """A side from the store (`PART` over the window, `PART@previous` over HISTORY_FACTOR windows); a side
    without any result is a one-line StuneError naming the partition and the store."""
    partition, which = parse_side(text)
    since = now - window_s * (HISTORY_FACTOR if which == PREVIOUS else 1)
    s = side(
        partition,
        which,
        load(directory, partition, since, now),
        streams.load_validate(directory, partition, since, now),
        streams.load_scaling(directory, partition, since, now),
    )
    if not s["results"]:
        under = "under a fingerprint before the latest " if which == PREVIOUS else ""
        raise StuneError(f"{s['side']}: no results {under}for partition {partition} in the store {directory}")
    return s


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def matrix_lines(m: dict) -> list[str]:
    lines = []
    for vendor, e in sorted(m.items()):
        parts = []
        for part, counts in e["parts"].items():
            if len(counts) == 1:
                (v, c), *_ = counts.items()
                parts.append(f"{part} {v}" + (f" ({c} nodes)" if c != e["nodes"] else ""))
            else:
                seen = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                parts.append(f"{part} " + " / ".join(f"{v} ({c} nodes)" for v, c in seen))
        differs = f"; nodes differ in {', '.join(e['differs'])}" if e["differs"] else ""
        lines.append(f"  {vendor} ({e['nodes']} nodes{differs}): " + ", ".join(parts))
    return lines


def _knee(k) -> str:
    return "-" if not k else f"n={k['n']} eff {_fmt(k.get('efficiency'))}"


def text(doc: dict) -> str:
    a, b = doc["a"]["side"], doc["b"]["side"]
    out = [f"A = {a}, B = {b}\n"]
    cells = [
        (
            r["metric"],
            r["unit"],
            r["check_a"],
            _fmt(r["a"]),
            r["subjects_a"],
            r["check_b"],
            _fmt(r["b"]),
            r["subjects_b"],
            _fmt(r["ratio"]),
        )
        for r in doc["rows"]
    ]
    header = ("METRIC", "UNIT", "A CHECK", "A", "A SUBJ", "B CHECK", "B", "B SUBJ", "B/A")
    out.append(table(cells, header) if cells else "no metric measured on both sides\n")
    for key, who in (("only_a", a), ("only_b", b)):
        if doc[key]:
            out.append(f"only {who}: {', '.join(doc[key])}\n")
    for s in doc["scaling"]:
        out.append(f"\nscaling ({s['scope']}, {s['metric']}): efficiency\n")
        pts = [(p["n"], _fmt(p["a"]), _fmt(p["b"])) for p in s["points"]]
        pts.append(("knee", _knee(s["knee_a"]), _knee(s["knee_b"])))
        pts.append(("verdict", s["verdict_a"], s["verdict_b"]))
        out.append(table(pts, ("N", "A", "B")))
    if doc["validate"]:
        out.append("\nvalidation (latest per node; the worst node's status)\n")
        layers_ = [
            (v["layer"], v["a"] or "-", v["b"] or "-", _worst(v["worst_a"]), _worst(v["worst_b"]))
            for v in doc["validate"]
        ]
        out.append(table(layers_, ("LAYER", "A", "B", "A WORST OPERATOR", "B WORST OPERATOR")))
    for who in ("a", "b"):
        out.append(f"\nversions of {doc[who]['side']}:\n")
        out.extend(line + "\n" for line in matrix_lines(doc[who]["matrix"]))
    return "".join(out)


def _worst(o) -> str:
    if not o:
        return "-"
    return f"{o['op']}.{o.get('dtype') or '?'} on {o['node']}: rel {_fmt(o.get('max_rel'))} ({o['status']})"


def png(path: str, doc: dict) -> None:
    """Grouped bars per metric (A, B), the ratio B/A above each pair; one panel per metric (their units
    differ), the scaling efficiencies as one more panel each."""
    import matplotlib  # optional: the reports extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r["metric"], r["unit"], [("A", r["a"]), ("B", r["b"])], r["ratio"]) for r in doc["rows"]]
    for s in doc["scaling"]:
        for p in s["points"]:
            ratio = round(p["b"] / p["a"], 3) if p["a"] and p["b"] is not None else None
            panels.append(
                (f"{s['scope']} scaling n={p['n']}", "efficiency", [("A", p["a"]), ("B", p["b"])], ratio)
            )
    if not panels:
        raise ValueError("no metric measured on both sides to plot")
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    names = {"A": doc["a"]["side"], "B": doc["b"]["side"]}
    for ax, (title, unit, bars, ratio) in zip(axes.flat, panels):
        heights = [v or 0.0 for _, v in bars]
        ax.bar([names[k] for k, _ in bars], heights, color=["tab:blue", "tab:orange"])
        ax.set_title(title, fontsize="small")
        ax.set_ylabel(unit)
        if ratio is not None:
            ax.annotate(f"B/A {ratio:.3g}", xy=(0.5, 0.97), xycoords="axes fraction", ha="center", va="top")
        ax.set_ylim(0, max([*heights, 1e-9]) * 1.25)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{names['A']} (A) vs {names['B']} (B)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
