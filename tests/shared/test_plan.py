"""The comparison planner (zeal.plan) against simulation: its standard error and power
are what the default method delivers on a simulated fleet (seeded; tolerances from the
Monte Carlo standard errors), and its pieces are exact where they can be."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeal import ParameterError, Zeal
from zeal.compare import Partitions, cluster_weighted
from zeal.plan import plan_comparison, zero_inflated

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


def test_figures_beyond_float64_are_refused_not_returned_as_nan() -> None:
    with pytest.raises(ParameterError, match="does not fit in float64"):
        plan_comparison(PARAMS, devices=2, readings=1, between_sd=1e200, within_sd=1e200)
    with pytest.raises(ParameterError, match="does not fit in float64"):
        plan_comparison(PARAMS, devices=2, readings=1, between_sd=0.0, within_sd=1e160)
