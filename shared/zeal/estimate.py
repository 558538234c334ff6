"""Estimates of the average from codes, and the paper's Bernstein bounds (Theorems 3 and 4).

The paper states Theorem 3 (Eq. (17)) as ``P(|Delta| >= lam) <= exp(-(n lam)^2/2 / (sum Var +
(C+h) n lam / 3))``. Bernstein's inequality gives that for one side; the two-sided event
needs a factor 2, which the paper omits. The functions here include it. Theorem 4 (Eq. (20))
is Theorem 3 applied to ``lam * |AVG|``; the paper's printed form carries an extra factor n
(``(n S lam)^2``) that does not follow from Theorem 3, so it is derived again here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from zeal.errors import ParameterError

__all__ = [
    "Difference",
    "Estimate",
    "bernstein_half_width",
    "bernstein_tail",
    "check_confidence",
    "check_integer",
    "check_real",
    "cut",
    "difference_of",
]


@dataclass(frozen=True)
class Estimate:
    """The debiased average AVG* (Eq. (15)) of a set of codes, with its uncertainty.

    ``ci`` is the normal-approximation interval from the sample variance; ``guaranteed`` is
    the two-sided Bernstein interval (Theorem 3), valid for any readings in range whatever n.
    Both are cut to ``[lower, upper]`` (``cut``): the average lies there, so cutting keeps
    their coverage. ``in_range`` says whether ``mean`` lies in ``[lower, upper]``: at small n
    the unbiased estimate can fall outside (even outside its cut intervals) and is
    deliberately not clamped.
    """

    mean: float
    n: int
    std_error: float
    ci: tuple[float, float]
    guaranteed: tuple[float, float]
    in_range: bool
    confidence: float


def cut(low: float, high: float, lower: float, upper: float) -> tuple[float, float]:
    """The interval [low, high] cut to [lower, upper]: each end moved into the range, so an
    interval wholly outside it becomes its nearest bound. For an estimand that lies in the
    range, the cut interval holds it exactly when the interval does."""
    return min(max(low, lower), upper), max(min(high, upper), lower)


def check_real(name: str, value: object) -> float:
    """A finite real number (bools and non-numbers refused), as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ParameterError(f"{name} must be a real number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ParameterError(f"{name} must be finite, got {value!r}")
    return result


def check_integer(name: str, value: object, low: int, high: int) -> int:
    """An integer in [low, high] (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= int(value) <= high:
        raise ParameterError(f"{name}={value!r} is outside [{low}, {high}]")
    return int(value)


def check_confidence(confidence: float) -> float:
    """Validate a confidence level in (0, 1)."""
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise ParameterError(f"confidence must be a number in (0, 1), got {confidence!r}")
    value = float(confidence)
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise ParameterError(f"confidence must be in (0, 1), got {confidence!r}")
    return value


def normal_quantile(confidence: float) -> float:
    """z such that a centred normal interval of +-z sigma has the given coverage."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def bernstein_tail(lam: float, *, n: int, variance: float, bound: float) -> float:
    """Two-sided Bernstein bound on P(|mean error| >= lam) (Theorem 3, Eq. (17), times 2).

    ``variance`` bounds each reading's variance, ``bound`` each |x_hat - x|.
    """
    if not (math.isfinite(lam) and lam >= 0):
        raise ParameterError(f"lam must be a finite number >= 0, got {lam!r}")
    if n < 1:
        raise ParameterError(f"n must be at least 1, got {n!r}")
    t = n * lam
    exponent = -(t * t / 2) / (n * variance + bound * t / 3)
    return min(1.0, 2.0 * math.exp(exponent))


def bernstein_half_width(confidence: float, *, n: int, variance: float, bound: float) -> float:
    """The lam at which the two-sided Bernstein bound equals 1 - confidence.

    Solves (n lam)^2 / 2 = L (n V + M n lam / 3) with L = ln(2 / (1 - confidence)).
    """
    log_term = math.log(2.0 / (1.0 - confidence))
    a = log_term * bound / 3
    return (a + math.sqrt(a * a + 2 * n * log_term * variance)) / n


@dataclass(frozen=True)
class Difference:
    """a.mean - b.mean of two independent estimates, with its normal interval and the
    two-sided p-value of "equal means" (None when the standard error is 0)."""

    difference: float
    std_error: float
    ci: tuple[float, float]
    p_value: float | None
    confidence: float


def difference_of(a: Estimate, b: Estimate, confidence: float) -> Difference:
    """The difference of two averages as independent normal estimates: the standard error
    is sqrt(se_a^2 + se_b^2). Valid when every reading is independent of every other
    (readings of different devices, one reading each); readings of one device are
    correlated in real fleets, and this standard error is then too small."""
    check_confidence(confidence)
    diff = a.mean - b.mean
    se = math.hypot(a.std_error, b.std_error)
    z = normal_quantile(confidence)
    p_value = 2 * (1 - NormalDist().cdf(abs(diff) / se)) if se > 0 else None
    return Difference(diff, se, (diff - z * se, diff + z * se), p_value, confidence)
