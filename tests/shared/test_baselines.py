"""The baselines: their closed forms against simulation, and paper 002's privacy claim.

Tolerances are four standard errors of the simulated quantity, estimated from the sample
itself (fixed seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeal._core.mechanism import Zeal
from zeal.baselines import (
    BITLaplace,
    BoundedLaplace,
    DuchiOneBit,
    LaplaceMechanism,
    PiecewiseFloat,
    TruncatedLaplace,
    ZealMechanism,
    predicted_rmse,
)
from zeal.errors import ParameterError

N = 1_000_000
LOWER, UPPER = 0.0, 110.0


def moments_match(
    mech: object, reading: float, outputs: np.ndarray, bias: float, mse: float
) -> None:
    """Mean error and mean squared error of the outputs agree with the formulas (4 SE)."""
    err = outputs.astype(np.float64) - reading
    se_mean = err.std() / math.sqrt(err.size)
    assert abs(err.mean() - bias) < 4 * se_mean, (mech, reading, err.mean(), bias)
    sq = err * err
    se_sq = sq.std() / math.sqrt(sq.size)
    assert abs(sq.mean() - mse) < 4 * se_sq, (mech, reading, sq.mean(), mse)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
@pytest.mark.parametrize("reading", [0.0, 20.0, 55.0, 101.5])
def test_truncated_and_bit_laplace_bias_and_mse_match_paper_000(
    epsilon: float, reading: float
) -> None:
    """Proposition 3 (Eqs. (4), (5)) and Appendix B's MSE, against 10**6 draws each."""
    rng = np.random.default_rng(int(epsilon * 100 + reading))
    for mech in (TruncatedLaplace(LOWER, UPPER, epsilon), BITLaplace(LOWER, UPPER, epsilon)):
        out = mech.perturb(np.full(N, reading), rng=rng)
        assert out.min() >= LOWER
        assert out.max() <= UPPER
        moments_match(mech, reading, out, mech.bias(reading), mech.mse(reading))
    # Proposition 3 (b): BIT is never more biased than truncation; (a) unbiased at the middle.
    t, b = TruncatedLaplace(LOWER, UPPER, epsilon), BITLaplace(LOWER, UPPER, epsilon)
    assert abs(b.bias(reading)) <= abs(t.bias(reading)) + 1e-12
    assert t.bias(55.0) == pytest.approx(0, abs=1e-9)
    assert b.bias(55.0) == pytest.approx(0, abs=1e-9)


def test_paper_000_boxed_truncated_mse_is_not_the_mse() -> None:
    """Appendix B's last (boxed) expression for the truncated MSE disagrees with its own
    first line (B - 2sA)/(1 - p1 - p2) - s^2, which the simulation above confirms; we use the
    first line. At s = 0, lambda = 110 the boxed form gives 4.4x the true MSE."""
    t = TruncatedLaplace(LOWER, UPPER, 1.0)
    assert t.mse_boxed(0.0) / t.mse(0.0) > 4
    assert t.mse_boxed(55.0) != pytest.approx(t.mse(55.0), rel=0.1)


def test_laplace_is_unbiased_with_variance_two_b_squared() -> None:
    mech = LaplaceMechanism(LOWER, UPPER, 1.0)
    rng = np.random.default_rng(7)
    out = mech.perturb(np.full(N, 30.0), rng=rng)
    moments_match(mech, 30.0, out, 0.0, 2 * 110.0**2)
    assert out.min() < LOWER  # unbounded output
    assert out.max() > UPPER


def density_ratio_loss(mech: BoundedLaplace, scale: float) -> float:
    """Largest ln p(y|q) / p(y|q') over a grid of outputs y and inputs |q - q'| <= Delta,
    from the densities themselves (not the closed-form sup the class uses)."""
    q = np.linspace(mech.lower, mech.upper, 221)
    y = np.linspace(mech.lower, mech.upper, 441)
    mass = np.array([mech.mass(v, scale) for v in q])
    log_p = -np.abs(y[None, :] - q[:, None]) / scale - np.log(2 * scale * mass)[:, None]
    worst = 0.0
    for i in range(q.size):
        near = np.abs(q - q[i]) <= mech.sensitivity + 1e-9
        worst = max(worst, float((log_p[i][None, :] - log_p[near]).max()))
    return worst


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_bounded_laplace_naive_scale_violates_dp_and_b_star_does_not(epsilon: float) -> None:
    """Paper 002: on a domain wider than the sensitivity (here a device reporting the mean of
    10 readings, Delta = range / 10) resampling Laplace at the naive scale Delta/eps is not
    eps-DP; the fixed point b* is, and it is the smallest such scale."""
    mech = BoundedLaplace(LOWER, UPPER, epsilon, sensitivity=(UPPER - LOWER) / 10)
    assert mech.scale > mech.naive_scale
    naive = density_ratio_loss(mech, mech.naive_scale)
    assert naive > epsilon * 1.05, naive
    assert density_ratio_loss(mech, mech.scale) <= epsilon * (1 + 1e-9)
    assert mech.privacy_loss() <= epsilon * (1 + 1e-9)
    assert mech.privacy_loss(mech.scale * 0.99) > epsilon  # b* is tight
    assert mech.privacy_loss(mech.naive_scale) == pytest.approx(naive, rel=1e-3)


def test_bounded_laplace_in_the_local_model_needs_no_correction() -> None:
    """With the whole range as sensitivity (one reading per output), DeltaC = 1: b* equals
    the naive scale and the density ratio is exactly e^eps. The class then is paper 000's
    truncated Laplace, and the benchmark reports it once."""
    mech = BoundedLaplace(LOWER, UPPER, 1.0)
    assert mech.scale == mech.naive_scale == 110.0
    assert density_ratio_loss(mech, mech.scale) == pytest.approx(1.0, abs=1e-9)
    same = TruncatedLaplace(LOWER, UPPER, 1.0)
    assert mech.bias(20.0) == same.bias(20.0)


def test_duchi_one_bit_is_unbiased_and_exact() -> None:
    mech = DuchiOneBit(LOWER, UPPER, 1.0)
    assert mech.bits_per_reading == 1
    assert mech.realized_epsilon is not None
    assert abs(mech.realized_epsilon - 1.0) < 1e-12
    rng = np.random.default_rng(3)
    for reading in (0.0, 30.0, 110.0):
        bits = mech.perturb(np.full(N, reading), rng=rng)
        assert set(np.unique(bits).tolist()) <= {0, 1}
        se = math.sqrt(mech.variance(reading) / N)
        assert abs(mech.estimate_mean(bits) - reading) < 4 * se
        # The per-reading estimate's variance is the closed form.
        per = (bits - 0.5) / mech.k * (UPPER - LOWER) / 2 + (LOWER + UPPER) / 2
        moments_match(mech, reading, per, 0.0, mech.variance(reading))


def test_piecewise_float_matches_theorem_2() -> None:
    mech = PiecewiseFloat(LOWER, UPPER, 1.0)
    rng = np.random.default_rng(5)
    for reading in (0.0, 47.0, 110.0):
        out = mech.perturb(np.full(N, reading), rng=rng)
        assert out.min() >= mech.params.ebar - mech.params.C
        assert out.max() <= mech.params.ebar + mech.params.C
        moments_match(mech, reading, out, 0.0, mech.variance(reading))


def test_predicted_rmse_of_a_mean_matches_simulation(seattle: np.ndarray) -> None:
    """The benchmark's predicted (bias, RMSE) for a whole dataset agree with 200 repetitions."""
    readings = seattle[:2000]
    for mech in (BITLaplace(LOWER, UPPER, 1.0), ZealMechanism(Zeal(lower=0, upper=110, epsilon=1))):
        rng = np.random.default_rng(11)
        errors = np.array(
            [mech.estimate_mean(mech.perturb(readings, rng=rng)) for _ in range(200)]
        ) - float(readings.mean())
        bias, rmse = predicted_rmse(mech, readings)
        sd = math.sqrt(rmse * rmse - bias * bias)
        assert abs(errors.mean() - bias) < 4 * sd / math.sqrt(200)
        # The sample RMSE of 200 draws is within about 15 % at 4 SE (chi distribution).
        assert math.sqrt(np.mean(errors**2)) == pytest.approx(rmse, rel=0.2)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: LaplaceMechanism(1, 0, 1), "lower must be below upper"),
        (lambda: DuchiOneBit(0, 1, 0), "epsilon"),
        (lambda: TruncatedLaplace(0, math.inf, 1), "finite"),
        (lambda: BoundedLaplace(0, 1, 1, sensitivity=2), "sensitivity"),
        (lambda: BoundedLaplace(0, 1, 1, delta=1), "delta"),
        (lambda: PiecewiseFloat(0, 1, True), "number"),
    ],
)
def test_bad_parameters_name_the_problem(make: object, fragment: str) -> None:
    with pytest.raises(ParameterError, match=fragment):
        make()  # type: ignore[operator]
