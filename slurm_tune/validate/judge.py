"""Judging the layers' measurements (pure: records in, records out; the store and Slurm are run.py's).

Layer 1: an operator passes when its largest error against fp64 on the CPU is within its tolerance,
`max_abs <= tol_abs + tol_rel x scale` (scale: the largest |value| of the fp64 output), and, where there is
a reference record (the `validate.reference` partition's, or this partition's previous one), when its sample
differs from the reference's sample by at most twice that (each platform may be off by its tolerance, in
opposite directions). Non-finite outputs fail. An operator the backend cannot run is `unsupported`, one
that raised anything else `unknown`: neither fails.

Layer 2: the loss curve, smoothed as means over windows of WINDOW points, is within `band` (relative) of
the reference's at every window; the first window outside fails, named with its steps and how far off.
"""

from __future__ import annotations

from .records import MEASURED, version_matrix

# `<op>.<dtype>` -> (abs, rel), rel against the output's scale. Sound for the suite's sizes (opsuite.py):
# fp32 with TF32 off is a few 1e-7 of the scale on every backend; conv2d leaves room for cuDNN's Winograd and
# FFT algorithms; bf16 and fp16 outputs are rounded to 8 and 11 significant bits (2^-9 = 2e-3 and 2^-12 =
# 2.4e-4 of the value), and fp16 GEMMs may reduce split-K partial sums in fp16.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "matmul.fp32": (1e-6, 1e-5),
    "matmul.bf16": (1e-3, 1e-2),
    "matmul.fp16": (1e-4, 2e-3),
    "softmax.fp32": (1e-7, 1e-5),
    "layer_norm.fp32": (1e-6, 1e-5),
    "attention.fp32": (1e-6, 2e-5),
    "conv2d.fp32": (1e-6, 1e-4),
    "sum.fp32": (1e-6, 1e-5),
    "mean.fp32": (1e-7, 1e-5),
}
FALLBACK = {"fp32": (1e-6, 1e-5), "bf16": (1e-3, 1e-2), "fp16": (1e-4, 2e-3)}
WINDOW = 10
REFERENCE_SLACK = 2.0  # two platforms each within tolerance of fp64 are within twice it of each other


def tolerance(op: str, dtype: str, overrides: dict) -> tuple[float, float]:
    key = f"{op}.{dtype}"
    if key in overrides:
        o = overrides[key]
        base = DEFAULT_TOLERANCES.get(key, FALLBACK.get(dtype, (0.0, 0.0)))
        return (
            base[0] if o.get("abs") is None else float(o["abs"]),
            base[1] if o.get("rel") is None else float(o["rel"]),
        )
    return DEFAULT_TOLERANCES.get(key, FALLBACK.get(dtype, (0.0, 1e-5)))


def _ref_op(reference: dict | None, op: str, dtype: str) -> dict | None:
    for e in (reference or {}).get("ops", ()):
        if e.get("op") == op and e.get("dtype") == dtype and e.get("status") == "pass" and e.get("sample"):
            return e
    return None


def _against_reference(e: dict, ref: dict, allowed_of) -> tuple[bool | None, float | None]:
    """(within, max |sample - reference sample|); within None when the samples cannot be compared."""
    a, b = e.get("sample") or [], ref.get("sample") or []
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(a) != len(b) or not pairs:
        return None, None
    diff = max(abs(x - y) for x, y in pairs)
    return diff <= REFERENCE_SLACK * allowed_of(max(e.get("scale") or 0.0, ref.get("scale") or 0.0)), diff


def judge_op(e: dict, overrides: dict, reference: dict | None, ref_label: str) -> dict:
    tol_abs, tol_rel = tolerance(e["op"], e["dtype"], overrides)
    out = dict(e, tol_abs=tol_abs, tol_rel=tol_rel, ref=None)
    if e["status"] == "unsupported":
        return out
    if e["status"] != MEASURED:  # the script's `error`: it could not say
        return dict(out, status="unknown")
    allowed_of = lambda scale: tol_abs + tol_rel * scale
    name = f"{e['op']}/{e['dtype']}"
    if e.get("nonfinite"):
        return dict(out, status="fail", detail=f"{name}: {e['nonfinite']} non-finite output value(s)")
    if e["max_abs"] > allowed_of(e["scale"]):
        return dict(
            out,
            status="fail",
            detail=f"{name}: max abs err {e['max_abs']:.3g} (max rel {e['max_rel']:.3g}) against fp64 on the "
            f"CPU exceeds the tolerance (abs {tol_abs:g} + rel {tol_rel:g} x scale {e['scale']:.3g})",
        )
    ref = _ref_op(reference, e["op"], e["dtype"])
    if reference is None:
        return dict(out, status="pass")
    if ref is None:
        out["ref"] = {"against": ref_label, "status": "unknown", "detail": "no passing result to compare"}
        return dict(out, status="pass")
    within, diff = _against_reference(e, ref, allowed_of)
    out["ref"] = {
        "against": ref_label,
        "node": reference.get("node", ""),
        "at": reference.get("at"),
        "max_abs": diff,
        "status": "unknown" if within is None else ("pass" if within else "fail"),
    }
    if within is False:
        return dict(
            out,
            status="fail",
            detail=f"{name}: differs from {ref_label} (node {reference.get('node', '?')}) by {diff:.3g}, over "
            f"twice the tolerance (abs {tol_abs:g} + rel {tol_rel:g} x scale)",
        )
    return dict(out, status="pass")


def judge_ops(record: dict, overrides: dict, reference: dict | None, ref_label: str = "") -> dict:
    """The agent's ops record, judged: every operator's status, tolerance and reference comparison, and the
    layer's status (fail if an operator fails; unknown if one could not say or none could run)."""
    if record["status"] in ("unavailable",) or not record.get("ops"):
        return record
    skipped = ""
    if reference is not None and reference.get("seed") != record.get("seed"):  # other inputs, other outputs
        skipped = f"; {ref_label}'s layer-1 record ran seed {reference.get('seed')}, this one {record.get('seed')}: not compared"
        reference = None
    ops = [judge_op(e, overrides, reference, ref_label) for e in record["ops"]]
    failed = [e for e in ops if e["status"] == "fail"]
    unknown = [e for e in ops if e["status"] == "unknown"]
    ran = [e for e in ops if e["status"] != "unsupported"]
    unsupported = [f"{e['op']}/{e['dtype']}" for e in ops if e["status"] == "unsupported"]
    note = f"; unsupported here: {', '.join(unsupported)}" if unsupported else ""
    if skipped:
        note += skipped
    elif ref_label and reference is None:
        note += f"; no passing layer-1 record of {ref_label} stored to compare with"
    if failed:
        status = "fail"
        detail = (
            "; ".join(e["detail"] for e in failed)
            + f"; version matrix: {version_matrix(record['fingerprint'])}"
            + note
        )
    elif unknown or not ran:
        status = "unknown"
        detail = (
            "; ".join(f"{e['op']}/{e['dtype']}: {e.get('detail') or 'no result'}" for e in unknown)
            or "no operator could run here"
        ) + note
    else:
        status = "pass"
        detail = (
            f"{len(ran)} operators within tolerance" + (f" and match {ref_label}" if reference else "") + note
        )
    return dict(record, ops=ops, status=status, detail=detail[:2000])


def windows(losses: list, width: int = WINDOW) -> list[float | None]:
    out = []
    for i in range(0, len(losses), width):
        chunk = losses[i : i + width]
        out.append(None if any(x is None for x in chunk) else sum(chunk) / len(chunk))
    return out


def judge_converge(
    record: dict, reference: dict | None, band: float, ref_label: str = "", recording: bool = False
) -> dict:
    """The agent's converge record against the reference curve. `reference` None and `recording`: this run
    becomes the reference (pass, "reference recorded"); None otherwise: unknown (none stored to compare)."""
    if record["status"] == "unavailable" or not record.get("losses"):
        return record
    out = dict(record, band=band, reference=None, max_dev=None)
    losses = record["losses"]
    every = record.get("loss_every", 1)
    if None in losses:
        step = losses.index(None) * every
        return dict(out, status="fail", detail=f"the loss became non-finite by step {step}")
    if reference is None:
        if recording:
            return dict(out, status="pass", detail="reference recorded")
        return dict(
            out,
            status="unknown",
            detail=f"no passing layer-2 run of {ref_label} stored to compare with (run stune-validate run -p "
            f"{ref_label} first)",
        )
    out["reference"] = {"against": ref_label, "node": reference.get("node", ""), "at": reference.get("at")}
    same = ("steps", "seed", "loss_every")
    if any(record.get(k) != reference.get(k) for k in same):
        return dict(
            out,
            status="unknown",
            detail=f"{ref_label}'s stored run is not comparable: "
            + ", ".join(f"{k} {reference.get(k)} vs {record.get(k)}" for k in same),
        )
    mine, theirs = windows(losses), windows(reference["losses"])
    devs = [
        (i, m, t, abs(m - t) / abs(t) if t else abs(m - t))
        for i, (m, t) in enumerate(zip(mine, theirs))
        if m is not None and t is not None
    ]
    out["max_dev"] = max(d[3] for d in devs) if devs else None
    for i, m, t, dev in devs:
        if dev > band:
            first, last = i * WINDOW * every, min(len(losses), (i + 1) * WINDOW) * every - 1
            return dict(
                out,
                status="fail",
                detail=f"loss over steps {first}-{last}: {m:.5g} vs {ref_label}'s {t:.5g} "
                f"({dev if m >= t else -dev:+.2%}, band {band:.2%}); version matrix: {version_matrix(record['fingerprint'])}",
            )
    return dict(
        out, status="pass", detail=f"within {band:.2%} of {ref_label} (max {out['max_dev'] or 0:.2%})"
    )
