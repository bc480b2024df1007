"""The SiteFactor line: what SiteFactor a pending job gets, from its association's two fair-share factors.

The SiteFactor of a pending job of association A is

    clamp(round(a x F_stune(A) + b - W x F_slurm(A)), site_factor.min, site_factor.max)

with W = PriorityWeightFairshare, F_slurm Slurm's formula over Slurm's own charges (eta = 1 everywhere) and
F_stune the same formula over stune's penalized charges. Slurm adds W x F_slurm(A) itself, so a pending job's
fair-share points plus its SiteFactor are a x F_stune(A) + b for everyone: the order of pending jobs is
exactly stune's fair-share order. (A plain W x (F_stune - F_slurm) capped at 0 would only tie users whose
ranks swapped: the one who gains is capped, the other loses exactly the gap.) a and b are chosen over all
user associations so that

- nobody gains: a x F_stune + b <= W x F_slurm for every association (penalties only, so a forged or missing
  measurement can at best restore Slurm's own priority); b is the largest value that allows, and the top
  gainer gets exactly 0;
- nobody sinks to Slurm's floor: the lowest a x F_stune + b is at least 1 point (a job priority below 1 is
  raised to 1, and ties there would again leave the order to submit time);
- the spread is as wide as possible: a = W (a pure shift, b = -max W x (F_stune - F_slurm)) whenever that
  keeps everyone above the floor, else the largest a < W that does.

- every SiteFactor is at least site_factor.min (default -2 W, below anything the line gives): a clamp after
  the line would tie the associations it cuts, so the line is chosen within the range, and a minimum no line
  with a > 0 fits is refused (a ConfigError naming the setting; 1 - W or lower always fits).

With eta = 1 everywhere F_stune = F_slurm, a = W, b = 0 and stune changes nothing.
"""

from __future__ import annotations

import numpy as np

FLOOR_POINTS = 1.0  # Slurm raises a job priority below 1 to 1


def site_factor_line(
    weight: int, shares_slurm, shares_stune, lo: int | None = None, hi: int = 0
) -> tuple[float, float] | None:
    """(a, b) of the module doc: every pending job's fair-share points plus SiteFactor become a x F_stune + b,
    chosen so that every SiteFactor also lies in the configured [lo, hi] (site_factor.min/max): a clamp after
    the line would tie (or swap) the associations it cuts. None when no line with a > 0 fits in that range
    (Slurm's own fair-share points spread wider than the range allows)."""
    pairs = [
        (shares_slurm.factors[k], f) for k, f in shares_stune.factors.items() if k in shares_slurm.factors
    ]
    if not pairs or weight <= 0:
        return float(weight), 0.0
    s = np.array([f for _, f in pairs], dtype=float)
    r = weight * np.array([f for f, _ in pairs], dtype=float)
    high = r + min(hi, 0)  # penalties only: the top gainer gets at most 0 even where max allows more
    floor = np.full_like(r, FLOOR_POINTS)
    scale = _widest_slope(weight, s, floor if lo is None else np.maximum(floor, r + lo), high)
    if scale is None:
        if lo is not None and _widest_slope(weight, s, floor, high) is not None:
            return None  # the configured minimum is what cuts the line
        scale = 0.0  # even the floor cannot hold (W too small for this many users): as flat as Slurm allows
    return scale, float(np.min(high - scale * s))


def _widest_slope(weight: int, s, low, high) -> float | None:
    """The largest a in (0, W] for which one b puts low <= a x s + b <= high for every association, or None.
    The room left for b, min(high - a s) - max(low - a s), is concave in a (a min of lines minus a max of
    lines): find where it peaks, then the largest a past the peak where it is still >= 0."""

    def room(a: float) -> float:
        return float(np.min(high - a * s) - np.max(low - a * s))

    eps = 1e-9 * max(weight, 1)
    if room(weight) >= -eps:
        return float(weight)
    left, right = 0.0, float(weight)
    for _ in range(100):
        m1, m2 = left + (right - left) / 3, right - (right - left) / 3
        if room(m1) < room(m2):
            left = m1
        else:
            right = m2
    if room((left + right) / 2) < -eps:
        return None
    left, right = (left + right) / 2, float(weight)
    for _ in range(100):
        mid = (left + right) / 2
        if room(mid) >= -eps:
            left = mid
        else:
            right = mid
    return left if left > eps else None


def site_factor_floor(config, weight: int) -> int:
    """The lowest SiteFactor: site_factor.min, by default -2 W (below anything the line gives)."""
    lo = config.site_factor.min
    return lo if lo is not None else -2 * weight


def site_factor_target(
    config, weight: int, f_slurm: float, f_stune: float, line: tuple[float, float] | None = None
) -> int:
    """The SiteFactor of a pending job whose association has these two fair-share factors (module doc)."""
    scale, offset = line if line is not None else (float(weight), 0.0)
    return max(
        site_factor_floor(config, weight),
        # (int(): round() of a numpy scalar gives a numpy float on older numpy)
        min(config.site_factor.max, int(round(scale * f_stune + offset - weight * f_slurm))),  # noqa: RUF046
    )
