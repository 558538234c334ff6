"""Baseline mechanisms from the other papers, behind one interface with Zeal's.

Every mechanism privatizes one reading in ``[lower, upper]`` at budget ``epsilon`` (the local
model: the sensitivity is the whole range ``upper - lower``) and estimates the mean of a
batch of readings from their outputs:

    mech.perturb(readings, rng=None) -> outputs     on the device
    mech.estimate_mean(outputs) -> float            on the server
    mech.bias(x), mech.variance(x)                  closed forms per reading, where known
    mech.bits_per_reading                           what one output costs on the wire
    mech.realized_epsilon                           exact loss of the sampler as coded, or None

``realized_epsilon`` is None where the sampler draws from a continuous law in floating point
(Laplace and its bounded variants, the piecewise mechanism): their epsilon holds in real
arithmetic only. Mironov (CCS 2012) showed that textbook float64 Laplace sampling leaks
through the pattern of representable outputs, so these baselines are *float-safe in theory
only*. Duchi et al.'s one bit is sampled exactly (an integer comparison against the
probability rounded to 2**-53) and its realized loss is computed from those integers; Zeal's
grid sampler is exact and audited (``Zeal.audit``).

Randomness is the operating system's CSPRNG unless a seeded generator is passed (tests,
benchmarks), as for Zeal itself.

Papers: Liu, "Statistical properties of sanitized results from differentially private
Laplace mechanism with bounding constraints" (``000_*``: truncated and BIT Laplace,
Eqs. (2)-(5), Appendices A-B); Holohan et al., "The bounded Laplace mechanism in
differential privacy" (``002_*``: the fixed point b*); Duchi, Jordan and Wainwright's
one-bit mechanism and Wang et al.'s piecewise mechanism, the base of Zeal (``001_*``
Eq. (7), Theorem 2).

Names clash between the two Laplace papers: paper 000's *truncated* mechanism (resample
until in range, i.e. the Laplace law conditioned on the range) is paper 002's *bounded*
one, and paper 000's *BIT* (clamp to the nearest bound) is what paper 002 calls
*truncation*. Here the classes follow paper 000, and :class:`BoundedLaplace` is paper 000's
truncated law with paper 002's scale.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt

from zeal._core.laplace import (
    BITLaplace,
    BoundedLaplace,
    LaplaceMechanism,
    TruncatedLaplace,
    check_range,
    clipped,
)
from zeal._core.mechanism import Zeal
from zeal._core.randomness import Randomness, random_words, uniform01
from zeal.estimate import normal_quantile

__all__ = [
    "BITLaplace",
    "BoundedLaplace",
    "DuchiOneBit",
    "LaplaceMechanism",
    "Mechanism",
    "PiecewiseFloat",
    "TruncatedLaplace",
    "ZealMechanism",
    "uniform01",
]

_F64 = npt.NDArray[np.float64]


class Mechanism(Protocol):
    """What the benchmark needs of a mechanism (Zeal's adapter included)."""

    name: str
    lower: float
    upper: float
    epsilon: float
    bits_per_reading: int
    realized_epsilon: float | None

    def perturb(
        self, readings: npt.ArrayLike, *, rng: Randomness = None
    ) -> npt.NDArray[np.generic]: ...

    def estimate_mean(self, outputs: npt.ArrayLike) -> float: ...

    def bias(self, reading: float) -> float: ...

    def variance(self, reading: float) -> float: ...


class DuchiOneBit:
    """Duchi, Jordan and Wainwright's one-bit mechanism: 1 bit per reading, unbiased.

    With t = (2x - lower - upper) / (upper - lower) in [-1, 1], the bit is 1 with probability
    1/2 + t k, k = (e^eps - 1) / (2 (e^eps + 1)). The server's estimate of t is
    (bit - 1/2) / k. Sampled exactly: the probability is rounded to a multiple of 2**-53 and
    compared with a uniform 53-bit integer, so ``realized_epsilon`` is the exact loss of the
    rounded probabilities (the rounding also adds a bias below 2**-53 / k of the half range).
    """

    bits_per_reading = 1
    _ONE = 1 << 53

    def __init__(self, lower: float, upper: float, epsilon: float) -> None:
        self.lower, self.upper, self.epsilon = check_range(lower, upper, epsilon)
        e = math.exp(self.epsilon)
        self.k = (e - 1) / (2 * (e + 1))
        self.name = "Duchi one bit"
        self._q_lo = self._quantized(np.array([self.lower]))[0]
        self._q_hi = self._quantized(np.array([self.upper]))[0]
        one = self._ONE
        realized = max(
            Fraction(int(self._q_hi), int(self._q_lo)),
            Fraction(one - int(self._q_lo), one - int(self._q_hi)),
        )
        self.realized_epsilon = math.log(realized.numerator) - math.log(realized.denominator)

    def _t(self, x: _F64) -> _F64:
        t: _F64 = (2 * x - self.lower - self.upper) / (self.upper - self.lower)
        return np.clip(t, -1.0, 1.0)

    def _quantized(self, x: _F64) -> npt.NDArray[np.int64]:
        p = 0.5 + self._t(x) * self.k
        return np.rint(p * self._ONE).astype(np.int64)

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> npt.NDArray[np.uint8]:
        q = np.clip(
            self._quantized(clipped(self.lower, self.upper, readings)), self._q_lo, self._q_hi
        )
        draws = (random_words(rng, q.size) >> np.uint64(11)).astype(np.int64)
        return (draws < q).astype(np.uint8)

    def estimate_mean(self, outputs: npt.ArrayLike) -> float:
        bits = np.asarray(outputs)
        ones = int(np.count_nonzero(bits))
        t_hat = (ones / bits.size - 0.5) / self.k
        return (self.lower + self.upper) / 2 + (self.upper - self.lower) / 2 * t_hat

    def bias(self, reading: float) -> float:
        return 0.0

    def variance(self, reading: float) -> float:
        """((upper - lower)/2)^2 (1 / (4 k^2) - t^2)."""
        t = float(self._t(np.array([float(reading)]))[0])
        half = (self.upper - self.lower) / 2
        return half * half * (1 / (4 * self.k * self.k) - t * t)


class PiecewiseFloat:
    """The continuous piecewise mechanism in float64 (paper 001 Eq. (7), Abar = 0).

    The same density as Zeal's before the addition transform and the grid: outputs in
    [ebar - C, ebar + C], sent as 64-bit floats, unbiased, variance Theorem 2 (Eq. (14)).
    Sampled by the inverse CDF in float64: float-safe in theory only.
    """

    bits_per_reading = 64
    realized_epsilon: float | None = None

    def __init__(self, lower: float, upper: float, epsilon: float) -> None:
        self.lower, self.upper, self.epsilon = check_range(lower, upper, epsilon)
        self.params = Zeal(lower=self.lower, upper=self.upper, epsilon=self.epsilon)
        self.name = "piecewise (float64)"

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> _F64:
        x = clipped(self.lower, self.upper, readings)
        params = self.params
        h, ebar, c, p = params.half_width, params.ebar, params.C, params.p
        p_tail = p / math.exp(self.epsilon)
        left = (c + h) / 2 * ((x - ebar) / h) - (c - h) / 2 + ebar
        right = left + c - h
        m1 = (left - (ebar - c)) * p_tail
        m2 = (right - left) * p
        u = uniform01(rng, x.size)
        values: _F64 = np.where(
            u < m1,
            ebar - c + u / p_tail,
            np.where(u < m1 + m2, left + (u - m1) / p, right + (u - m1 - m2) / p_tail),
        )
        return values

    def estimate_mean(self, outputs: npt.ArrayLike) -> float:
        return float(np.mean(np.asarray(outputs, dtype=np.float64)))

    def bias(self, reading: float) -> float:
        return 0.0

    def variance(self, reading: float) -> float:
        return self.params.mechanism_variance(float(reading))


class ZealMechanism:
    """Zeal (either sampler) behind the same interface: codes out, AVG* from exact sums."""

    def __init__(self, params: Zeal) -> None:
        self.params = params
        self.lower, self.upper, self.epsilon = params.lower, params.upper, params.epsilon
        self.bits_per_reading = params.payload_bits
        self.realized_epsilon = params.realized_epsilon
        self.name = f"Zeal {params.sampler} k={params.payload_bits}"
        self._exact: dict[float, float] = {}

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> npt.NDArray[np.uint64]:
        return self.params.perturb(readings, rng=rng)

    def estimate_mean(self, outputs: npt.ArrayLike) -> float:
        return self.params.estimate_mean(outputs).mean

    def bias(self, reading: float) -> float:
        return 0.0

    def variance(self, reading: float) -> float:
        """Grid sampler: the exact Var[decode] of the reading's output distribution (the
        D**2/6 rounding term of :meth:`Zeal.variance` is an average that fails at 2-3 bits,
        where a reading's outputs cover only a few codes). Paper sampler: Theorem 2 + D**2/6,
        nominal only (that sampler is biased)."""
        x = float(reading)
        if self.params.sampler != "grid":
            return self.params.variance(x)
        cached = self._exact.get(x)
        if cached is None:
            cached = self._exact[x] = float(self.params.output_distribution(x).variance())
        return cached


def predicted_rmse(mech: Mechanism, readings: npt.ArrayLike) -> tuple[float, float]:
    """(bias, RMSE) of the mean estimate over these readings from the closed forms."""
    values = np.asarray(readings, dtype=np.float64).ravel()
    distinct, counts = np.unique(np.clip(values, mech.lower, mech.upper), return_counts=True)
    n = int(values.size)
    bias = sum(c * mech.bias(float(v)) for v, c in zip(distinct, counts, strict=True)) / n
    var = sum(c * mech.variance(float(v)) for v, c in zip(distinct, counts, strict=True)) / n / n
    return bias, math.sqrt(var + bias * bias)


def normal_tolerance(mech: Mechanism, readings: npt.ArrayLike, confidence: float) -> float:
    """Half width around the predicted mean within which the estimate falls at `confidence`."""
    bias, rmse = predicted_rmse(mech, readings)
    return normal_quantile(confidence) * math.sqrt(max(rmse * rmse - bias * bias, 0.0))
