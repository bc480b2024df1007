"""The statistics of the lemon test: the Poisson upper tail, its exact lower confidence bound, and Holm's
step-down order. Plain floats (math), no scipy: the tail is the regularized lower incomplete gamma function,
P(X >= k | mu) = P(k, mu), by its series where mu < k + 1 and by its continued fraction (1 - Q) elsewhere
(Numerical Recipes' gser/gcf), accurate to ~1e-14 relative and tiny p-values kept (1e-300, not 0).
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300
_ITERATIONS = 10_000


def poisson_sf(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu): the one-sided p-value of k events where mu were expected."""
    if k <= 0:
        return 1.0
    if mu <= 0:
        return 0.0
    if not math.isfinite(mu):
        return 1.0
    if mu < k + 1:
        return _lower_series(k, mu)
    return 1.0 - _upper_fraction(k, mu)


def _lower_series(a: float, x: float) -> float:
    """P(a, x) by its series (x < a + 1): converges in O(sqrt(a)) terms."""
    term = total = 1.0 / a
    n = a
    for _ in range(_ITERATIONS):
        n += 1
        term *= x / n
        total += term
        if term < total * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _upper_fraction(a: float, x: float) -> float:
    """Q(a, x) = 1 - P(a, x) by Lentz's continued fraction (x >= a + 1)."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _ITERATIONS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def poisson_lower_bound(k: int, level: float) -> float:
    """The exact one-sided lower confidence bound on a Poisson mean from k observed events (Garwood): the mu at
    which P(X >= k | mu) = level. 0 for k = 0. Bisection on a monotone function: 0 <= mu < k."""
    if k <= 0:
        return 0.0
    low, high = 0.0, float(k)
    for _ in range(200):
        mid = (low + high) / 2
        if poisson_sf(k, mid) < level:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * max(1.0, high):
            break
    return low


def fisher(p_values: list[float]) -> float:
    """Fisher's combination of independent one-sided p-values: P(chi2(2m) >= -2 sum ln p). With discrete
    p-values (P(X >= k)) it errs towards larger combined values, never smaller ones."""
    if not p_values:
        return 1.0
    half = -sum(math.log(max(p, _TINY)) for p in p_values)  # x / 2
    term = total = math.exp(-half)
    for i in range(1, len(p_values)):
        term *= half / i
        total += term
    return min(total, 1.0)


def holm_threshold(alpha: float, tests: int, step: int) -> float:
    """The level the step-th smallest p-value (0-based) is held to in Holm's step-down procedure over `tests`
    tests: alpha / (tests - step). Holm controls the family-wise error rate at alpha under any dependence
    between the tests (nodes share jobs, so their counts are not independent)."""
    return alpha / max(tests - step, 1)
