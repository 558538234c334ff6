"""The comparison planner (zeal.planning.comparison) against simulation: its standard
error and power are what the default method delivers on a simulated fleet (seeded;
tolerances from the Monte Carlo standard errors), and its pieces are exact where they can
be."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from zeal import ParameterError, Zeal
from zeal.compare import Partitions, cluster_weighted
from zeal.planning.comparison import plan_comparison, zero_inflated

PARAMS = Zeal(lower=0.0, upper=100.0, epsilon=2.0)


def test_the_averaged_noise_is_the_mean_of_zeals_variance_over_the_readings() -> None:
    """Var[decode | x] is quadratic in x, so its average over readings spread by
    sqrt(between**2 + within**2) = 25 around 50 is what the planner uses (checked by
    quadrature; the spread term is about a fifth of the total here, so leaving it out
    would fail)."""
    plan = plan_comparison(
        PARAMS, devices=10, readings=5, between_sd=15.0, within_sd=20.0, mean=50.0
    )
    xs = np.linspace(-8 * 25.0, 8 * 25.0, 40_001)
    weights = np.exp(-0.5 * (xs / 25.0) ** 2)
    averaged = float(np.sum(weights * [PARAMS.variance(50.0 + x) for x in xs]) / weights.sum())
    assert plan.noise_variance == pytest.approx(averaged, rel=1e-6)
    assert plan.noise_variance > 1.15 * PARAMS.variance(50.0)


def test_zero_inflated_moments_match_a_large_sample() -> None:
    rng = np.random.default_rng(4)
    mean, sd = zero_inflated(0.7, 12.0, 0.5)
    positive = rng.gamma(4.0, 3.0, 2_000_000)  # mean 12, cv 0.5
    x = np.where(rng.random(positive.size) < 0.7, 0.0, positive)
    assert mean == pytest.approx(x.mean(), rel=0.01)
    assert sd == pytest.approx(x.std(), rel=0.01)
    with pytest.raises(ParameterError):
        zero_inflated(1.0, 1.0, 1.0)


@pytest.mark.slow
def test_planned_standard_error_and_power_are_what_the_fleet_shows() -> None:
    """20 devices of 50 readings per group, device means spread by 5, readings by 10, a
    true difference of 4, epsilon 2: 1,000 seeded repetitions of the default method."""
    devices, readings, effect = 20, 50, 4.0
    plan = plan_comparison(
        PARAMS,
        devices=devices,
        readings=readings,
        between_sd=5.0,
        within_sd=10.0,
        mean=50.0,
        effect=effect,
    )
    rng = np.random.default_rng(77)

    def group(shift: float) -> Partitions:
        sums = []
        for centre in rng.normal(50.0 + shift, 5.0, devices):
            x = np.clip(rng.normal(centre, 10.0, readings), 0, 100)
            sums.append(float(PARAMS.decode(PARAMS.perturb(x, rng=rng)).sum()))
        return Partitions.of(np.full(devices, readings), sums)

    reps = 1000
    found = [cluster_weighted(group(effect), group(0.0)) for _ in range(reps)]
    spread = float(np.std([f.difference for f in found], ddof=1))
    power = sum(f.p_value < 0.05 for f in found) / reps
    print(
        f"planned SE {plan.std_error:.4f}, simulated {spread:.4f}; planned power "
        f"{plan.power:.4f}, simulated {power:.4f} ({reps} repetitions)"
    )
    assert plan.std_error == pytest.approx(spread, rel=3 / math.sqrt(2 * (reps - 1)))
    assert abs(plan.power - power) <= 3 * math.sqrt(power * (1 - power) / reps)
    assert plan.detectable > effect  # power 0.8 needs more than this effect


@pytest.mark.slow
def test_skewed_device_means_get_a_simulated_power_that_the_fleet_shows() -> None:
    """Device means lognormal (mean 10, sd 8: skewed like a fleet's), readings zero in 60 %
    of cases, else lognormal around the device's level; epsilon 4, 20 devices of 150
    readings per group. 1,000 seeded repetitions of the default method; the planner with
    shape=lognormal is given the fleet's true moments."""
    params = Zeal(lower=0.0, upper=200.0, epsilon=4.0)
    devices, readings, effect = 20, 150, 6.0
    sigma2 = math.log1p(0.8**2)
    rng = np.random.default_rng(2026)

    def raw(levels: np.ndarray, shift: float) -> np.ndarray:
        """Readings (one row per device): 0 in 60 % of cases, else lognormal with mean
        level / 0.4 and sigma 0.7; shifted by a true effect, clipped to the range."""
        size = (levels.size, readings)
        positive = rng.lognormal(np.log(levels / 0.4)[:, None] - 0.7**2 / 2, 0.7, size)
        return np.clip(np.where(rng.random(size) < 0.6, 0.0, positive) + shift, 0.0, 200.0)

    def levels(count: int) -> np.ndarray:
        return rng.lognormal(math.log(10.0) - sigma2 / 2, math.sqrt(sigma2), count)

    # The fleet's true moments (clipping included), from 20,000 devices
    population = raw(levels(20_000), 0.0)
    within2 = float(population.var(axis=1, ddof=1).mean())
    between2 = float(population.mean(axis=1).var(ddof=1)) - within2 / readings
    mean = float(population.mean())
    plan, normal = (
        plan_comparison(
            params,
            devices=devices,
            readings=readings,
            between_sd=math.sqrt(between2),
            within_sd=math.sqrt(within2),
            mean=mean + effect / 2,
            shape=shape,
            effect=effect,
        )
        for shape in ("lognormal", "normal")
    )
    assert plan.power_from.startswith("simulation")

    def group(shift: float) -> Partitions:
        x = raw(levels(devices), shift)
        decoded = params.decode(params.perturb(x.ravel(), rng=rng)).reshape(x.shape)
        return Partitions.of(np.full(devices, readings), decoded.sum(axis=1))

    reps = 1000
    found = [cluster_weighted(group(effect), group(0.0)) for _ in range(reps)]
    power = sum(f.p_value < 0.05 for f in found) / reps
    spread = float(np.std([f.difference for f in found], ddof=1))
    print(
        f"planned SE {plan.std_error:.4f}, simulated {spread:.4f}; power: simulated {power:.4f}, "
        f"planned (lognormal) {plan.power:.4f}, (normal) {normal.power:.4f}"
    )
    assert plan.std_error == pytest.approx(spread, rel=3 / math.sqrt(2 * (reps - 1)))
    # the fleet's error and the planner's own (20,000 repetitions)
    tolerance = 3 * math.sqrt(power * (1 - power) * (1 / reps + 1 / 20_000))
    assert abs(plan.power - power) <= tolerance


def test_the_shape_of_device_means_is_checked() -> None:
    with pytest.raises(ParameterError, match="shape must be normal or lognormal"):
        plan_comparison(PARAMS, devices=5, readings=5, between_sd=1, within_sd=1, shape="cubic")
    with pytest.raises(ParameterError, match="above the range's lower end"):
        plan_comparison(
            PARAMS, devices=5, readings=5, between_sd=1, within_sd=1, mean=0.0, shape="lognormal"
        )
    fleet: dict[str, Any] = {"devices": 5, "readings": 5, "between_sd": 3, "within_sd": 1}
    fleet |= {"mean": 20, "shape": "lognormal"}
    plan = plan_comparison(PARAMS, **fleet)
    assert plan == plan_comparison(PARAMS, **fleet)  # seeded: the same answer every time
    at_detectable = plan_comparison(PARAMS, **fleet, effect=plan.detectable)
    assert 0.8 <= at_detectable.power < 0.81


def test_unequal_readings_weigh_the_between_device_part_by_the_sum_of_squared_weights() -> None:
    """With fixed counts n_i the reading-weighted mean's variance is exactly
    between**2 * sum(n_i**2) / (sum n_i)**2 + (within**2 + noise) / sum(n_i); the plan's
    (1 + cv**2) / devices is that sum for cv = std(n) / mean(n)."""
    counts = np.array([40, 55, 80, 120, 155, 60, 90, 100, 130, 70], dtype=float)
    cv = float(counts.std() / counts.mean())
    plan = plan_comparison(
        PARAMS,
        devices=counts.size,
        readings=int(counts.mean()),
        between_sd=3.0,
        within_sd=7.0,
        mean=20.0,
        readings_cv=cv,
    )
    one_group = 9.0 * float((counts**2).sum() / counts.sum() ** 2) + (
        49.0 + plan.noise_variance
    ) / float(counts.sum())
    assert counts.mean() == int(counts.mean())
    assert plan.std_error == pytest.approx(math.sqrt(2 * one_group), rel=1e-12)
    equal = plan_comparison(
        PARAMS, devices=10, readings=90, between_sd=3.0, within_sd=7.0, mean=20.0
    )
    assert plan.std_error > equal.std_error
    with pytest.raises(ParameterError, match="readings_cv"):
        plan_comparison(PARAMS, devices=2, readings=1, between_sd=1, within_sd=1, readings_cv=-1)


def test_figures_beyond_float64_are_refused_not_returned_as_nan() -> None:
    with pytest.raises(ParameterError, match="does not fit in float64"):
        plan_comparison(PARAMS, devices=2, readings=1, between_sd=1e200, within_sd=1e200)
    with pytest.raises(ParameterError, match="does not fit in float64"):
        plan_comparison(PARAMS, devices=2, readings=1, between_sd=0.0, within_sd=1e160)
