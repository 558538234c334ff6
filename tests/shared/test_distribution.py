"""zeal.distribution: the transition matrix is the sampler's, the fit recovers a fleet's
distribution, answers are deterministic and consistent, bad input is refused, and the
bootstrap's intervals cover at least 0.90 at 0.95 on clustered fleets (400 seeded fleets)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import load_script
from zeal import CodeError, ParameterError, Zeal, ZealWarning
from zeal import distribution as dist

PARAMS = Zeal(lower=0, upper=1, epsilon=1)
ROOT = Path(__file__).resolve().parents[2]


def test_transition_columns_are_the_samplers_distributions() -> None:
    """Each column is a probability distribution over the codes, and a bound's column is
    the sampler's exact distribution for a reading there."""
    matrix = dist.transition(PARAMS)
    assert matrix.shape == (PARAMS.code_max - PARAMS.code_min + 1, dist.FINE_BINS + 2)
    assert dist.code_block(PARAMS) == 1
    assert np.allclose(matrix.sum(axis=0), 1.0, atol=1e-12)
    exact = PARAMS.output_distribution(PARAMS.upper)
    column = np.zeros(matrix.shape[0])
    column[exact.codes() - PARAMS.code_min] = exact.probabilities()
    assert np.allclose(matrix[:, -1], column, atol=1e-15)


def test_a_wide_payload_counts_its_codes_in_blocks() -> None:
    """16-bit codes (33,000 of them) are counted in MAX_ROWS blocks of adjacent codes; each
    block's probability is its codes' sum, so a column still sums to 1 and the median of
    Beta(5, 2) readings comes back within 0.01."""
    wide = Zeal(lower=0, upper=1, epsilon=1, payload_bits=16)
    assert dist.code_rows(wide) == dist.MAX_ROWS
    matrix = dist.transition(wide)
    assert np.allclose(matrix.sum(axis=0), 1.0, atol=1e-12)
    rng = np.random.default_rng(3)
    x = rng.beta(5, 2, 20_000)
    found = dist.fit(wide, dist.code_counts(wide, wide.perturb(x, rng=rng)))
    assert abs(found.quantile(0.5) - float(np.median(x))) < 0.01


def test_fit_recovers_a_skewed_fleet_within_its_sampling_error() -> None:
    """Beta(5, 2) readings at epsilon 1: the Wasserstein-1 distance to the readings stays
    within 0.02 of the range and the median within 0.03 over 5 seeded fleets (the bench
    measures the mean, 0.010, on 20)."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        x = rng.beta(5, 2, 10_000)
        found = dist.fit(PARAMS, dist.code_counts(PARAMS, PARAMS.perturb(x, rng=rng)))
        grid = np.linspace(0, 1, 2001)
        truth = np.searchsorted(np.sort(x), grid, side="right") / x.size
        w1 = float(np.mean(np.abs(np.array([found.cdf(g) for g in grid]) - truth)))
        assert w1 < 0.02, (seed, w1)
        assert abs(found.quantile(0.5) - np.quantile(x, 0.5)) < 0.03


def test_a_fit_is_deterministic_and_its_figures_agree() -> None:
    """The same counts give the same fit; cdf, quantile, share_above and the histogram are
    views of one distribution."""
    rng = np.random.default_rng(7)
    counts = dist.code_counts(PARAMS, PARAMS.perturb(rng.beta(2, 5, 3000), rng=rng))
    one, two = dist.fit(PARAMS, counts), dist.fit(PARAMS, counts.copy())
    assert np.array_equal(one.probabilities, two.probabilities)
    assert math.isclose(one.probabilities.sum(), 1.0, rel_tol=1e-12)
    for q in (0.1, 0.5, 0.9):
        assert one.cdf(one.quantile(q)) == pytest.approx(q, abs=1e-9)
    assert one.share_above(0.3) == pytest.approx(1 - one.cdf(0.3))
    edges, masses = one.histogram(8)
    assert edges[0] == 0
    assert edges[-1] == 1
    assert masses.size == 8
    assert masses.sum() == pytest.approx(1.0)
    assert masses[:4].sum() == pytest.approx(one.cdf(0.5))


def test_readings_at_a_bound_are_found_there() -> None:
    """A fleet with 40 % of its readings at exactly zero: the fit puts 0.40 +- 0.03 of its
    mass within three fine bins of zero (a reading at zero and one a bin above it send codes
    alike), and the 0.2 and 0.3 quantiles within the first bin."""
    rng = np.random.default_rng(11)
    x = rng.beta(4, 4, 20_000)
    x[rng.random(x.size) < 0.4] = 0.0
    found = dist.fit(PARAMS, dist.code_counts(PARAMS, PARAMS.perturb(x, rng=rng)))
    near = 3 / dist.FINE_BINS
    assert found.cdf(near) == pytest.approx(float(np.mean(x <= near)), abs=0.03)
    assert found.quantile(0.3) <= 1 / dist.FINE_BINS


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda f: f.quantile(0.0), ParameterError),
        (lambda f: f.quantile(1.0), ParameterError),
        (lambda f: f.quantile(float("nan")), ParameterError),
        (lambda f: f.histogram(0), ParameterError),
        (lambda f: f.histogram(dist.FINE_BINS + 1), ParameterError),
        (lambda f: f.cdf(float("inf")), ParameterError),
    ],
)
def test_bad_questions_are_refused(call: object, error: type[Exception]) -> None:
    """Levels outside (0, 1), NaN, bins out of range: a clear error, not a number."""
    found = dist.fit(PARAMS, dist.code_counts(PARAMS, PARAMS.perturb(np.full(100, 0.5))))
    with pytest.raises(error):
        call(found)  # type: ignore[operator]


def test_bad_counts_are_refused() -> None:
    """No readings, the wrong length, a negative count, a code the stream cannot make, a
    stream of the paper's float sampler (no exact code distribution)."""
    size = PARAMS.code_max - PARAMS.code_min + 1
    with pytest.raises(ParameterError, match="no readings"):
        dist.fit(PARAMS, np.zeros(size, np.int64))
    with pytest.raises(CodeError):
        dist.fit(PARAMS, np.ones(size + 1, np.int64))
    with pytest.raises(CodeError):
        dist.fit(PARAMS, -np.ones(size, np.int64))
    with pytest.raises(CodeError):
        dist.code_counts(PARAMS, [PARAMS.code_max + 1])
    with pytest.warns(ZealWarning, match="kept for comparison"):
        paper = Zeal(lower=0, upper=1, epsilon=1, sampler="paper")
    with pytest.raises(ParameterError, match="grid sampler"):
        dist.fit(paper, dist.code_counts(paper, paper.perturb(np.full(10, 0.5))))
    with pytest.raises(ParameterError, match="two devices"):
        dist.device_bootstrap(PARAMS, np.ones((1, size), np.int64))


def test_bootstrap_intervals_cover_at_least_090_on_clustered_fleets() -> None:
    """402 seeded fleets of 30 devices x 100 readings (bench/distribution.py's: devices that
    differ, devices alike, many zeros; 134 of each): each quantile's (0.1, 0.5, 0.9), the
    share above 0.5's and the mean's 0.95 interval holds the window's own value in at least
    0.90 of them."""
    bench = load_script(ROOT / "bench" / "distribution.py", "bench_distribution")
    for kind in ("differ", "alike", "zeros"):
        found = bench.coverage(1.0, kind, 30, 100, 134)
        rates = {k: v for k, v in found.items() if k.startswith(("q", "above", "mean"))}
        assert len(rates) == 5
        assert all(rate >= 0.90 for rate in rates.values()), (kind, rates)
