"""Planning a group comparison before the data exist: the standard error, power and minimum
detectable effect of the default device-level comparison (``zeal.compare.cluster_weighted``)
for a stream's parameters and an assumed fleet.

The model: each group has ``devices`` devices with ``readings`` readings each; device means
spread with standard deviation ``between_sd`` around the group mean; readings spread with
``within_sd`` around their device's mean; every reading is privatized with the stream's
Zeal parameters. The variance of one group's reading-weighted mean is then

    (between_sd**2 + (within_sd**2 + noise) / readings) / devices

where ``noise`` is Zeal's variance averaged over the readings: Var[decode | x] is
quadratic in x (paper 001, Theorem 2, Eq. (14), plus the grid's D**2/6), so its average is
its value at the mean reading plus Var[x] / (s - 1), s = exp(epsilon / 2). Power uses the t
reference of the comparison (2 * devices - 2 degrees of freedom) shifted by the effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zeal.errors import ParameterError
from zeal.estimate import check_real
from zeal.mechanism import Zeal
from zeal.studentt import t_quantile, two_sided_p

__all__ = ["Plan", "plan_comparison", "zero_inflated"]


@dataclass(frozen=True)
class Plan:
    """What a planned comparison can see."""

    std_error: float  # of the difference of the two groups' means
    df: float
    noise_variance: float  # Zeal's variance per reading, averaged over the readings
    power: float  # at `effect`
    detectable: float  # the smallest effect found with `target_power`


def zero_inflated(zero_share: float, positive_mean: float, cv: float) -> tuple[float, float]:
    """(mean, standard deviation) of readings that are 0 with `zero_share`, else positive
    with mean `positive_mean` and coefficient of variation `cv`."""
    if not 0.0 <= zero_share < 1.0:
        raise ParameterError(f"zero_share must be in [0, 1), got {zero_share!r}")
    if positive_mean < 0 or cv < 0:
        raise ParameterError("positive_mean and cv must be non-negative")
    keep = 1.0 - zero_share
    mean = keep * positive_mean
    second = keep * positive_mean * positive_mean * (1.0 + cv * cv)
    return mean, math.sqrt(max(second - mean * mean, 0.0))


def _power(effect: float, std_error: float, df: float, alpha: float) -> float:
    """P(reject) of the two-sided t test when the true difference is `effect`: the shifted
    t approximation of the noncentral t."""
    critical = t_quantile(1.0 - alpha, df)
    shift = abs(effect) / std_error
    upper = (
        two_sided_p(critical - shift, df) / 2
        if critical > shift
        else 1 - two_sided_p(shift - critical, df) / 2
    )
    lower = two_sided_p(critical + shift, df) / 2
    return min(1.0, upper + lower)


def plan_comparison(
    params: Zeal,
    *,
    devices: int,
    readings: int,
    between_sd: float,
    within_sd: float,
    mean: float | None = None,
    effect: float = 0.0,
    alpha: float = 0.05,
    target_power: float = 0.8,
) -> Plan:
    """The plan of a device-level comparison of two groups of `devices` devices each (see
    the module docstring); `mean` is the typical reading (the middle of the range if not
    given)."""
    if devices < 2 or readings < 1:
        raise ParameterError("a comparison needs at least 2 devices per group and 1 reading")
    between, within = check_real("between_sd", between_sd), check_real("within_sd", within_sd)
    if between < 0 or within < 0:
        raise ParameterError("standard deviations must be non-negative")
    if not 0.0 < alpha < 1.0 or not 0.0 < target_power < 1.0:
        raise ParameterError("alpha and target_power must be in (0, 1)")
    centre = (params.lower + params.upper) / 2 if mean is None else check_real("mean", mean)
    s = math.exp(params.epsilon / 2)
    noise = params.variance(centre) + (between * between + within * within) / (s - 1)
    per_group = (between * between + (within * within + noise) / readings) / devices
    std_error = math.sqrt(2 * per_group)
    if not (math.isfinite(noise) and 0.0 < std_error < math.inf):
        raise ParameterError(
            "the planned standard error does not fit in float64: the spreads or the range "
            "are too large"
        )
    df = 2.0 * devices - 2.0
    power = _power(effect, std_error, df, alpha)
    low, high = 0.0, std_error
    while _power(high, std_error, df, alpha) < target_power:
        high *= 2  # power reaches 1 as the effect grows: at most about 60 doublings
    for _ in range(100):
        middle = (low + high) / 2
        if _power(middle, std_error, df, alpha) < target_power:
            low = middle
        else:
            high = middle
    return Plan(std_error, df, noise, power, high)
