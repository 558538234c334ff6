"""Statistical behaviour of the samplers: exact distributions, unbiasedness, variance.

Fixed seeds; tolerances come from the variance (standard errors), not from guesses.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from zeal import Zeal, ZealWarning

RANGES = [(0.0, 110.0), (23.5, 83.9), (-0.001, 0.001)]


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_draws_match_the_audited_probabilities(k: int) -> None:
    """10**6 draws from each extreme input fit the exact distribution (chi-square p > 0.001)."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
    rng = np.random.default_rng(1000 + k)
    for x in (z.lower, z.upper):
        dist = z.output_distribution(x)
        assert dist.total() == 1
        codes = z.perturb(np.full(10**6, x), rng=rng).astype(np.int64)
        observed = np.bincount(codes - dist.codes()[0], minlength=dist.codes().size)
        assert observed.size == dist.codes().size  # nothing outside the audited support
        expected = dist.probabilities() * codes.size
        keep = expected >= 5  # pool sparse cells so the chi-square approximation holds
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(expected[keep], expected[~keep].sum())
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        p = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
        assert p > 0.001, (k, x, p)


@pytest.mark.parametrize(("lower", "upper"), RANGES)
@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("k", [2, 3, 4, 6, 10, 20])
def test_exact_mean_is_the_reading(lower: float, upper: float, eps: float, k: int) -> None:
    """From the exact probabilities, |E[decode] - x| <= 1e-9 (upper - lower) for 100 inputs."""
    z = Zeal(lower=lower, upper=upper, epsilon=eps, payload_bits=k)
    rng = np.random.default_rng(7)
    inputs = np.concatenate([np.linspace(lower, upper, 50), rng.uniform(lower, upper, 50)])
    tolerance = Fraction(1e-9) * (Fraction(upper) - Fraction(lower))
    for x in inputs:
        dist = z.output_distribution(float(x))
        assert dist.total() == 1
        assert abs(dist.mean() - Fraction(float(x))) <= tolerance, (k, x, float(dist.mean()))


def _tiled(data: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
    return np.resize(data, n)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3, 4, 6, 10, 20])
def test_simulated_mean_within_four_standard_errors(
    seattle: npt.NDArray[np.float64], k: int
) -> None:
    """10**6 Seattle readings: the served average is within 4 standard errors of the truth."""
    z = Zeal(lower=0, upper=110, epsilon=1, payload_bits=k)
    x = _tiled(seattle, 10**6)
    est = z.estimate_mean(z.perturb(x, rng=np.random.default_rng(k)))
    theory_se = math.sqrt(float(np.mean([z.variance(v) for v in x[:8759]])) / x.size)
    assert abs(est.mean - x.mean()) <= 4 * theory_se, (k, est.mean - x.mean(), theory_se)


@pytest.mark.slow
def test_paper_sampler_bias_at_width_4(seattle: npt.NDArray[np.float64]) -> None:
    """The paper's float sampler at 4 bits is biased by many standard errors on the same data."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        z = Zeal(lower=0, upper=110, epsilon=1, payload_bits=4, sampler="paper")
    x = _tiled(seattle, 10**6)
    est = z.estimate_mean(z.perturb(x, rng=np.random.default_rng(4)))
    bias = est.mean - x.mean()
    print(
        f"paper sampler, 4 bits: bias {bias:+.3f} F ({100 * bias / x.mean():+.2f} %), "
        f"{bias / est.std_error:+.1f} standard errors"
    )
    assert abs(bias) > 10 * est.std_error


@pytest.mark.slow
@pytest.mark.parametrize("k", [5, 8, 12])
def test_variance_matches_theorem_2_plus_grid_term(k: int) -> None:
    """Empirical Var[decode - x] is within 3 % of Theorem 2 + D**2/6, for 5 inputs."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
    rng = np.random.default_rng(100 + k)
    for x in np.linspace(z.lower, z.upper, 5):
        draws = z.decode(z.perturb(np.full(10**6, x), rng=rng)) - x
        empirical = float(draws.var())
        assert empirical == pytest.approx(z.variance(float(x)), rel=0.03), (k, x)
        exact = float(z.output_distribution(float(x)).variance())
        assert exact == pytest.approx(z.variance(float(x)), rel=0.01)
