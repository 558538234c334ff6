"""Student's t distribution without SciPy: the two-sided tail probability and the quantile,
for the small-sample inference of group comparisons (:mod:`zeal.compare`).

The tail is the regularized incomplete beta function, P(|T| >= t) = I_x(df/2, 1/2) with
x = df / (df + t**2), evaluated by its continued fraction (modified Lentz iteration); the
quantile inverts it by bisection. Both are accurate to about 1e-12 for df >= 1.
"""

from __future__ import annotations

import math

from zeal.errors import ParameterError

__all__ = ["t_quantile", "two_sided_p"]

_TINY = 1e-300
_EPS = 1e-15


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (converges fast for x < (a + 1) / (a + b + 2))."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= d * c
        if abs(d * c - 1.0) < _EPS:
            return result
    return result  # pragma: no cover - 1000 terms are never needed for df >= 1


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for T ~ Student t with `df` degrees of freedom (df may be fractional,
    as Welch-Satterthwaite gives it; df = inf is the normal)."""
    if not df > 0:
        raise ParameterError(f"degrees of freedom must be positive, got {df!r}")
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2))
    return regularized_beta(df / 2, 0.5, df / (df + t * t))


def t_quantile(confidence: float, df: float) -> float:
    """q such that P(|T| <= q) = confidence for T ~ t(df): the half-width multiplier of a
    two-sided interval."""
    if not 0.0 < confidence < 1.0:
        raise ParameterError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = 1.0 - confidence
    low, high = 0.0, 1.0
    while two_sided_p(high, df) > alpha:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2
        if two_sided_p(mid, df) > alpha:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * max(1.0, high):
            break
    return (low + high) / 2
