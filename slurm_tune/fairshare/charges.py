"""Per-job charges, vectorized: eta, coverage, the idle penalty and Slurm's usage decay.

Slurm (priority/multifactor) adds, every PriorityCalcPeriod, billing x seconds x QOS UsageFactor to the
job's association and its parents, and multiplies all usage by d^seconds with d = 1 - 0.693 / half-life.
In the continuous limit a run over [s, e] contributes, as of time T,

    billing x UsageFactor x integral_s^e d^(T - t) dt = rate x d^(T-e) x (d^(e-s) - 1) / ln d

which is what `decayed_seconds` computes (and e - s when PriorityDecayHalfLife is 0: no decay).
stune's charge is the same times (1 + alpha x (1 - eta)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..frozen import Frozen
from .sacct import JobTable
from .sacct import _factorize as sacct_factorize

SLURM_LN2 = 0.693  # priority_multifactor.c uses 0.693, not ln 2


def decay_factor(half_life_s: float) -> float:
    """Slurm's per-second decay factor."""
    return 1.0 - SLURM_LN2 / half_life_s if half_life_s > 0 else 1.0


def decay_to(value, seconds, half_life_s: float):
    """Usage stored `seconds` ago, decayed to now."""
    d = decay_factor(half_life_s)
    if d == 1.0:
        return value
    return value * np.power(d, np.maximum(seconds, 0))


def decayed_seconds(start, end, as_of, half_life_s: float) -> np.ndarray:
    """integral_start^end d^(as_of - t) dt, elementwise (seconds of run, decayed to `as_of`)."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    span = np.maximum(end - start, 0.0)
    d = decay_factor(half_life_s)
    if d == 1.0:
        return span
    lam = np.log(d)  # < 0
    # expm1 keeps short runs exact where d^(e-s) - 1 would cancel
    return np.exp(lam * np.maximum(as_of - end, 0.0)) * np.expm1(lam * span) / lam


@dataclass
class Charges:
    """Per-row results. `slurm` is what Slurm charges (the eta = 1 reference), `stune` the penalized charge,
    both already decayed to `as_of`; `eta` is the utilization used (1 where not trusted)."""

    as_of: int
    alpha: object  # float, or a per-row array where accountant.alpha_by overrides it
    eta: np.ndarray
    eta_measured: np.ndarray  # NaN where there is no measurement
    coverage: np.ndarray  # sampled share of held GPU-seconds (0 without a summary)
    trusted: np.ndarray  # bool: eta came from a measurement
    source: np.ndarray  # int8: 0 none, 1 stune summary, 2 Slurm gres/gpuutil
    held_gpu_s: np.ndarray  # GPUs x elapsed (undecayed)
    used_gpu_s: np.ndarray  # held x eta_measured where measured, else NaN
    slurm: np.ndarray
    stune: np.ndarray


def measured_eta(table: JobTable, coverage_min: float):
    """(eta, eta_measured, coverage, trusted, source) per row. A stune summary wins over Slurm's gpuutil;
    low coverage or no GPUs means eta = 1 (charged as Slurm charges)."""
    held = table.gpus * table.elapsed.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        coverage = np.where(table.has_summary & (held > 0), table.covered_s / held, 0.0)
        from_summary = np.where(table.covered_s > 0, table.used_s / table.covered_s, np.nan)
    # the sampler sees the job from prolog to epilog, a little longer than Slurm's elapsed time
    coverage = np.minimum(np.nan_to_num(coverage, nan=0.0), 1.0)
    stune_ok = table.has_summary & (held > 0) & (coverage >= coverage_min) & (table.covered_s > 0)
    slurm_ok = ~stune_ok & (held > 0) & ~np.isnan(table.gpuutil) & (table.gpuutil_cover >= coverage_min)
    eta_measured = np.where(stune_ok, from_summary, np.where(slurm_ok, table.gpuutil / 100.0, np.nan))
    eta_measured = np.clip(eta_measured, 0.0, 1.0)
    trusted = stune_ok | slurm_ok
    eta = np.where(trusted, eta_measured, 1.0)
    source = np.where(stune_ok, 1, np.where(slurm_ok, 2, 0)).astype(np.int8)
    coverage = np.where(slurm_ok, table.gpuutil_cover, coverage)
    # a summary that says "measured" for part of the job still tells the report what was seen
    eta_seen = np.where(
        np.isnan(eta_measured) & table.has_summary & (table.covered_s > 0),
        np.clip(from_summary, 0.0, 1.0),
        eta_measured,
    )
    return eta, eta_seen, coverage, trusted, source


def alpha_per_row(table: JobTable, alpha: float, alpha_by: Frozen | dict | None) -> np.ndarray | float:
    """The idle penalty of each row: accountant.alpha_by's QOS, else partition, else account entry, else the
    default `alpha`. A plain float when no override exists (the common case costs nothing)."""
    by = alpha_by.to_dict() if isinstance(alpha_by, Frozen) else (alpha_by or {})
    qos, part, acct = (by.get(k) or {} for k in ("qos", "partition", "account"))
    if not (qos or part or acct) or not table.n:
        return alpha
    out = np.full(table.n, float(alpha))
    if acct:
        names = [a for a, _ in table.assoc_keys]
        per_assoc = np.array([acct.get(a, np.nan) for a in names] or [np.nan])
        value = per_assoc[table.assoc]
        out = np.where(np.isnan(value), out, value)
    if part:
        codes, names = sacct_factorize(table.partition)
        # a job may name several partitions while pending; it ran in the first
        per = np.array([part.get(n.split(",", 1)[0], np.nan) for n in names] or [np.nan])
        value = per[codes]
        out = np.where(np.isnan(value), out, value)
    if qos:
        per = np.array([qos.get(n, np.nan) for n in table.qos_names] or [np.nan])
        value = per[table.qos]
        out = np.where(np.isnan(value), out, value)
    return out


def compute(
    table: JobTable,
    rows: np.ndarray,
    *,
    as_of: int,
    half_life_s: float,
    alpha: float,
    coverage_min: float,
    basis: str = "billing",
    qos_usage_factor: dict | None = None,
    alpha_by: Frozen | dict | None = None,
) -> Charges:
    """Charges for the rows selected by the boolean mask or index array `rows`, as of `as_of`."""
    alphas = alpha_per_row(table, alpha, alpha_by)
    eta, eta_seen, coverage, trusted, source = measured_eta(table, coverage_min)
    rate = table.gpus.copy() if basis == "gpu" else table.billing.copy()
    if qos_usage_factor:
        factors = np.array([qos_usage_factor.get(q, 1.0) for q in table.qos_names] or [1.0])
        rate *= factors[table.qos]
    end = np.where(table.end >= 0, table.end, as_of).astype(np.float64)
    end = np.minimum(end, as_of)
    begin = end - table.elapsed.astype(np.float64)
    seconds = decayed_seconds(begin, end, as_of, half_life_s)
    mask = np.zeros(table.n, dtype=bool)
    mask[rows] = True
    slurm = np.where(mask, rate * seconds, 0.0)
    stune = slurm * (1.0 + alphas * (1.0 - eta))
    held = table.gpus * table.elapsed.astype(np.float64)
    return Charges(
        alpha=alphas,
        as_of=as_of,
        eta=eta,
        eta_measured=eta_seen,
        coverage=coverage,
        trusted=trusted,
        source=source,
        held_gpu_s=held,
        used_gpu_s=held * eta_seen,
        slurm=slurm,
        stune=stune,
    )


def per_assoc(table: JobTable, values: np.ndarray) -> dict:
    """Sum a per-row array by association: {(account, user): total}."""
    totals = np.bincount(table.assoc, weights=values, minlength=len(table.assoc_keys))
    return {key: float(totals[i]) for i, key in enumerate(table.assoc_keys) if totals[i]}
