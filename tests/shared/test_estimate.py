"""Averages from codes: exact sums, intervals that cover, and the bounds of Theorems 3 and 4."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pytest

from zeal import CodeError, ParameterError, Zeal
from zeal.estimate import Estimate, difference_of


@pytest.mark.slow
def test_intervals_cover_at_their_level(seattle: npt.NDArray[np.float64]) -> None:
    """Over 500 repetitions: guaranteed covers >= 95 %, the normal CI within 2 points of 95 %."""
    z = Zeal(lower=0, upper=110, epsilon=1)
    rng = np.random.default_rng(2024)
    n, reps = 2000, 500
    ci_hits = guaranteed_hits = 0
    for _ in range(reps):
        x = rng.choice(seattle, n)
        est = z.estimate_mean(z.perturb(x, rng=rng))
        truth = x.mean()
        ci_hits += est.ci[0] <= truth <= est.ci[1]
        guaranteed_hits += est.guaranteed[0] <= truth <= est.guaranteed[1]
    print(f"coverage: ci {ci_hits / reps:.3f}, guaranteed {guaranteed_hits / reps:.3f}")
    assert guaranteed_hits / reps >= 0.95
    assert abs(ci_hits / reps - 0.95) <= 0.02


def test_mean_uses_exact_sums_over_codes() -> None:
    """estimate_mean equals the exact rational mean of the decoded values, rounded once."""
    from fractions import Fraction

    z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=20)
    codes = z.perturb(
        np.random.default_rng(1).uniform(23.5, 83.9, 5000), rng=np.random.default_rng(2)
    )
    depth_sum = sum((1 << 20) - 2 - int(c) for c in codes)
    exact = (
        Fraction(z.ebar) + Fraction(z.C) - Fraction(z.grid_step) * Fraction(depth_sum, codes.size)
    )
    assert z.estimate_mean(codes).mean == float(exact)


def test_estimate_reports_out_of_range_means_without_clamping() -> None:
    """A mean outside [lower, upper] (small n) is reported as is, flagged by in_range."""
    z = Zeal(lower=0, upper=1, epsilon=0.5, payload_bits=8)
    est = z.estimate_mean([z.code_min])  # the lowest output: far below the range
    assert est.mean < 0
    assert not est.in_range
    inside = z.estimate_mean(z.perturb(np.full(10**5, 0.5), rng=np.random.default_rng(0)))
    assert inside.in_range


def test_guaranteed_interval_solves_the_bernstein_bound() -> None:
    """At the guaranteed half-width the two-sided Theorem 3 bound equals 1 - confidence."""
    z = Zeal(lower=0, upper=110, epsilon=1)
    codes = z.perturb(np.full(1000, 50.0), rng=np.random.default_rng(0))
    est = z.estimate_mean(codes, confidence=0.9)
    half = (est.guaranteed[1] - est.guaranteed[0]) / 2
    assert z.absolute_bound(half, n=1000) == pytest.approx(0.1, rel=1e-9)
    assert z.absolute_bound(2 * half, n=1000) < 0.1


def test_variance_bound_dominates_every_input() -> None:
    """The variance used by the bound is at least the exact variance at any reading."""
    for k in (2, 3, 6, 12):
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
        bound = z.variance_bound()
        for x in np.linspace(z.lower, z.upper, 21):
            assert float(z.output_distribution(float(x)).variance()) <= bound


def test_relative_bound_is_theorem_3_at_the_scaled_error() -> None:
    """Theorem 4: P(|rel err| >= lam) is Theorem 3's bound at lam * |average|."""
    z = Zeal(lower=0, upper=110, epsilon=1)
    assert z.relative_bound(0.05, n=10**4, average=52.0) == z.absolute_bound(2.6, n=10**4)
    assert (
        0
        < z.relative_bound(0.05, n=10**4, average=52.0)
        < z.relative_bound(0.01, n=10**4, average=52.0)
        <= 1
    )
    with pytest.raises(ParameterError, match="average of 0"):
        z.relative_bound(0.1, n=10, average=0.0)


@pytest.mark.parametrize("confidence", [0, 1, 1.5, -0.1, math.nan, "0.9", True])
def test_bad_confidence_is_refused(confidence: object) -> None:
    """Confidence levels outside (0, 1) or of the wrong type raise ParameterError."""
    z = Zeal(lower=0, upper=1, epsilon=1)
    with pytest.raises(ParameterError, match="confidence"):
        z.estimate_mean([z.code_min], confidence=confidence)  # type: ignore[arg-type]


def test_no_codes_is_an_error() -> None:
    """An estimate needs at least one code."""
    with pytest.raises(CodeError, match="zero codes"):
        Zeal(lower=0, upper=1, epsilon=1).estimate_mean([])


def test_the_difference_of_two_estimates_is_normal_with_their_errors_added() -> None:
    """difference_of: a - b, standard error sqrt(3^2 + 4^2) = 5, the 95 % interval
    +-1.959964 * 5, and p = 2 (1 - Phi(|d| / 5)); a zero standard error has no p-value."""
    a = Estimate(
        mean=12.0,
        n=100,
        std_error=3.0,
        ci=(0, 0),
        guaranteed=(0, 0),
        in_range=True,
        confidence=0.95,
    )
    b = Estimate(
        mean=2.0, n=100, std_error=4.0, ci=(0, 0), guaranteed=(0, 0), in_range=True, confidence=0.95
    )
    found = difference_of(a, b, 0.95)
    assert (found.difference, found.std_error) == (10.0, 5.0)
    z = NormalDist().inv_cdf(0.975)
    assert found.ci == pytest.approx((10 - 5 * z, 10 + 5 * z), rel=1e-12)
    assert found.p_value == pytest.approx(2 * (1 - NormalDist().cdf(2.0)), rel=1e-12)
    exact = Estimate(
        mean=1.0, n=1, std_error=0.0, ci=(1, 1), guaranteed=(1, 1), in_range=True, confidence=0.95
    )
    assert difference_of(exact, exact, 0.95).p_value is None
    with pytest.raises(ParameterError):
        difference_of(a, b, 1.5)


@pytest.mark.parametrize(
    "params",
    [
        Zeal(lower=0, upper=110, epsilon=1, payload_bits=6),
        Zeal(lower=-40, upper=85.5, epsilon=3),
        Zeal(lower=0, upper=1e6, epsilon=0.5, payload_bits=12),
    ],
)
def test_decoded_sums_are_the_partitions_sums_of_decoded_values(params: Zeal) -> None:
    """Per partition, n times AVG* from exact code sums: the sum of the decoded codes (to
    rounding once, where the float sum of decodes rounds at every step); and AVG* from n
    and the sum of codes alone is estimate_mean's, bit for bit."""
    rng = np.random.default_rng(12)
    counts, code_sums, fsums, means = [], [], [], []
    for n in (1, 2, 7, 1000, 20_000):
        codes = params.perturb(rng.uniform(params.lower, params.upper, n), rng=rng)
        counts.append(n)
        code_sums.append(int(codes.astype(object).sum()))
        fsums.append(math.fsum(params.decode(codes)))
        means.append(params.estimate_mean(codes).mean)
    found = params.decoded_sums(counts, code_sums)
    scale = max(abs(params.lower), abs(params.upper))
    for n, codes, mean in zip(counts, code_sums, means, strict=True):
        assert params.mean_of_sums(n, codes) == mean  # the same float, bit for bit
    with pytest.raises(CodeError):
        params.mean_of_sums(0, 0)
    for got, fsum, mean, n in zip(found, fsums, means, counts, strict=True):
        assert got == pytest.approx(fsum, rel=1e-12, abs=1e-12 * scale * n)
        assert got / n == pytest.approx(mean, rel=1e-15, abs=1e-15 * scale)
    with pytest.raises(ParameterError, match="2 counts but 1 sums"):
        params.decoded_sums([1, 2], [3])
