"""A partition's acceptance page: the playbook's four stages over the stored records (docs-compare.md).

- runs: its checks and validation jobs ran and measured something (ok/fail against unknown/unavailable);
- correct: layer 1 (operator alignment), layer 2 (convergence), layer 3 (the user's training verdict, when
  reported): the latest record per node; any failing node fails the layer, naming the operator;
- fast: baselines under the latest fingerprint, the outliers now, the scaling curves' verdicts and knees,
  and (`validate.reference`) the ratio to the reference partition, shown but not judged;
- stable: the sweeps over the window, the share of subjects that were outliers at each (k of n, against the
  window's baseline for their fingerprint), its trend, and the fingerprint changes.

Each stage is fail, attention, pending (not measured yet) or pass, in that order of precedence, with its
reasons in a sentence. `build` reads the store; `page` and `text` are pure.
"""

from __future__ import annotations

import time

from ..errors import StuneError
from ..output import table
from . import compare, judge, streams
from .checks import configured
from .store import FINGERPRINT_KEYS, fingerprint_key, load, vendor_of

TYPE_CHECKING = False  # (typing's constant, without importing typing)
if TYPE_CHECKING:
    from ..profilestore import Profile

FAIL, ATTENTION, PENDING, PASS = "fail", "attention", "pending", "pass"
STATES = (FAIL, ATTENTION, PENDING, PASS)
STABLE_SWEEPS = 3  # sweeps (since the latest fingerprint change) before stability is judged
ATTENTION_SHARE = 0.05  # a median outlier share per sweep above this needs attention
FAIL_SHARE = 0.10  # ... above this in each of the last STABLE_SWEEPS sweeps fails
TREND = 0.02  # the later half's mean share this much above the earlier half's: rising
LAYER_NAMES = {"ops": "layer 1 (operator alignment)", "converge": "layer 2 (convergence)"}


def build(store_dir: str, profile: Profile, partition: str, now: float, window_s: float) -> dict:
    since = now - window_s
    results = load(store_dir, partition, since, now)
    validate = streams.load_validate(store_dir, partition, since, now)
    scaling = streams.load_scaling(store_dir, partition, since, now)
    reference = None
    ref = profile.validate.reference
    if ref and ref != partition:
        try:
            reference = compare.load_side(store_dir, ref, now, window_s)
        except StuneError as exc:
            reference = {"side": ref, "error": str(exc)}
    return page(profile, partition, now, window_s, results, validate, scaling, reference)


def _stage(fail: list, attention: list, pending: list, ok: str, **details) -> dict:
    for state, reasons in ((FAIL, fail), (ATTENTION, attention), (PENDING, pending)):
        if reasons:
            return dict(details, state=state, reason="; ".join(reasons) + ".")
    return dict(details, state=PASS, reason=ok + ".")


def _when(at) -> str:
    return "-" if not at else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def page(profile, partition, now, window_s, results, validate, scaling, reference=None) -> dict:
    settings = judge.Settings.from_profile(profile)
    bases, verdicts = judge.judge(results, settings)
    stages = {
        "runs": runs(profile, results, validate, window_s),
        "correct": correct(validate),
        "fast": fast(bases, verdicts, settings, scaling, results, reference, partition),
        "stable": stable(results, bases, settings),
    }
    worst = next(s for s in STATES if any(st["state"] == s for st in stages.values()))
    return {"partition": partition, "at": now, "window_s": window_s, "state": worst, "stages": stages}


def runs(profile, results, validate, window_s) -> dict:
    counts: dict = {}  # check or layer -> [measured, not measured]
    for r in results:
        counts.setdefault(r["check"], [0, 0])[r["status"] not in ("ok", "fail")] += 1
    for r in validate:
        counts.setdefault(f"validate {r['layer']}", [0, 0])[r["status"] not in ("pass", "fail")] += 1
    last = max([r["at"] for r in results] + [r["at"] for r in validate], default=None)
    measured = sum(c[0] for c in counts.values())
    missing = sum(c[1] for c in counts.values())
    details = {
        "counts": {k: {"measured": c[0], "unknown_or_unavailable": c[1]} for k, c in sorted(counts.items())},
        "last_at": last,
    }
    fail, attention, pending = [], [], []
    days = f"{window_s / 86400:g}d"
    if not counts:
        pending.append(f"no check or validation job stored a result in the last {days}")
    elif not measured:
        latest = max(results + validate, key=lambda r: r["at"])
        fail.append(
            f"{missing} results in the last {days}, none measured (the latest: {latest.get('detail') or latest['status']})"
        )
    wanted = [c.name for c, _ in configured(profile)]
    silent = [c for c in wanted if counts.get(c, [0])[0] == 0]
    if silent and measured:
        attention.append(f"configured check(s) without a measurement in the last {days}: {', '.join(silent)}")
    for layer in ("ops", "converge"):
        c = counts.get(f"validate {layer}")
        if c and not c[0] and measured:
            attention.append(f"{LAYER_NAMES[layer]} ran but measured nothing ({c[1]} unknown or unavailable)")
    ok = f"{measured} measurements, {missing} unknown or unavailable; the latest at {_when(last)}"
    return _stage(fail, attention, pending, ok, **details)


def _op_text(o: dict) -> str:
    rel = o.get("max_rel")
    tol = f" (tolerance {o['tol_rel']:g})" if o.get("tol_rel") is not None else ""
    size = f"max rel error {rel:.3g}{tol}" if rel is not None else o["status"]
    return f"{o['op']}.{o.get('dtype') or '?'} on {o['node']}: {size}"


def correct(validate) -> dict:
    layers = compare.layers(compare.select(validate, lambda r: (r["layer"], r.get("node") or "")))
    fail, attention, pending, ok = [], [], [], []
    for layer in ("ops", "converge"):
        e = layers.get(layer)
        name = LAYER_NAMES[layer]
        if e is None:
            pending.append(f"{name} not measured yet")
            continue
        n = sum(e["nodes"].values())
        if e["status"] == FAIL:
            what = f"{len(e['failing'])} of {n} node(s) fail ({', '.join(e['failing'][:5])})"
            if layer == "ops" and e["worst"]:
                what += f"; the worst operator {_op_text(e['worst'])}"
            if layer == "converge":
                bad = max(
                    (r for r in e["records"] if r["status"] == FAIL), key=lambda r: r.get("max_dev") or 0
                )
                if bad.get("max_dev") is not None:
                    band = f" (band {bad['band']:g})" if bad.get("band") is not None else ""
                    what += f"; loss off the reference by {bad['max_dev']:.3g}{band} on {bad['node']}"
            fail.append(f"{name}: {what}")
        elif e["status"] != PASS:
            detail = next(
                (r.get("detail") for r in e["records"] if r["status"] != PASS and r.get("detail")), ""
            )
            attention.append(
                f"{name}: {n - e['nodes'].get(PASS, 0)} of {n} node(s) {e['status']}"
                + (f" ({detail[:120]})" if detail else "")
            )
        else:
            ok.append(f"{name} passed on {n} node(s)")
    training = layers.get("training")
    if training is None:
        ok.append("layer 3 (training) not reported")
    else:
        r = training["records"][-1]
        said = f"layer 3 (training): {r.get('verdict') or r['status']}" + (
            f" by {r['by']}" if r.get("by") else ""
        )
        if r.get("note"):
            said += f" ({r['note'][:120]})"
        (fail if r["status"] == FAIL else ok if r["status"] == PASS else attention).append(said)
    public = {
        layer: {k: e[k] for k in ("status", "nodes", "failing", "at")}
        | {"worst": compare._op_public(e["worst"])}
        for layer, e in layers.items()
    }
    return _stage(fail, attention, pending, "; ".join(ok), layers=public)


def fast(bases, verdicts, settings, scaling, results, reference, partition) -> dict:
    fail, attention, pending = [], [], []
    outliers = [v for v in verdicts if v.status == judge.OUTLIER]
    no_base = sorted({v.check for v in verdicts if v.status == judge.UNKNOWN})
    based = sorted({v.check for v in verdicts if v.status != judge.UNKNOWN})
    curves = compare.curves(compare.select(scaling, lambda r: (r["check"], r["scope"])))
    if not verdicts and not curves:
        pending.append("no measurement yet")
    for check in no_base:
        peers = max((b.subjects for (c, _), b in bases.items() if c == check), default=0)
        pending.append(
            f"no baseline yet for {check}: {peers} subject(s) under its fingerprint, need {settings.min_peers} (or set a floor)"
        )
    if outliers:
        named = ", ".join(f"{v.subject} ({v.check})" for v in outliers[:5])
        more = f" and {len(outliers) - 5} more" if len(outliers) > 5 else ""
        attention.append(f"{len(outliers)} outlier(s) now: {named}{more}")
    scopes = {"node": "single-node scaling", "nodes": "multi-node scaling"}
    for scope, c in sorted(curves.items()):
        k = c["knee"]
        knee = (
            f" at n={k['n']} (efficiency {k['efficiency'] if k.get('efficiency') is not None else '?'}{': ' + k['why'] if k.get('why') else ''})"
            if k
            else ""
        )
        if c["verdict"] == FAIL:
            fail.append(f"{scopes[scope]} failed{knee}")
        elif c["verdict"] == "knee" or k:
            attention.append(f"{scopes[scope]} has a knee{knee}")
        elif c["verdict"] != PASS:
            pending.append(f"{scopes[scope]}: {c['verdict']}")
    details: dict = {
        "baselines": [  # those the subjects' latest fingerprints are judged by
            {
                "check": b.check,
                "median": round(b.median, 4),
                "subjects": b.subjects,
                "threshold": None if b.threshold is None else round(b.threshold, 4),
                "unit": b.unit,
                "fingerprint": b.fingerprint,
            }
            for b in sorted({v.baseline for v in verdicts if v.baseline is not None})
        ],
        "outliers": [{"subject": v.subject, "check": v.check, "reason": v.reason} for v in outliers],
        "scaling": {
            s: {k: v for k, v in c.items() if k != "points"}
            | {"points": [{"n": n, "efficiency": e} for n, e in sorted(c["points"].items())]}
            for s, c in curves.items()
        },
        "reference": None,
    }
    if reference is not None:
        if "error" in reference:
            details["reference"] = {"partition": reference["side"], "error": reference["error"]}
        else:
            mine = compare.side(partition, compare.LATEST, results)
            doc = compare.compare(reference, mine)
            details["reference"] = {"partition": reference["side"], "rows": doc["rows"]}
    ok = f"baselines for {', '.join(based) or 'no check'}; no outlier" + (
        "; scaling passes" if curves else ""
    )
    return _stage(fail, attention, pending, ok, **details)


def _changed(a: dict, b: dict) -> str:
    def part(fp, k):
        return vendor_of(fp) if k == "vendor" else str(fp.get(k) or "?")

    return ", ".join(
        f"{k} {part(a, k)} -> {part(b, k)}" for k in FINGERPRINT_KEYS if part(a, k) != part(b, k)
    )


def history(results, bases, settings) -> tuple[list[dict], list[dict]]:
    """(per sweep: {sweep, at, subjects, outliers, share}, fingerprint changes: {changed, at, nodes}).
    A subject is an outlier at a sweep when k of its last n runs under its fingerprint then were slow
    against the window's baseline for that fingerprint, one of them in that sweep."""
    sweeps: dict = {}
    changes: dict = {}

    def close(sweep_id: str, at: float, window: list, in_sweep: list) -> None:
        s = sweeps.setdefault(sweep_id, {"sweep": sweep_id, "at": at, "subjects": 0, "outliers": 0})
        s["at"] = min(s["at"], at)
        s["subjects"] += 1
        s["outliers"] += sum(window) >= settings.k and any(in_sweep)

    by: dict = {}
    for r in compare.measured(results):
        by.setdefault((r["check"], r["subject"]), []).append(r)
    for (check, subject), rows in by.items():
        floor = settings.floors.get(check)
        window: list = []
        in_sweep: list = []
        fkey = prev_fp = current = None
        for r in rows:
            key = fingerprint_key(r["fingerprint"])
            if key != fkey:
                if prev_fp is not None:
                    c = changes.setdefault(
                        _changed(prev_fp, r["fingerprint"]), {"at": r["at"], "nodes": set()}
                    )
                    c["at"] = min(c["at"], r["at"])
                    c["nodes"].update(judge.pair_members(subject))
                fkey, prev_fp, window = key, r["fingerprint"], []
            sweep_id = r.get("sweep") or ""
            if current is None or sweep_id != current[0]:
                if current is not None:
                    close(*current, window, in_sweep)
                current, in_sweep = (sweep_id, r["at"]), []
            slow = judge.slow_run(r, bases.get((check, key)), floor)
            window = [*window, slow][-settings.n :]
            in_sweep.append(slow)
        if current is not None:
            close(*current, window, in_sweep)
    out = sorted(sweeps.values(), key=lambda s: s["at"])
    for s in out:
        s["share"] = round(s["outliers"] / s["subjects"], 4) if s["subjects"] else 0.0
    changed = [
        {"changed": k, "at": c["at"], "nodes": len(c["nodes"])}
        for k, c in sorted(changes.items(), key=lambda kv: kv[1]["at"])
    ]
    return out, changed


def stable(results, bases, settings) -> dict:
    sweeps, changes = history(results, bases, settings)
    shares = [s["share"] for s in sweeps]
    trend = "too few sweeps"
    if len(shares) >= STABLE_SWEEPS:
        half = len(shares) // 2
        early, late = sum(shares[:half]) / half, sum(shares[-half:]) / half
        trend = "rising" if late - early > TREND else "falling" if early - late > TREND else "flat"
    details = {"sweeps": sweeps, "trend": trend, "fingerprint_changes": changes}
    fail, attention, pending = [], [], []
    since_change = [s for s in sweeps if not changes or s["at"] >= changes[-1]["at"]]
    if len(sweeps) < STABLE_SWEEPS:
        pending.append(f"{len(sweeps)} sweep(s) in the window; stability needs {STABLE_SWEEPS}")
    elif len(since_change) < STABLE_SWEEPS:
        pending.append(
            f"{len(since_change)} sweep(s) since the latest version change ({changes[-1]['changed']}); stability needs {STABLE_SWEEPS}"
        )
    else:
        last = shares[-STABLE_SWEEPS:]
        med = judge.median(shares)
        if all(s > FAIL_SHARE for s in last):
            fail.append(
                f"each of the last {STABLE_SWEEPS} sweeps had over {FAIL_SHARE:.0%} of its subjects as outliers ({', '.join(f'{s:.0%}' for s in last)})"
            )
        if med > ATTENTION_SHARE:
            attention.append(
                f"the median sweep had {med:.1%} of its subjects as outliers (over {ATTENTION_SHARE:.0%})"
            )
        if trend == "rising":
            attention.append(f"the outlier share is rising ({shares[0]:.1%} -> {shares[-1]:.1%})")
    ok = f"{len(sweeps)} sweeps, outlier share median {judge.median(shares) if shares else 0:.1%}, max {max(shares, default=0):.1%}, trend {trend}"
    return _stage(fail, attention, pending, ok, **details)


def text(doc: dict) -> str:
    st = doc["stages"]
    out = [
        f"partition {doc['partition']}: {doc['state']} (window {doc['window_s'] / 86400:g}d, {_when(doc['at'])})\n"
    ]
    out.append(
        table(
            ((name.upper(), s["state"], s["reason"]) for name, s in st.items()), ("STAGE", "STATE", "REASON")
        )
    )
    counts = st["runs"]["counts"]
    if counts:
        out.append(
            "\nruns\n"
            + table(
                ((k, c["measured"], c["unknown_or_unavailable"]) for k, c in counts.items()),
                ("CHECK", "MEASURED", "UNKNOWN/UNAVAILABLE"),
            )
        )
    layers = st["correct"]["layers"]
    if layers:
        cells = [
            (
                layer,
                e["status"],
                " ".join(f"{k}:{n}" for k, n in sorted(e["nodes"].items())),
                _worst(e["worst"]),
            )
            for layer, e in layers.items()
        ]
        out.append("\ncorrect\n" + table(cells, ("LAYER", "STATUS", "NODES", "WORST OPERATOR")))
    f = st["fast"]
    if f["baselines"] or f["scaling"]:
        out.append("\nfast\n")
        bases = [(b["check"], b["median"], b["unit"], b["subjects"], b["threshold"]) for b in f["baselines"]]
        out.append(table(bases, ("CHECK", "BASELINE", "UNIT", "SUBJECTS", "SLOW BELOW")) if bases else "")
        out.extend(f"outlier {o['subject']}: {o['reason']}\n" for o in f["outliers"][:20])
        for scope, c in f["scaling"].items():
            pts = " ".join(
                f"{p['n']}:{p['efficiency'] if p['efficiency'] is not None else '?'}" for p in c["points"]
            )
            knee = f", knee at n={c['knee']['n']}" if c["knee"] else ""
            out.append(f"scaling {scope} ({c['check']}): {c['verdict']}{knee}; efficiency {pts}\n")
        ref = f["reference"]
        if ref:
            out.append(f"reference {ref['partition']}: {ref.get('error') or ''}\n")
            out.extend(
                f"  {r['metric']}: {r['b']} vs {r['a']} {r['unit']} (x{r['ratio']})\n"
                for r in ref.get("rows", [])
            )
    s = st["stable"]
    if s["sweeps"]:
        sweeps = [
            (w["sweep"], _when(w["at"]), w["subjects"], w["outliers"], f"{w['share']:.1%}")
            for w in s["sweeps"][-10:]
        ]
        out.append(
            f"\nstable (trend {s['trend']})\n"
            + table(sweeps, ("SWEEP", "AT", "SUBJECTS", "OUTLIERS", "SHARE"))
        )
        out.extend(
            f"version change {_when(c['at'])}: {c['changed']} ({c['nodes']} nodes)\n"
            for c in s["fingerprint_changes"]
        )
    return "".join(out)


def _worst(o) -> str:
    return "-" if not o else _op_text(o)
