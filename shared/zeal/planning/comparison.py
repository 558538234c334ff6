"""Planning a group comparison before the data exist: the standard error, power and minimum
detectable effect of the default device-level comparison (``zeal.compare.cluster_weighted``)
for a stream's parameters and an assumed fleet.

The model: each group has ``devices`` devices with ``readings`` readings each; device means
spread with standard deviation ``between_sd`` around the group mean; readings spread with
``within_sd`` around their device's mean; every reading is privatized with the stream's
Zeal parameters. The variance of one group's reading-weighted mean is then

    (between_sd**2 * (1 + readings_cv**2) + (within_sd**2 + noise) / readings) / devices

where ``noise`` is Zeal's variance averaged over the readings: Var[decode | x] is
quadratic in x (paper 001, Theorem 2, Eq. (14), plus the grid's D**2/6), so its average is
its value at the mean reading plus Var[x] / (s - 1), s = exp(epsilon / 2). When devices
report different numbers of readings (mean ``readings``, coefficient of variation
``readings_cv``), the reading weights give the between-device part the factor
sum(n_i**2) / (sum n_i)**2 = (1 + readings_cv**2) / devices, to first order; the noise part,
sum(n_i) * v / (sum n_i)**2, stays v / (devices * readings). Power uses the t
reference of the comparison (2 * devices - 2 degrees of freedom) shifted by the effect;
for skewed (lognormal) device means, where that approximation is too low, a seeded
simulation of the test (:class:`_Fleet`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from zeal._core.mechanism import Zeal
from zeal._core.studentt import t_quantile, two_sided_p
from zeal.errors import ParameterError
from zeal.estimate import check_real

__all__ = ["SIMULATED_DEVICES", "Plan", "plan_comparison", "reading_noise", "zero_inflated"]

_F = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Plan:
    """What a planned comparison can see."""

    std_error: float  # of the difference of the two groups' means
    df: float
    noise_variance: float  # Zeal's variance per reading, averaged over the readings
    power: float  # at `effect`
    detectable: float  # the smallest effect found with `target_power`
    power_from: str = "t approximation"  # or the simulation it comes from


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


def reading_noise(params: Zeal, mean: float, sd: float) -> float:
    """Zeal's variance per reading averaged over readings of mean `mean` and standard
    deviation `sd`: Var[decode | x] is quadratic in x with leading coefficient 1 / (s - 1),
    s = exp(epsilon / 2) (paper 001, Theorem 2, Eq. (14), plus the grid's D**2/6), so its
    average is its value at the mean plus sd**2 / (s - 1)."""
    return params.variance(mean) + sd * sd / (math.exp(params.epsilon / 2) - 1)


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


#: Skewed device means are simulated up to this many devices per group; beyond it the
#: t approximation holds (the cluster standard error averages over that many devices).
SIMULATED_DEVICES: Final = 1_000
_ELEMENTS: Final = 1_000_000  # per simulated array: repetitions x devices, at most


@dataclass(frozen=True)
class _Fleet:
    """A fleet whose device means are lognormal: ``lower`` plus a lognormal with mean
    ``centre - lower`` and standard deviation ``between``; each device's mean of n readings
    adds a normal error of variance ``spread / n`` (readings and Zeal's noise), n gamma
    distributed with mean ``readings`` and coefficient of variation ``readings_cv``.

    The closed form gives the standard error exactly for any shape, but not the power:
    with skewed device means the cluster standard error is itself skewed (its median is
    below its mean), so the test rejects more often than the t approximation says. A
    seeded simulation of the test itself (``zeal.compare.cluster_weighted``: CR1 variance,
    Satterthwaite degrees of freedom) gives the power; a true effect shifts group A's
    differences only, so one simulation serves every effect."""

    lower: float
    centre: float
    between: float
    spread: float
    readings: int
    readings_cv: float

    def _group(self, rng: np.random.Generator, rows: int, devices: int) -> tuple[_F, _F]:
        """Each repetition's reading-weighted mean and its CR1 variance, for one group."""
        excess = self.centre - self.lower
        if excess <= 0:
            raise ParameterError(
                "lognormal device means need a typical reading (mean) above the range's lower end"
            )
        # log(1 + ratio**2); past 1e150 the square would overflow, and the 1 is nothing
        ratio = self.between / excess
        sigma2 = math.log1p(ratio**2) if ratio < 1e150 else 2.0 * math.log(ratio)
        size = (rows, devices)
        means = self.lower + rng.lognormal(math.log(excess) - sigma2 / 2, math.sqrt(sigma2), size)
        cv2 = self.readings_cv**2
        n = (
            np.maximum(1.0, self.readings * rng.gamma(1 / cv2, cv2, size))
            if cv2 > 0
            else np.full(size, float(self.readings))
        )
        means += rng.standard_normal(size) * np.sqrt(self.spread / n)
        total = n.sum(axis=1)
        mean = (n * means).sum(axis=1) / total
        residual = n * (means - mean[:, None])
        variance = devices / (devices - 1) * (residual * residual).sum(axis=1) / total**2
        return mean, variance

    def power(self, devices: int, alpha: float) -> tuple[Callable[[float], float], int]:
        """The simulated power as a function of the effect, and the repetitions behind it."""
        reps = max(2_000, min(20_000, 2 * _ELEMENTS // devices))
        rows = max(1, _ELEMENTS // devices)
        rng = np.random.default_rng(20_260_101)  # planning, not privacy: a fixed seed
        parts = []
        for begin in range(0, reps, rows):
            count = min(rows, reps - begin)
            (ma, va), (mb, vb) = (self._group(rng, count, devices) for _ in range(2))
            df = (va + vb) ** 2 / ((va * va + vb * vb) / (devices - 1))
            parts.append((ma - mb, np.sqrt(va + vb), df))
        difference, se, df = (np.concatenate(p) for p in zip(*parts, strict=True))
        grid = np.linspace(devices - 1.0, 2.0 * devices - 2.0, 65)
        critical = np.interp(df, grid, [t_quantile(1.0 - alpha, g) for g in grid]) * se
        if not (np.all(np.isfinite(difference)) and np.all(np.isfinite(critical))):
            raise ParameterError(
                "the simulated fleet does not fit in float64: the spread of device means is "
                "too large for their mean"
            )

        def power(effect: float) -> float:
            return float(np.mean(np.abs(difference + effect) > critical))

        return power, reps


def plan_comparison(
    params: Zeal,
    *,
    devices: int,
    readings: int,
    between_sd: float,
    within_sd: float,
    mean: float | None = None,
    readings_cv: float = 0.0,
    shape: str = "normal",
    effect: float = 0.0,
    alpha: float = 0.05,
    target_power: float = 0.8,
) -> Plan:
    """The plan of a device-level comparison of two groups of `devices` devices each (see
    the module docstring); `mean` is the typical reading (the middle of the range if not
    given); `readings` is the mean number of readings per device and `readings_cv` their
    coefficient of variation across devices (0: every device reports as often); `shape`
    is that of the device means: normal, or lognormal (skewed to the right of `lower`, as
    most fleets' are: power is then simulated, see :class:`_Fleet`)."""
    if devices < 2 or readings < 1:
        raise ParameterError("a comparison needs at least 2 devices per group and 1 reading")
    between, within = check_real("between_sd", between_sd), check_real("within_sd", within_sd)
    spread = check_real("readings_cv", readings_cv)
    if between < 0 or within < 0 or spread < 0:
        raise ParameterError("standard deviations and readings_cv must be non-negative")
    if not 0.0 < alpha < 1.0 or not 0.0 < target_power < 1.0:
        raise ParameterError("alpha and target_power must be in (0, 1)")
    centre = (params.lower + params.upper) / 2 if mean is None else check_real("mean", mean)
    noise = reading_noise(params, centre, math.hypot(between, within))
    weights = 1.0 + spread * spread
    per_group = (between * between * weights + (within * within + noise) / readings) / devices
    std_error = math.sqrt(2 * per_group)
    if not (math.isfinite(noise) and 0.0 < std_error < math.inf):
        raise ParameterError(
            "the planned standard error does not fit in float64: the spreads or the range "
            "are too large"
        )
    df = 2.0 * devices - 2.0
    if shape not in ("normal", "lognormal"):
        raise ParameterError(f"shape must be normal or lognormal, got {shape!r}")
    power_of: Callable[[float], float]
    if shape == "normal" or between == 0.0 or devices > SIMULATED_DEVICES:
        power_of = functools.partial(_power, std_error=std_error, df=df, alpha=alpha)
        source = "t approximation"
    else:
        fleet = _Fleet(params.lower, centre, between, within * within + noise, readings, spread)
        power_of, reps = fleet.power(devices, alpha)
        source = f"simulation ({reps:,} repetitions, lognormal device means)"
    low, high = 0.0, std_error
    while power_of(high) < target_power:
        high *= 2  # power reaches 1 as the effect grows: at most about 60 doublings
        if not math.isfinite(high):
            raise ParameterError("no finite effect reaches the power wanted")
    for _ in range(100):
        middle = (low + high) / 2
        if power_of(middle) < target_power:
            low = middle
        else:
            high = middle
    return Plan(std_error, df, noise, power_of(effect), high, source)
