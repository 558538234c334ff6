"""Bayes point estimates from Zeal codes (paper 004), and the paper's own experiment.

The server never sees raw readings, so its estimates need no further privacy constraint:
whatever it computes from the codes is post-processing of epsilon-LDP outputs. What transfers
from paper 004 is Bayes estimation with the *exact* likelihood of the codes, which the grid
sampler gives (:meth:`zeal.Zeal.output_distribution`).

- :func:`binary_posterior`: readings that are ``lower`` or ``upper`` (occupancy, a door);
  the posterior of the share theta of ``upper`` readings under a Beta(a, b) prior, from the
  exact code likelihoods p(code | lower) and p(code | upper).
- :func:`constant_posterior`: every code privatizes one fixed reading x; the posterior of x
  on a fine grid of [lower, upper] from the exact likelihood of each code.
- :func:`mean_posterior`: a window's mean from AVG* and its exact variance bound (a normal
  likelihood), with a prior truncated to [lower, upper].
- :func:`ubapp_risk` and :func:`lbapp_risk`: the paper's central-DP experiment (Section 5:
  K Bernoulli trials, uniform prior, squared loss). UBaPP is the linear program of Eq. (4.1)
  and Algorithm 1; LBaPP is the Bayes estimate (y + 1) / (K + 2) plus Laplace noise of
  scale (1 / (K + 2)) / epsilon (Eq. (7)), its risk in closed form rather than by Algorithm
  2's Monte Carlo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from zeal._core.mechanism import Zeal
from zeal.errors import ParameterError
from zeal.estimate import check_confidence, check_real

__all__ = [
    "NormalPrior",
    "Posterior",
    "binary_posterior",
    "code_likelihood",
    "constant_posterior",
    "lbapp_risk",
    "mean_posterior",
    "ubapp_risk",
]

_F64 = npt.NDArray[np.float64]

#: Points of the theta grid a posterior is evaluated on (cell midpoints in [0, 1]).
GRID: Final = 4001


@dataclass(frozen=True)
class Posterior:
    """A posterior summary: the posterior mean (Bayes estimate under squared loss), the
    posterior median (absolute loss), an equal-tailed credible interval, and the prior."""

    mean: float
    median: float
    interval: tuple[float, float]
    level: float
    prior: str
    n: int


def code_likelihood(params: Zeal, reading: float, codes: npt.ArrayLike) -> _F64:
    """p(code | reading) for each code, exactly as the grid sampler draws it (a float of the
    exact rational); 0 for codes it never produces."""
    dist = params.output_distribution(reading)
    c = np.asarray(codes, dtype=np.int64).ravel()
    firsts = np.array([first for first, _, _ in dist.runs], dtype=np.int64)
    stops = np.array([stop for _, stop, _ in dist.runs], dtype=np.int64)
    weights = np.array([num / dist.denominator for _, _, num in dist.runs], dtype=np.float64)
    run = np.searchsorted(firsts, c, side="right") - 1
    inside = (run >= 0) & (c < stops[np.clip(run, 0, None)])
    out: _F64 = np.where(inside, weights[np.clip(run, 0, None)], 0.0)
    return out


def _midpoints(low: float, high: float, points: int) -> _F64:
    """The midpoints of `points` equal cells of [low, high]."""
    grid: _F64 = low + (high - low) * (np.arange(points) + 0.5) / points
    return grid


def _summary(theta: _F64, log_density: _F64, level: float, prior: str, n: int) -> Posterior:
    """Mean, median and equal-tailed interval of a density that is constant on each of the
    equal cells whose midpoints are `theta`."""
    if not np.any(np.isfinite(log_density)):
        raise ParameterError("the data have zero likelihood everywhere on the grid")
    weights = np.exp(log_density - log_density.max())
    weights /= weights.sum()
    cdf = np.cumsum(weights)
    half = (theta[1] - theta[0]) / 2 if theta.size > 1 else 0.5
    edges = np.concatenate([theta - half, [theta[-1] + half]])

    def quantile(p: float) -> float:
        """Linear inside the cell holding p (the density is constant on each cell)."""
        j = int(np.searchsorted(cdf, p))
        j = min(j, theta.size - 1)
        below = cdf[j - 1] if j > 0 else 0.0
        share = (p - below) / weights[j] if weights[j] > 0 else 0.0
        return float(edges[j] + share * (edges[j + 1] - edges[j]))

    tail = (1.0 - level) / 2
    return Posterior(
        mean=float(weights @ theta),
        median=quantile(0.5),
        interval=(quantile(tail), quantile(1.0 - tail)),
        level=level,
        prior=prior,
        n=n,
    )


def binary_posterior(
    params: Zeal,
    codes: npt.ArrayLike,
    *,
    prior: tuple[float, float] = (1.0, 1.0),
    level: float = 0.95,
) -> Posterior:
    """The posterior of theta, the share of readings at ``upper`` (the rest at ``lower``),
    from the codes of independent readings: each code has likelihood
    theta * p(code | upper) + (1 - theta) * p(code | lower), exact for the grid sampler;
    prior Beta(a, b) (default uniform). Evaluated on a grid of ``GRID`` cell midpoints."""
    a, b = (check_real("prior", v) for v in prior)
    if not (a > 0 and b > 0):
        raise ParameterError(f"a Beta prior needs a > 0 and b > 0, got ({a!r}, {b!r})")
    level = check_confidence(level)
    values, counts = np.unique(np.asarray(codes, dtype=np.int64).ravel(), return_counts=True)
    high = code_likelihood(params, params.upper, values)
    low = code_likelihood(params, params.lower, values)
    if np.any((high == 0) & (low == 0)):
        raise ParameterError("a code that neither lower nor upper readings can produce")
    theta = _midpoints(0.0, 1.0, GRID)
    log_density = (a - 1) * np.log(theta) + (b - 1) * np.log1p(-theta)
    if values.size:
        mix = np.outer(theta, high) + np.outer(1 - theta, low)  # GRID x distinct codes
        log_density += np.log(mix) @ counts
    name = "uniform" if (a, b) == (1.0, 1.0) else f"Beta({a:g}, {b:g})"
    return _summary(theta, log_density, level, name, int(counts.sum()))


@dataclass(frozen=True)
class NormalPrior:
    """A normal prior N(mean, sd**2) truncated to the stream's range."""

    mean: float
    sd: float

    def __post_init__(self) -> None:
        check_real("prior mean", self.mean)
        if not check_real("prior sd", self.sd) > 0:
            raise ParameterError(f"a normal prior needs sd > 0, got {self.sd!r}")

    def log_density(self, x: _F64) -> _F64:
        z: _F64 = -0.5 * ((x - self.mean) / self.sd) ** 2
        return z

    def __str__(self) -> str:
        return f"normal({self.mean:g}, {self.sd:g}) truncated to the range"


def _log_prior(x: _F64, prior: NormalPrior | None) -> tuple[_F64, str]:
    if prior is None:
        return np.zeros_like(x), "uniform over the range"
    return prior.log_density(x), str(prior)


def constant_posterior(
    params: Zeal,
    codes: npt.ArrayLike,
    *,
    prior: NormalPrior | None = None,
    level: float = 0.95,
    points: int = 1024,
) -> Posterior:
    """The posterior of x when every code privatizes the same reading x (a device measuring
    a fixed quantity): prod_i p(code_i | x) from the exact output distributions, on
    `points` cell midpoints of [lower, upper], under a uniform prior (default) or a
    truncated normal."""
    level = check_confidence(level)
    values, counts = np.unique(np.asarray(codes, dtype=np.int64).ravel(), return_counts=True)
    xs = _midpoints(params.lower, params.upper, points)
    log_density, name = _log_prior(xs, prior)
    if values.size:
        with np.errstate(divide="ignore"):
            log_lik = np.log([code_likelihood(params, float(x), values) for x in xs])
        log_density = log_density + log_lik @ counts
    return _summary(xs, log_density, level, name, int(counts.sum()))


def mean_posterior(
    params: Zeal,
    n: int,
    average: float,
    *,
    prior: NormalPrior | None = None,
    level: float = 0.95,
    points: int = 4096,
) -> Posterior:
    """The posterior of a window's mean reading from its AVG* alone: a normal likelihood
    N(AVG* | mu, v(mu) / n), and a prior on [lower, upper], uniform by default or a
    truncated normal. Always inside the range; it approaches AVG* as n grows.

    v(mu) is Zeal's variance of one decoded reading at mu (paper 001, Theorem 2, Eq. (14),
    plus the grid's D**2 / 6: ``Zeal.variance``), the exact variance of AVG* when every
    reading of the window equals mu. It is quadratic in mu, so three evaluations give it
    everywhere. Readings that spread within the window add Var[x] / (s - 1), s = e**(eps/2),
    which the model leaves out: small beside Zeal's noise for sensors (1.5 Var[x] at
    epsilon 1, against a noise variance of about 12,000 on a 0-110 range). The worst-case
    bound ``variance_bound()`` would be safe but makes the intervals cover far more than
    asked (measured: every window up to n = 20 on the bundled temperatures)."""
    level = check_confidence(level)
    if n < 1:
        raise ParameterError("a window mean needs at least one reading")
    xs = _midpoints(params.lower, params.upper, points)
    log_density, name = _log_prior(xs, prior)
    ends = (params.lower, (params.lower + params.upper) / 2, params.upper)
    quadratic = np.polyfit(ends, [params.variance(x) for x in ends], 2)
    variance = np.polyval(quadratic, xs) / n
    misfit = (check_real("average", average) - xs) ** 2 / (2 * variance)
    log_density = log_density - misfit - 0.5 * np.log(variance)
    return _summary(xs, log_density, level, name, n)


def _check_experiment(trials: int, epsilon: float) -> float:
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ParameterError(f"trials must be a positive integer, got {trials!r}")
    eps = check_real("epsilon", epsilon)
    if not eps > 0:
        raise ParameterError(f"epsilon must be positive, got {epsilon!r}")
    return eps


def lbapp_risk(trials: int, epsilon: float, *, clamp: bool = False) -> float:
    """The Bayes risk (squared loss, uniform prior) of LBaPP: the non-private Bayes estimate
    m_y = (y + 1) / (K + 2) plus Laplace noise of scale b = (1 / (K + 2)) / epsilon (its
    sensitivity over neighbouring sums, Eq. (21)), exactly.

    Given y, theta ~ Beta(y + 1, K - y + 1) and the noise is independent of theta, so the
    risk is E[Var(theta | y)] = 1 / (6 (K + 2)) plus the noise's mean square: 2 b**2, or
    with ``clamp`` (the output clipped to [0, 1]) for each y
    2 b**2 - b (e**(-m/b) (m + b) + e**(-u/b) (u + b)), u = 1 - m, averaged over the
    uniform marginal of y."""
    eps = _check_experiment(trials, epsilon)
    k = trials
    b = 1.0 / ((k + 2) * eps)
    bayes = 1.0 / (6 * (k + 2))
    if not clamp:
        return bayes + 2 * b * b
    total = 0.0
    for y in range(k + 1):
        m = (y + 1) / (k + 2)
        u = 1.0 - m
        total += 2 * b * b - b * (math.exp(-m / b) * (m + b) + math.exp(-u / b) * (u + b))
    return bayes + total / (k + 1)


def ubapp_risk(trials: int, epsilon: float, grid: int = 1000) -> float:
    """The Bayes risk of UBaPP (Algorithm 1): the randomized estimator P[i, y] (probability
    of answering theta_i when the sum is y) that minimizes the Bayes risk
    sum_k pi_k sum_y Q[y, k] sum_i P[i, y] (theta_i - theta_k)**2 subject to each column
    of P being a distribution and epsilon-DP between neighbouring sums:
    P[i, y] <= e**epsilon P[i, y +- 1] (Eq. (4.1)). Theta and the uniform prior live on
    ``grid`` equally spaced points of [0, 1], Q is Binomial(K, theta). Solved with HiGHS
    (scipy, the ``bayes`` extra); returns the optimal risk."""
    eps = _check_experiment(trials, epsilon)
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 2:
        raise ParameterError(f"grid must be an integer of at least 2, got {grid!r}")
    try:
        from scipy import optimize, sparse, stats
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ParameterError("ubapp_risk needs scipy: pip install 'zeal[bayes]'") from exc
    k, m = trials, grid
    theta = np.linspace(0.0, 1.0, m)
    prior = np.full(m, 1.0 / m)
    q = stats.binom.pmf(np.arange(k + 1)[:, None], k, theta[None, :])  # (K + 1) x M
    w0, w1, w2 = (q * prior) @ np.ones(m), (q * prior) @ theta, (q * prior) @ (theta**2)
    # cost[y, i] = sum_k pi_k Q[y, k] (theta_i - theta_k)**2
    cost = np.outer(w0, theta**2) - 2 * np.outer(w1, theta) + w2[:, None]
    # x[y * M + i] = P[i, y]: one distribution over the grid per sum y
    eq = sparse.kron(sparse.identity(k + 1), np.ones((1, m)), format="csr")
    rows = _neighbour_rows(k, m, math.exp(-eps))
    result: Any = optimize.linprog(
        cost.ravel(),
        A_ub=rows,
        b_ub=np.zeros(rows.shape[0]),
        A_eq=eq,
        b_eq=np.ones(k + 1),
        bounds=(0, None),
        method="highs",
    )
    if result.status != 0:
        raise ParameterError(f"the linear program did not solve: {result.message}")
    return float(result.fun)


def _neighbour_rows(trials: int, grid: int, shrink: float) -> Any:
    """The epsilon-DP rows e**-eps x[y, i] - x[y', i] <= 0 for |y - y'| = 1, both ways
    (divided by e**eps: at large epsilon the coefficient vanishes instead of overflowing
    the solver's range, and the row becomes the vacuous -x <= 0)."""
    from scipy import sparse

    y = np.repeat(np.arange(trials), grid)
    i = np.tile(np.arange(grid), trials)
    here, there = y * grid + i, (y + 1) * grid + i
    count = here.size
    row = np.arange(2 * count)
    cols = np.concatenate([here, there, there, here])
    data = np.concatenate(
        [np.full(count, shrink), -np.ones(count), np.full(count, shrink), -np.ones(count)]
    )
    return sparse.csr_matrix(
        (data, (np.concatenate([row[:count], row[:count], row[count:], row[count:]]), cols)),
        shape=(2 * count, (trials + 1) * grid),
    )
