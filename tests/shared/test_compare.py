"""Group comparisons on partition statistics (zeal.compare) and the t distribution they use
(zeal._core.studentt): closed forms checked against independent computations, and the type-I
error of the device-level methods on a simulated fleet like a real one (devices that
differ, many zeros, skew, Zeal's noise), with a tolerance from the binomial standard
error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from zeal import ParameterError, Zeal
from zeal._core.studentt import t_quantile, two_sided_p
from zeal.censored import censored_normal_mle, censoring_count
from zeal.compare import (
    Partitions,
    censored,
    cluster_weighted,
    device_means,
    trimmed,
    winsorized,
)
from zeal.errors import FitError


def t_tail_by_integration(t: float, df: float) -> float:
    """P(|T| >= t) by Simpson's rule on the density, substituting x = t / u to reach
    infinity (an independent check of the continued fraction)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    steps = 200_000
    h = 1.0 / steps
    total = 0.0
    for i in range(steps + 1):
        u = max(i * h, 1e-12)
        value = density(t / u) * t / (u * u)
        total += value * (1 if i in (0, steps) else 4 if i % 2 else 2)
    return 2 * total * h / 3


@pytest.mark.parametrize(("t", "df"), [(2.0, 5.0), (0.7, 1.0), (3.1, 3.5), (1.96, 40.0)])
def test_the_t_tail_matches_an_integration_of_the_density(t: float, df: float) -> None:
    assert two_sided_p(t, df) == pytest.approx(t_tail_by_integration(t, df), abs=1e-8)


def test_t_quantiles_are_the_tabled_ones_and_invert_the_tail() -> None:
    assert t_quantile(0.95, 10) == pytest.approx(2.228138851986, abs=1e-9)
    assert t_quantile(0.95, 1) == pytest.approx(12.706204736175, abs=1e-8)
    assert t_quantile(0.99, 30) == pytest.approx(2.749995653567, abs=1e-9)
    assert t_quantile(0.95, math.inf) == pytest.approx(1.959963984540, abs=1e-9)
    for df in (1.5, 7.0, 123.4):
        assert two_sided_p(t_quantile(0.9, df), df) == pytest.approx(0.1, abs=1e-12)
    with pytest.raises(ParameterError):
        two_sided_p(1.0, 0.0)


A = Partitions.of([10, 20, 30], [10.0, 60.0, 60.0])  # device means 1, 3, 2
B = Partitions.of([10, 10, 20, 40], [0.0, 10.0, 20.0, 120.0])  # device means 0, 1, 1, 3


def test_device_means_is_welch_on_the_device_means() -> None:
    result = device_means(A, B)
    va, vb = np.var([1, 3, 2], ddof=1) / 3, np.var([0, 1, 1, 3], ddof=1) / 4
    assert result.difference == pytest.approx(2.0 - 1.25)
    assert result.std_error == pytest.approx(math.sqrt(va + vb))
    assert result.df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 3))
    assert result.partitions == (3, 4)
    assert (result.smallest, result.median) == ((10, 10), (20.0, 15.0))
    assert len(result.warnings) == 2  # both groups have fewer than 10 partitions


def test_cluster_weighted_is_the_cr1_sandwich_on_reading_weighted_means() -> None:
    result = cluster_weighted(A, B)
    ma, mb = 130 / 60, 150 / 80
    ra = np.array([10.0, 60, 60]) - np.array([10, 20, 30]) * ma
    rb = np.array([0.0, 10, 20, 120]) - np.array([10, 10, 20, 40]) * mb
    va = 3 / 2 * (ra @ ra) / 60**2
    vb = 4 / 3 * (rb @ rb) / 80**2
    assert result.difference == pytest.approx(ma - mb)
    assert result.std_error == pytest.approx(math.sqrt(va + vb))
    assert result.ci[1] - result.difference == pytest.approx(
        t_quantile(0.95, result.df) * result.std_error
    )


def test_robust_means_without_cutting_are_the_plain_ones() -> None:
    assert trimmed(A, B, proportion=0.0).difference == pytest.approx(0.75)
    assert trimmed(A, B, proportion=0.0).std_error == pytest.approx(device_means(A, B).std_error)
    assert winsorized(A, B, proportion=0.0).difference == pytest.approx(0.75)


def yuen_by_hand(x: npt.NDArray[np.float64], k: int) -> tuple[float, float, float, float]:
    """(trimmed mean, its squared SE, winsorized mean, its squared SE) with k cut at each
    end, written out from Yuen (1974) and paper 003 Eqs. (22)-(27)."""
    n = x.size
    ordered = sorted(x.tolist())
    kept = ordered[k : n - k]
    low, high = kept[0], kept[-1]
    w = [min(max(v, low), high) for v in ordered]
    w_mean = sum(w) / n
    s2 = sum((v - w_mean) ** 2 for v in w) / (n - 1)
    h = n - 2 * k
    return (
        sum(kept) / h,
        (n - 1) * s2 / (h * (h - 1)),
        w_mean,
        s2 * (n - 1) ** 2 / ((h - 1) ** 2 * n),
    )


def test_trimmed_and_winsorized_are_yuens_two_sample_forms_on_each_groups_device_means() -> None:
    """25 and 18 device means: k = round(0.1 P) = 3 and 2 cut at each end of each group's
    own device means, the variances Yuen's, Satterthwaite's degrees of freedom over h - 1."""
    rng = np.random.default_rng(5)
    xa, xb = rng.lognormal(1, 0.8, 25), rng.lognormal(1.2, 0.8, 18)
    a, b = Partitions.of(np.ones(25, int), xa), Partitions.of(np.ones(18, int), xb)
    ta, va, wa, wva = yuen_by_hand(xa, 3)
    tb, vb, wb, wvb = yuen_by_hand(xb, 2)
    cut = trimmed(a, b, proportion=0.1)
    assert cut.difference == pytest.approx(ta - tb, rel=1e-12)
    assert cut.std_error == pytest.approx(math.sqrt(va + vb), rel=1e-12)
    assert cut.df == pytest.approx((va + vb) ** 2 / (va**2 / 18 + vb**2 / 13), rel=1e-12)
    pulled = winsorized(a, b, proportion=0.1)
    assert pulled.difference == pytest.approx(wa - wb, rel=1e-12)
    assert pulled.std_error == pytest.approx(math.sqrt(wva + wvb), rel=1e-12)
    assert "trimmed means" in cut.estimand
    assert "not the difference" in cut.estimand
    assert "winsorized means" in pulled.estimand
    assert "reading-weighted" in cluster_weighted(a, b).estimand


@pytest.mark.parametrize(
    ("size", "proportion", "k"),
    [(10, 0.15, 2), (25, 0.1, 3), (24, 0.1, 2), (10, 0.05, 1), (9, 0.05, 0), (30, 0.1, 3)],
)
def test_k_is_p_times_alpha_rounded_half_up_as_the_paper_writes_it(
    size: int, proportion: float, k: int
) -> None:
    """⌊Pα⌉ of paper 003 Eqs. (22)-(27): 0.15 of 10 is 1.5, rounded up to 2 (floor gave 1);
    0.1 of 25 is 2.5, 3 (floor gave 2)."""
    assert censoring_count(size, proportion) == k


def test_one_faulty_device_moves_the_mean_of_means_but_not_the_trimmed_mean() -> None:
    rng = np.random.default_rng(8)
    means = rng.normal(20, 2, size=30)
    faulty = means.copy()
    faulty[0] = 1000.0  # a device stuck at the top of a wide range
    ones = np.ones(30, int)
    base = Partitions.of(ones, rng.normal(20, 2, size=30))
    plain = device_means(Partitions.of(ones, faulty), base).difference
    robust = trimmed(Partitions.of(ones, faulty), base, proportion=0.1).difference
    assert abs(plain - device_means(Partitions.of(ones, means), base).difference) > 30
    assert abs(robust - trimmed(Partitions.of(ones, means), base, proportion=0.1).difference) < 1


def test_the_censored_mle_recovers_a_normal_mean_and_its_spread() -> None:
    rng = np.random.default_rng(21)
    estimates, errors = [], []
    for _ in range(200):
        z = rng.normal(5.0, 2.0, size=60)
        mean, variance, df = censored_normal_mle(z, 0.1)
        estimates.append(mean)
        errors.append(math.sqrt(variance))
        assert df == 60 - 2 * 6 - 1
    spread = float(np.std(estimates, ddof=1))
    # unbiased within 4 Monte Carlo standard errors; the information-based standard error
    # within 15 % of the simulated one (its own sampling error at 200 runs is about 5 %)
    assert abs(float(np.mean(estimates)) - 5.0) < 4 * spread / math.sqrt(200)
    assert float(np.mean(errors)) == pytest.approx(spread, rel=0.15)
    ones = np.ones(60, int)
    result = censored(
        Partitions.of(ones, rng.normal(1, 1, 60)), Partitions.of(ones, rng.normal(0, 1, 60))
    )
    assert result.method == "censored"
    assert result.ci[0] < result.difference < result.ci[1]


@pytest.mark.parametrize("scale", [1.0, 1e6])
def test_the_censored_standard_error_matches_a_simulation_on_any_scale(scale: float) -> None:
    """Device means in 0..1 and in 0..1e6 (the same fleet times 10**6), 60 per group:
    over 2,000 seeded fits the mean information-based standard error is within 5 % of the
    estimates' simulated sd (whose own Monte Carlo error is about 1.6 %), and every one is
    finite and positive. Before, a fixed finite-difference step gave an SE of 0 at this
    scale."""
    rng = np.random.default_rng(77)
    reps = 2000
    estimates, errors = np.empty(reps), np.empty(reps)
    for r in range(reps):
        z = np.clip(rng.normal(0.5, 0.15, 60), 0, 1) * scale
        mean, variance, _ = censored_normal_mle(z, 0.1, 0.2)
        estimates[r], errors[r] = mean, math.sqrt(variance)
    assert np.all(np.isfinite(errors))
    assert np.all(errors > 0)
    ratio = float(errors.mean() / estimates.std(ddof=1))
    print(f"scale {scale:g}: mean SE / simulated sd = {ratio:.4f} ({reps} fits)")
    assert abs(ratio - 1) <= 0.05


def test_the_censored_mle_is_equivariant_and_refuses_what_it_cannot_fit() -> None:
    rng = np.random.default_rng(9)
    z = rng.lognormal(0, 1, 30)
    base = censored_normal_mle(z, 0.1, 0.2)
    for factor in (1e-9, 2.8e5, 1.8e4, 1e12):
        scaled = censored_normal_mle(z * factor, 0.1, 0.2)
        assert scaled[0] == pytest.approx(base[0] * factor, rel=1e-9)
        assert scaled[1] == pytest.approx(base[1] * factor**2, rel=1e-9)
        assert scaled[2] == base[2] == 30 - 3 - 6 - 1
    with pytest.raises(FitError, match="no spread"):
        censored_normal_mle(np.full(10, 3.0), 0.1)
    with pytest.raises(ParameterError, match="at least 5"):
        censored_normal_mle(np.arange(4.0), 0.1)


def test_bad_partitions_are_refused() -> None:
    with pytest.raises(ParameterError, match="at least one reading"):
        Partitions.of([0, 3], [1.0, 2.0])
    with pytest.raises(ParameterError, match="2 counts but 1 sums"):
        Partitions.of([1, 3], [1.0])
    with pytest.raises(ParameterError, match="at least 2 partitions"):
        device_means(Partitions.of([5], [1.0]), B)
    with pytest.raises(ParameterError, match="proportion"):
        trimmed(A, B, proportion=0.5)


PARAMS = Zeal(lower=0.0, upper=50.0, epsilon=1.0)


def readings(rng: np.random.Generator, centre: npt.ArrayLike, size: int | tuple[int, ...]) -> Any:
    """Readings around a device's level: 60 % zeros, else lognormal (right-skewed)."""
    return np.where(rng.random(size) < 0.6, 0.0, rng.lognormal(np.log(centre), 0.7, size=size))


def fleet(rng: np.random.Generator, devices: int, shift: float = 0.0) -> Partitions:
    """One group of a fleet like a real one: 40-159 readings per device, device means that
    differ (lognormal spread), 60 % zeros, a right-skewed positive part (plus `shift`, a
    true difference, before clipping to the range), every reading privatized with Zeal and
    decoded."""
    counts = rng.integers(40, 160, size=devices)
    centres = rng.lognormal(1.0, 0.8, size=devices)
    sums = []
    for n, centre in zip(counts, centres, strict=True):
        x = np.clip(readings(rng, centre, int(n)) + shift, 0, 50)
        sums.append(float(PARAMS.decode(PARAMS.perturb(x, rng=rng)).sum()))
    return Partitions.of(counts, sums)


def test_every_answer_refuses_a_zero_standard_error() -> None:
    """Identical device means in both groups: no spread, so no standard error; refused
    rather than answered with an SE of 0 and p = 0 or 1."""
    same = Partitions.of(np.ones(12, int), np.full(12, 4.0))
    for method in (device_means, trimmed, winsorized):
        with pytest.raises(ParameterError, match="no finite, positive variance"):
            method(same, same)


@pytest.mark.slow
def test_device_level_methods_hold_their_level_on_a_heterogeneous_fleet() -> None:
    """Both groups from one population, 20 devices each, 400 seeded repetitions: each
    method rejects at alpha = 0.05 within 3 binomial standard errors of 0.05."""
    rng = np.random.default_rng(2026)
    reps = 400
    methods = {"cluster": cluster_weighted, "device_means": device_means, "trimmed": trimmed}
    rejected = dict.fromkeys(methods, 0)
    for _ in range(reps):
        a, b = fleet(rng, 20), fleet(rng, 20)
        for name, method in methods.items():
            rejected[name] += method(a, b).p_value < 0.05
    tolerance = 3 * math.sqrt(0.05 * 0.95 / reps)
    rates = {name: count / reps for name, count in rejected.items()}
    print(f"rejection rates at 0.05 over {reps} repetitions: {rates}")
    assert all(abs(rate - 0.05) <= tolerance for rate in rates.values()), rates


@pytest.mark.slow
def test_the_default_interval_covers_a_true_difference_on_a_heterogeneous_fleet() -> None:
    """Group A's readings shifted by 3 before clipping: the population difference (from
    10**6 draws) is inside the default method's 95 % interval in 95 % of 400 seeded
    repetitions, within 3 binomial standard errors."""
    rng = np.random.default_rng(31)
    shift, reps = 3.0, 400
    centres = rng.lognormal(1.0, 0.8, size=10**6)
    x = readings(rng, centres, centres.size)
    truth = float(np.clip(x + shift, 0, 50).mean() - np.clip(x, 0, 50).mean())
    covered = 0
    for _ in range(reps):
        low, high = cluster_weighted(fleet(rng, 20, shift), fleet(rng, 20)).ci
        covered += low <= truth <= high
    print(f"coverage of {truth:.4f}: {covered / reps:.4f} over {reps} repetitions")
    assert abs(covered / reps - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / reps)


@pytest.mark.slow
def test_one_faulty_device_biases_the_mean_of_means_far_more_than_the_trimmed_mean() -> None:
    """Group A's first device reports the top of the range for every reading; otherwise
    both groups come from one population (no true difference). Over 400 seeded repetitions
    the mean of device means is off by many Monte Carlo standard errors (2.48 measured,
    more than its own standard error); the trimmed difference by a bounded amount: each
    group is trimmed at its own quantiles, so A keeps one more genuine high device than B
    (0.61 measured, a third of its standard error), less than a third of the mean of
    means' bias and less than 0.4 of its own standard error."""
    rng = np.random.default_rng(44)
    reps = 400
    plain, cut, errors = [], [], []
    for _ in range(reps):
        a, b = fleet(rng, 20), fleet(rng, 20)
        top = PARAMS.decode(PARAMS.perturb(np.full(int(a.counts[0]), 50.0), rng=rng)).sum()
        sums = a.sums.copy()
        sums[0] = top
        faulty = Partitions.of(a.counts, sums)
        plain.append(device_means(faulty, b).difference)
        found = trimmed(faulty, b, proportion=0.1)
        cut.append(found.difference)
        errors.append(found.std_error)
    for name, values in (("mean of device means", plain), ("trimmed", cut)):
        bias, se = float(np.mean(values)), float(np.std(values, ddof=1)) / math.sqrt(reps)
        print(f"{name}: bias {bias:.4f} ± {se:.4f} ({reps} repetitions)")
    assert abs(np.mean(plain)) > 10 * np.std(plain, ddof=1) / math.sqrt(reps)
    assert abs(np.mean(cut)) < abs(np.mean(plain)) / 3
    assert abs(np.mean(cut)) < 0.4 * np.mean(errors)
