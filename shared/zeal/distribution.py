"""The distribution of a window's readings, estimated from their codes by deconvolution.

The server knows exactly how a reading becomes a code (``Zeal.output_distribution``: the
grid sampler's integer tables), so the readings' distribution is recovered from the codes'
counts as post-processing, at no privacy cost beyond the codes'.

The model (Efron's g-modelling, "Empirical Bayes deconvolution estimates", Biometrika 2016,
with a P-spline penalty as in Eilers and Marx 1996): the readings' density on
``[lower, upper]`` is piecewise constant over ``FINE_BINS`` equal bins, its logarithm a
cubic B-spline (:func:`splines`: one per two code steps across the range, 12 to 40), and,
in half of the candidates, two point masses, at ``lower`` and at ``upper`` (readings there
are common: a meter at zero, and every out-of-range reading is clipped to a bound on the
device). A code's probability is ``f = M g`` with ``M[code, bin]`` the exact probability
of the code for a reading spread evenly over the bin. Each candidate maximizes the
log-likelihood of the codes' counts minus ``lam/2 |D3 a|^2`` (third differences of the
spline coefficients: unpenalized, the log density is a quadratic, a truncated normal), for
each ``lam`` of ``LAMBDAS``. The estimate averages the candidates with Akaike weights
``exp(-score/2)``, ``score = -2 loglik + 2 edf`` (edf: a candidate's effective degrees of
freedom), plus ``2 ln n`` for the point masses (BIC's price: they must be plain in the
data). The spline count, the averaging and the point masses' price were chosen by
simulation against the alternatives (a fixed count of 20, a heavier weight on edf,
picking one candidate; bench/DISTRIBUTION.md says what the choice gives).

The estimand is the distribution of all readings in the window, pooled over devices: each
reading weighs the same, so a device that sends more readings weighs more.

Intervals come from a bootstrap over devices (:func:`device_bootstrap`): devices drawn
with replacement, their codes refitted, percentile intervals. Devices
differ and a device's readings are correlated; resampling whole devices keeps both. The
resampling is seeded from the counts, so an answer is deterministic for given codes (it
is post-processing of released codes: it needs no secret randomness).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from zeal._core.mechanism import Zeal
from zeal.errors import CodeError, ParameterError
from zeal.estimate import check_confidence, check_real

__all__ = [
    "AIC_WEIGHT",
    "BOOTSTRAP_REPS",
    "FINE_BINS",
    "INTERVAL_LAM",
    "LAMBDAS",
    "MAX_ROWS",
    "MIN_DEVICES",
    "MIN_EPSILON",
    "MIN_READINGS",
    "Bootstrap",
    "Fit",
    "code_block",
    "code_counts",
    "code_index",
    "code_rows",
    "default_bins",
    "device_bootstrap",
    "fit",
    "transition",
    "why_no_interval",
]

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]

#: Equal bins of [lower, upper] the density is constant on.
FINE_BINS = 128
#: Cubic B-splines spanning the log density: one per two code steps across the range
#: (finer features than the codes resolve are not there to find), within these bounds.
SPLINES = (12, 40)
#: The point masses' price in a candidate's score, times ln n (2: BIC's for two
#: parameters).
ATOM_PRICE = 2.0
#: The order of the differences of their coefficients the penalty takes.
ORDER = 3
#: Penalty weights tried, from smooth to rough (the candidates of :func:`fit`).
LAMBDAS = tuple(10.0**k for k in np.arange(6.0, -2.01, -0.5))
#: The weight of the effective degrees of freedom in a candidate's score (1 is Akaike's).
AIC_WEIGHT = 1.0
#: Rows of the transition matrix at most (see code_block).
MAX_ROWS = 128
#: Sub-points per bin at which a bin's code probabilities are averaged.
_SUB = 8
#: Where a bootstrap interval is offered (:func:`why_no_interval`): its coverage was
#: measured at least 0.90 from 20 devices, 3,000 readings and epsilon 0.5 on (20 devices of
#: 50 readings at epsilon 0.5: 0.845; bench/DISTRIBUTION.md).
MIN_DEVICES = 20
MIN_READINGS = 3000
MIN_EPSILON = 0.5
#: The roughest penalty the bootstrap refits at (see device_bootstrap).
INTERVAL_LAM = 1.0
#: Resamples per bootstrap.
BOOTSTRAP_REPS = 200
_NEWTON_STEPS = 100
#: A bootstrap refit stops when a step gains less than this times n in log-likelihood
#: (the estimate's own fit: 1e-10); its quantiles move by far less than their interval.
REFIT_TOL = 1e-6
_RIDGE = 1e-9


def default_bins(params: Zeal) -> int:
    """Histogram bins for a stream: each at least the grid's resolution (one code step in
    reading units), at most ``FINE_BINS``."""
    return max(1, min(FINE_BINS, int((params.upper - params.lower) / params.grid_step)))


def splines(params: Zeal) -> int:
    """The B-splines of the log density for a stream (``SPLINES``)."""
    low, high = SPLINES
    return max(low, min(high, default_bins(params) // 2))


def code_block(params: Zeal) -> int:
    """Adjacent codes counted together: 1 unless the stream has more than ``MAX_ROWS``
    codes (wide payloads; a block of codes is then one observation, whose probability is
    its codes' sum: the likelihood stays exact, only coarser)."""
    return -(-(params.code_max - params.code_min + 1) // MAX_ROWS)


def code_rows(params: Zeal) -> int:
    """The rows of :func:`transition` and of the counts: the stream's code blocks."""
    return -(-(params.code_max - params.code_min + 1) // code_block(params))


def code_index(params: Zeal, codes: npt.NDArray[np.integer[Any]]) -> _I64:
    """Each valid code's row (its block)."""
    index: _I64 = (codes.astype(np.int64) - params.code_min) // code_block(params)
    return index


@lru_cache(maxsize=64)
def transition(params: Zeal) -> _F64:
    """``M[row, column]``: a code block's exact probability (:func:`code_rows`; one code
    each for all but the widest streams) for a reading spread evenly over each of the
    ``FINE_BINS`` bins, then for a reading at ``lower`` and at ``upper``. A column's
    probabilities are the grid sampler's (Zeal.output_distribution), averaged over ``_SUB``
    points of the bin: in a bin they are piecewise linear in the reading."""
    lower, upper = params.lower, params.upper
    width = (upper - lower) / FINE_BINS
    points = [lower + width * (i + (s + 0.5) / _SUB) for i in range(FINE_BINS) for s in range(_SUB)]
    block = code_block(params)
    edges = params.code_min + block * np.arange(code_rows(params) + 1, dtype=np.int64)
    matrix = np.zeros((code_rows(params), FINE_BINS + 2))

    def add(column: int, reading: float, weight: float) -> None:
        found = params.output_distribution(reading)
        for first, stop, numerator in found.runs:
            # the run's codes [first, stop) in each block, each of probability num / den
            inside = np.diff(np.clip(edges, first, stop)).astype(np.float64)
            matrix[:, column] += inside * (weight * numerator / found.denominator)

    for index, x in enumerate(points):
        add(index // _SUB, x, 1 / _SUB)
    add(FINE_BINS, lower, 1.0)
    add(FINE_BINS + 1, upper, 1.0)
    matrix.setflags(write=False)
    return matrix


def _bsplines(x: _F64, count: int) -> _F64:
    """The ``count`` cubic B-splines with equally spaced knots on [0, 1], at x (Cox-de Boor)."""
    degree = 3
    inner = np.linspace(0.0, 1.0, count - degree + 1)
    knots = np.concatenate([np.zeros(degree), inner, np.ones(degree)])
    x = np.clip(x, 0.0, np.nextafter(1.0, 0.0))
    basis = np.array([(knots[i] <= x) & (x < knots[i + 1]) for i in range(knots.size - 1)])
    basis = basis.T.astype(np.float64)
    for k in range(1, degree + 1):
        nxt = np.zeros((x.size, knots.size - 1 - k))
        for i in range(knots.size - 1 - k):
            left, right = knots[i + k] - knots[i], knots[i + k + 1] - knots[i + 1]
            if left > 0:
                nxt[:, i] += (x - knots[i]) / left * basis[:, i]
            if right > 0:
                nxt[:, i] += (knots[i + k + 1] - x) / right * basis[:, i + 1]
        basis = nxt
    return basis


@lru_cache(maxsize=8)
def _design(count: int, atoms: bool) -> tuple[_F64, _F64]:
    """The log density's design over the bins (and the two point masses, with `atoms`) by
    coefficients, and the penalty's matrix (ORDER-th differences of the `count` spline
    coefficients; the masses' own coefficients are free)."""
    extra = 2 if atoms else 0
    centres = (np.arange(FINE_BINS) + 0.5) / FINE_BINS
    design = np.zeros((FINE_BINS + extra, count + extra))
    design[:FINE_BINS, :count] = _bsplines(centres, count)
    if atoms:
        design[FINE_BINS, count] = design[FINE_BINS + 1, count + 1] = 1.0
    differences = np.diff(np.eye(count), ORDER, axis=0)
    penalty = np.zeros((count + extra, count + extra))
    penalty[:count, :count] = differences.T @ differences
    design.setflags(write=False)
    penalty.setflags(write=False)
    return design, penalty


@dataclass(frozen=True)
class Fit:
    """An estimated distribution of readings on ``[lower, upper]``.

    ``probabilities`` are the masses of ``FINE_BINS`` equal bins (spread evenly in each),
    then of the point masses at ``lower`` and ``upper``; they sum to 1. ``lam`` is the
    penalty of the candidate weighing most and ``coefficients`` its coefficients (``splines``
    B-splines, then the point masses' if it has them), ``edf`` the candidates' effective
    degrees of freedom (weighted), ``n`` the readings.
    """

    lower: float
    upper: float
    probabilities: _F64
    n: int
    lam: float
    edf: float
    loglik: float
    coefficients: _F64
    splines: int = SPLINES[0]

    @property
    def _masses(self) -> tuple[_F64, float, float]:
        p = self.probabilities
        return p[:FINE_BINS], float(p[FINE_BINS]), float(p[FINE_BINS + 1])

    def _knots(self) -> tuple[_F64, _F64]:
        """The CDF's corner points: x from lower to upper, F(x) just after each (the mass
        at lower counted at lower, the mass at upper only at upper itself)."""
        bins, low, _ = self._masses
        x = np.linspace(self.lower, self.upper, FINE_BINS + 1)
        return x, low + np.concatenate([[0.0], np.cumsum(bins)])

    def cdf(self, x: float) -> float:
        """P(reading <= x)."""
        value = check_real("x", x)
        if value < self.lower:
            return 0.0
        if value >= self.upper:
            return 1.0
        knots, cumulative = self._knots()
        return float(np.interp(value, knots, cumulative))

    def share_above(self, threshold: float) -> float:
        """P(reading > threshold)."""
        return 1.0 - self.cdf(threshold)

    def quantile(self, q: float) -> float:
        """The least x with P(reading <= x) >= q, for q in (0, 1)."""
        level = check_real("q", q)
        if not 0.0 < level < 1.0:
            raise ParameterError(f"a quantile's level must lie in (0, 1), got {q!r}")
        knots, cumulative = self._knots()
        if level <= cumulative[0]:
            return self.lower
        if level >= cumulative[-1]:
            return self.upper
        i = int(np.searchsorted(cumulative, level, side="left"))
        low, high = cumulative[i - 1], cumulative[i]
        # a flat stretch of the CDF (an empty bin) cannot hold the first x reaching q
        share = (level - low) / (high - low) if high > low else 1.0
        return float(knots[i - 1] + share * (knots[i] - knots[i - 1]))

    def mean(self) -> float:
        """The distribution's mean."""
        bins, low, high = self._masses
        width = (self.upper - self.lower) / FINE_BINS
        centres = self.lower + width * (np.arange(FINE_BINS) + 0.5)
        return float(bins @ centres + low * self.lower + high * self.upper)

    def histogram(self, bins: int) -> tuple[_F64, _F64]:
        """(edges, masses) of ``bins`` equal bins of [lower, upper]; the point masses fall
        in the first and the last bin."""
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= FINE_BINS:
            raise ParameterError(f"bins must be an integer in [1, {FINE_BINS}], got {bins!r}")
        edges = np.linspace(self.lower, self.upper, bins + 1)
        knots, cumulative = self._knots()
        at = np.interp(edges, knots, cumulative)
        at[0], at[-1] = 0.0, 1.0
        return edges, np.diff(at)


def code_counts(params: Zeal, codes: npt.ArrayLike) -> _I64:
    """Counts of the stream's codes by row of :func:`transition` (``code - code_min`` for
    all but the widest streams); codes the stream cannot produce raise :class:`CodeError`."""
    params.to_float64(codes)  # refuses codes outside the stream's range
    index = code_index(params, np.asarray(codes).ravel())
    counts: _I64 = np.bincount(index, minlength=code_rows(params)).astype(np.int64)
    return counts


def _check_counts(params: Zeal, counts: npt.ArrayLike) -> _I64:
    array = np.asarray(counts)
    size = code_rows(params)
    if array.ndim != 1 or array.size != size or array.dtype.kind not in "iu":
        raise CodeError(f"counts must be {size} integers, one per row of the stream's codes")
    if array.size and int(array.min()) < 0:
        raise CodeError("counts must not be negative")
    if int(array.sum()) == 0:
        raise ParameterError("no readings: a distribution needs at least one code")
    return array.astype(np.int64)


def _newton(
    counts: _F64,
    matrix: _F64,
    shape: tuple[int, bool],
    lam: float,
    start: _F64,
    *,
    tol: float = 1e-10,
) -> tuple[_F64, _F64, float, _F64]:
    """The penalized maximum-likelihood coefficients from `start` (damped Newton, with the
    codes' score outer product for the curvature) for a candidate of `shape` (splines,
    point masses): (coefficients, g over bins and both masses, loglik, curvature)."""
    design, base = _design(*shape)
    penalty = lam * base
    if not shape[1]:
        matrix = matrix[:, :FINE_BINS]
    n = float(counts.sum())
    ridge = _RIDGE * n * np.eye(start.size)

    def value(a: _F64) -> tuple[float, _F64, _F64]:
        e = design @ a
        # floored: a bin below e^-300 of the largest is empty, and subnormal floats are slow
        g = np.exp(np.maximum(e - e.max(), -300.0))
        g /= g.sum()
        f = np.maximum(matrix @ g, 1e-300)
        return float(counts @ np.log(f) - 0.5 * a @ penalty @ a), g, f

    a = start.copy()
    current, g, f = value(a)
    curvature = np.zeros((a.size, a.size))
    for _ in range(_NEWTON_STEPS):
        scores = ((matrix / f[:, None]) - 1.0) * g[None, :] @ design
        curvature = (scores * counts[:, None]).T @ scores
        gradient = scores.T @ counts - penalty @ a
        step = np.linalg.solve(curvature + penalty + ridge, gradient)
        t = 1.0
        while True:
            found, g_new, f_new = value(a + t * step)
            if found >= current - 1e-12 or t < 1e-6:
                break
            t /= 2
        a = a + t * step
        gain, current, g, f = found - current, found, g_new, f_new
        if gain < tol * n:
            break
    loglik = float(counts @ np.log(f))
    if not shape[1]:
        g = np.concatenate([g, [0.0, 0.0]])
    return a, g, loglik, curvature


def fit(params: Zeal, counts: npt.ArrayLike, *, lam: float | None = None) -> Fit:
    """The readings' distribution from the counts of their codes (:func:`code_counts`): the
    candidates (each penalty of ``LAMBDAS``, or `lam` alone, without and with the point
    masses) averaged with their Akaike weights (module docstring)."""
    found = _check_counts(params, counts)
    keep = found > 0
    matrix = transition(params)[keep]
    c = found[keep].astype(np.float64)
    n = float(c.sum())
    count = splines(params)
    choices = LAMBDAS if lam is None else (check_real("lam", lam),)
    candidates: list[tuple[float, _F64, float, float, _F64]] = []  # score, g, lam, edf, a
    for atoms in (False, True):
        _, base = _design(count, atoms)
        a = np.zeros(count + (2 if atoms else 0))
        for weight in choices:
            a, g, loglik, curvature = _newton(c, matrix, (count, atoms), weight, a)
            ridge = _RIDGE * n * np.eye(a.size)
            solved = np.linalg.solve(curvature + weight * base + ridge, curvature)
            edf = float(np.trace(solved))
            score = -2.0 * loglik + 2.0 * AIC_WEIGHT * edf
            if atoms:
                score += ATOM_PRICE * math.log(n)
            candidates.append((score, g, weight, edf, a))
    least = min(candidate[0] for candidate in candidates)
    weights = np.array([math.exp(-(candidate[0] - least) / 2) for candidate in candidates])
    weights /= weights.sum()
    g = np.sum([w * candidate[1] for w, candidate in zip(weights, candidates, strict=True)], 0)
    g /= g.sum()
    _, _, best_lam, _, best_a = candidates[int(np.argmax(weights))]
    edf = float(weights @ np.array([candidate[3] for candidate in candidates]))
    loglik = float(c @ np.log(np.maximum(matrix @ g, 1e-300)))
    low, high = float(params.lower), float(params.upper)
    return Fit(low, high, g, int(n), best_lam, edf, loglik, best_a, count)


def why_no_interval(params: Zeal, devices: int, readings: int) -> str | None:
    """Why a window's estimates come without intervals (None: they have them): intervals
    are offered only where their coverage was measured (``MIN_DEVICES``, ``MIN_READINGS``,
    ``MIN_EPSILON``)."""
    if params.epsilon < MIN_EPSILON:
        return (
            f"no intervals: their coverage was not measured below epsilon {MIN_EPSILON} "
            f"(this stream: {params.epsilon:g})"
        )
    if devices < MIN_DEVICES or readings < MIN_READINGS:
        return (
            f"no intervals: the window holds {readings:,} readings of {devices:,} device(s); "
            f"intervals are offered from {MIN_READINGS:,} readings of {MIN_DEVICES} devices "
            "on, where their coverage was measured"
        )
    return None


@dataclass(frozen=True)
class Bootstrap:
    """Percentile intervals from refits of resampled devices: per quantile level and per
    threshold share, (low, high) at ``level``; ``mean`` the distribution mean's."""

    level: float
    reps: int
    devices: int
    quantiles: dict[float, tuple[float, float]]
    above: dict[float, tuple[float, float]]
    mean: tuple[float, float]


def _seed(matrix: _I64) -> int:
    digest = hashlib.blake2b(np.ascontiguousarray(matrix).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def device_bootstrap(
    params: Zeal,
    per_device: npt.ArrayLike,
    *,
    quantiles: tuple[float, ...] = (),
    thresholds: tuple[float, ...] = (),
    level: float = 0.95,
    reps: int = BOOTSTRAP_REPS,
    estimate: Fit | None = None,
) -> Bootstrap:
    """Intervals for the distribution of the codes in `per_device` (one row of code counts
    per device): devices resampled with replacement `reps` times, each resample refitted
    at the penalty ``min(lam, INTERVAL_LAM)``, percentile intervals. `estimate` is the fit
    of the summed rows when the caller has it (else it is fitted here).

    The refits are rougher than the estimate: its smoothing biases it, most in a tail, and
    a bootstrap of the smoothed fit would be centred on that bias. Each interval is then
    widened by the model's resolution, one fine bin (a reading at ``lower`` and one in the
    first bin give codes alike): a quantile's by a bin on each side, a share's from the
    share above the threshold plus a bin to the share above it minus one, the mean's by
    half a bin. Deterministic: the resampling is seeded from the counts."""
    rows = np.asarray(per_device)
    check_confidence(level)
    if rows.ndim != 2 or rows.shape[1] != code_rows(params):
        raise CodeError("per_device must hold one row of code counts per device")
    if rows.dtype.kind not in "iu" or (rows.size and int(rows.min()) < 0):
        raise CodeError("per_device must hold non-negative integer counts")
    devices = rows.shape[0]
    if devices < 2:
        raise ParameterError("a bootstrap over devices needs at least two devices")
    rows = rows.astype(np.int64)
    total = rows.sum(axis=0)
    lam = (fit(params, total) if estimate is None else estimate).lam
    found = fit(params, total, lam=min(lam, INTERVAL_LAM))
    pad = (found.upper - found.lower) / FINE_BINS
    rng = np.random.default_rng(_seed(rows))
    weights = rng.multinomial(devices, np.full(devices, 1.0 / devices), size=reps)
    resampled = weights.astype(np.float64) @ rows.astype(np.float64)
    matrix = transition(params)
    shape = (found.splines, found.coefficients.size > found.splines)
    q_values: list[list[float]] = []
    a_values: list[list[float]] = []
    means: list[float] = []
    for counts in resampled:
        used = counts > 0
        a, g, loglik, _ = _newton(
            counts[used], matrix[used], shape, found.lam, found.coefficients, tol=REFIT_TOL
        )
        refit = Fit(
            found.lower, found.upper, g, int(counts.sum()), found.lam, 0.0, loglik, a, shape[0]
        )
        q_values.append([refit.quantile(q) for q in quantiles])
        a_values.append([refit.share_above(t + pad) for t in thresholds])
        a_values[-1] += [refit.share_above(t - pad) for t in thresholds]
        means.append(refit.mean())
    tail = (1.0 - level) / 2.0

    def bounds(values: npt.ArrayLike) -> tuple[float, float]:
        low, high = np.quantile(np.asarray(values, dtype=np.float64), [tail, 1.0 - tail])
        return float(low), float(high)

    qs = np.asarray(q_values).reshape(reps, len(quantiles))
    ts = np.asarray(a_values).reshape(reps, 2, len(thresholds))

    def widened(low: float, high: float) -> tuple[float, float]:
        return max(found.lower, low - pad), min(found.upper, high + pad)

    mean_low, mean_high = bounds(means)

    return Bootstrap(
        level=level,
        reps=reps,
        devices=devices,
        quantiles={q: widened(*bounds(qs[:, i])) for i, q in enumerate(quantiles)},
        above={
            t: (bounds(ts[:, 0, i])[0], bounds(ts[:, 1, i])[1]) for i, t in enumerate(thresholds)
        },
        mean=(mean_low - pad / 2, mean_high + pad / 2),
    )
