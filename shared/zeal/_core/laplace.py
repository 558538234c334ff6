"""The Laplace baselines (papers 000 and 002): plain, truncated, BIT (clamped) and bounded
Laplace, behind the interface of :mod:`zeal.baselines` (which documents the papers, the
naming clash between them, and why their epsilon holds in real arithmetic only); and the
range checks every baseline shares."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from zeal._core.randomness import Randomness, uniform01
from zeal.errors import ParameterError
from zeal.protocol import EPSILON_MAX

__all__ = [
    "BITLaplace",
    "BoundedLaplace",
    "LaplaceMechanism",
    "TruncatedLaplace",
    "check_range",
    "clipped",
]

_F64 = npt.NDArray[np.float64]


def check_range(lower: float, upper: float, epsilon: float) -> tuple[float, float, float]:
    """A baseline's range and budget, checked like Zeal's (ParameterError)."""
    values = []
    for name, value in (("lower", lower), ("upper", upper), ("epsilon", epsilon)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ParameterError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ParameterError(f"{name} must be finite, got {value!r}")
        values.append(float(value))
    lo, hi, eps = values
    if not lo < hi:
        raise ParameterError(f"lower must be below upper, got [{lo!r}, {hi!r}]")
    if not 0 < eps <= EPSILON_MAX:
        raise ParameterError(f"epsilon must be in (0, {EPSILON_MAX}], got {eps!r}")
    return lo, hi, eps


def clipped(lower: float, upper: float, readings: npt.ArrayLike) -> _F64:
    """Finite readings clipped to the range, flat (ParameterError for NaN or infinity)."""
    values = np.asarray(readings, dtype=np.float64).ravel()
    if not np.all(np.isfinite(values)):
        raise ParameterError("readings must be finite numbers")
    return np.clip(values, lower, upper)


# -- Laplace and its bounded variants -----------------------------------------------------------


class LaplaceMechanism:
    """x + Lap((upper - lower) / epsilon): unbounded float64 output, unbiased plain mean.

    Float-safe in theory only (see the module docstring).
    """

    bits_per_reading = 64
    realized_epsilon: float | None = None

    def __init__(self, lower: float, upper: float, epsilon: float) -> None:
        self.lower, self.upper, self.epsilon = check_range(lower, upper, epsilon)
        self.scale = (self.upper - self.lower) / self.epsilon
        self.name = "Laplace"

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> _F64:
        x = clipped(self.lower, self.upper, readings)
        u = uniform01(rng, x.size) - 0.5
        # Inverse CDF; |u| < 1/2 so the logarithm is finite.
        out: _F64 = x - self.scale * np.sign(u) * np.log1p(-2 * np.abs(u))
        return out

    def estimate_mean(self, outputs: npt.ArrayLike) -> float:
        return float(np.mean(np.asarray(outputs, dtype=np.float64)))

    def bias(self, reading: float) -> float:
        return 0.0

    def variance(self, reading: float) -> float:
        return 2 * self.scale * self.scale


class _LaplaceOnRange:
    """Laplace(x, scale) restricted to [c0, c1] (paper 000's notation) in some way."""

    bits_per_reading = 64
    realized_epsilon: float | None = None

    def __init__(self, lower: float, upper: float, epsilon: float, scale: float) -> None:
        self.lower, self.upper, self.epsilon = check_range(lower, upper, epsilon)
        self.scale = scale
        self.c0, self.c1 = self.lower, self.upper

    def _tails(self, s: float) -> tuple[float, float]:
        """p1 = P(Lap < c0), p2 = P(Lap > c1) (Appendix B's names)."""
        lam = self.scale
        return 0.5 * math.exp((self.c0 - s) / lam), 0.5 * math.exp((s - self.c1) / lam)

    def estimate_mean(self, outputs: npt.ArrayLike) -> float:
        return float(np.mean(np.asarray(outputs, dtype=np.float64)))

    def variance(self, reading: float) -> float:
        return self.mse(reading) - self.bias(reading) ** 2

    def mse(self, reading: float) -> float:
        raise NotImplementedError

    def bias(self, reading: float) -> float:
        raise NotImplementedError


class TruncatedLaplace(_LaplaceOnRange):
    """Paper 000's truncated Laplace (Eq. (2)): Lap(x, lambda) conditioned on [lower, upper].

    lambda = (upper - lower) / epsilon. Sampled by the inverse CDF of the conditioned law (the
    same law as resampling until in range). The plain mean of the outputs is biased towards
    the middle of the range (Proposition 3, Eq. (4)). Float-safe in theory only.
    """

    def __init__(self, lower: float, upper: float, epsilon: float) -> None:
        lo, hi, eps = check_range(lower, upper, epsilon)
        super().__init__(lo, hi, eps, (hi - lo) / eps)
        self.name = "truncated Laplace"

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> _F64:
        return _conditioned_laplace(
            clipped(self.lower, self.upper, readings), self.scale, self.c0, self.c1, rng
        )

    def bias(self, reading: float) -> float:
        """mu_1 - s, Eq. (4)."""
        return self._moments(reading)[0]

    def mse(self, reading: float) -> float:
        """E(s* - s)^2 = (B - 2 s A) / (1 - p1 - p2) - s^2 (Appendix B, first lines)."""
        s = float(reading)
        a, b, mass = self._ab(s)
        return (b - 2 * s * a) / mass - s * s

    def _ab(self, s: float) -> tuple[float, float, float]:
        lam, c0, c1 = self.scale, self.c0, self.c1
        e0, e1 = math.exp((c0 - s) / lam), math.exp((s - c1) / lam)
        a = (lam - c0 + s) / 2 * e0 - (lam + c1 - s) / 2 * e1
        b = (
            2 * lam * lam
            + s * s
            - 0.5 * (2 * lam * lam - 2 * lam * c0 + c0 * c0) * e0
            - 0.5 * (2 * lam * lam + 2 * lam * c1 + c1 * c1) * e1
        )  # Eq. (A.1) times the mass
        return a, b, 1 - e0 / 2 - e1 / 2

    def _moments(self, s: float) -> tuple[float, float]:
        a, b, mass = self._ab(s)
        return a / mass, b / mass

    def mse_boxed(self, reading: float) -> float:
        """Appendix B's final (boxed) form, kept to check it against the first form."""
        s, lam, c0, c1 = float(reading), self.scale, self.c0, self.c1
        e0, e1 = math.exp((c0 - s) / lam), math.exp((s - c1) / lam)
        num = lam / 2 * ((s - c0) * e0 + (c1 - s) * e1) + 0.5 * (
            (c0 * c0 / 4 + (c0 / 2 - s) ** 2) * e0 + (c1 * c1 / 4 + (c1 / 2 - s) ** 2) * e1
        )
        return 2 * lam * lam - num / (1 - e0 / 2 - e1 / 2)


class BITLaplace(_LaplaceOnRange):
    """Paper 000's boundary-inflated truncated Laplace: Lap(x, lambda) clamped to the range.

    The outputs below (above) the range become exactly ``lower`` (``upper``), each with
    probability 1/2 exp(-(s - c0)/lambda) (1/2 exp(-(c1 - s)/lambda)); Eq. (3) prints the upper
    mass as 1 - 1/2 exp(...), a typo the paper's own proof (Appendix A) does not make. Bias Eq.
    (5), MSE Appendix B. Float-safe in theory only.
    """

    def __init__(self, lower: float, upper: float, epsilon: float) -> None:
        lo, hi, eps = check_range(lower, upper, epsilon)
        super().__init__(lo, hi, eps, (hi - lo) / eps)
        self.name = "BIT Laplace"
        self._plain = LaplaceMechanism(lo, hi, eps)

    def perturb(self, readings: npt.ArrayLike, *, rng: Randomness = None) -> _F64:
        out: _F64 = np.clip(self._plain.perturb(readings, rng=rng), self.c0, self.c1)
        return out

    def bias(self, reading: float) -> float:
        """mu_2 - s = lambda/2 [exp((c0 - s)/lambda) - exp((s - c1)/lambda)] (Eq. (5))."""
        p1, p2 = self._tails(float(reading))
        return self.scale * (p1 - p2)

    def mse(self, reading: float) -> float:
        """2 lambda^2 (1 - p1 - p2) + 2 lambda ((c0 - s) p1 + (s - c1) p2) (Appendix B)."""
        s, lam = float(reading), self.scale
        p1, p2 = self._tails(s)
        return 2 * lam * lam * (1 - p1 - p2) + 2 * lam * ((self.c0 - s) * p1 + (s - self.c1) * p2)


def _conditioned_laplace(x: _F64, b: float, c0: float, c1: float, rng: Randomness) -> _F64:
    """Inverse CDF of Lap(x, b) conditioned on [c0, c1], vectorized."""

    def cdf(v: _F64) -> _F64:
        z = (v - x) / b
        out: _F64 = np.where(
            z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0))
        )
        return out

    f0, f1 = cdf(np.full_like(x, c0)), cdf(np.full_like(x, c1))
    target = f0 + uniform01(rng, x.size) * (f1 - f0)
    below = target < 0.5
    with np.errstate(divide="ignore"):
        values = np.where(
            below,
            x + b * np.log(2 * np.maximum(target, 1e-300)),
            x - b * np.log(2 * np.maximum(1 - target, 1e-300)),
        )
    out: _F64 = np.clip(values, c0, c1)
    return out


class BoundedLaplace(TruncatedLaplace):
    """Laplace conditioned on the output domain with paper 002's scale b* (the fixed point).

    For a query of sensitivity ``sensitivity`` (default: the whole range, as in the local
    model) over the domain [lower, upper], b* is the fixed point of
    f(b) = Delta / (epsilon - ln DeltaC(b) - ln(1 - delta)), DeltaC(b) = C_{l+Delta}(b) / C_l(b),
    with C_q(b) the mass of Lap(q, b) on the domain, found by bisection between Delta/epsilon
    and the paper's upper bracket. When the sensitivity is the whole range, DeltaC = 1 and
    b* = Delta / epsilon: in the local model the naive scale is already private and this is
    paper 000's truncated Laplace. It matters for smaller sensitivities, e.g. a device that
    reports the mean of m readings (Delta = range / m), where the naive scale is not private
    (:meth:`privacy_loss` shows it).
    """

    def __init__(
        self,
        lower: float,
        upper: float,
        epsilon: float,
        *,
        sensitivity: float | None = None,
        delta: float = 0.0,
    ) -> None:
        lo, hi, eps = check_range(lower, upper, epsilon)
        width = hi - lo
        sens = width if sensitivity is None else float(sensitivity)
        if not 0 < sens <= width:
            raise ParameterError(f"sensitivity must be in (0, {width}], got {sensitivity!r}")
        if not 0 <= delta < 1:
            raise ParameterError(f"delta must be in [0, 1), got {delta!r}")
        self.sensitivity, self.delta = sens, float(delta)
        self.lower, self.upper, self.epsilon = lo, hi, eps
        self.naive_scale = sens / (eps - math.log1p(-self.delta))
        _LaplaceOnRange.__init__(self, lo, hi, eps, self._fixed_point())
        self.name = "bounded Laplace (b*)"

    def mass(self, q: float, b: float) -> float:
        """C_q(b): the probability that Lap(q, b) falls in [lower, upper]."""
        return 1 - 0.5 * math.exp(-(q - self.lower) / b) - 0.5 * math.exp(-(self.upper - q) / b)

    def _f(self, b: float) -> float:
        ratio = self.mass(self.lower + self.sensitivity, b) / self.mass(self.lower, b)
        return self.sensitivity / (self.epsilon - math.log(ratio) - math.log1p(-self.delta))

    def _fixed_point(self) -> float:
        lo = self.naive_scale
        if self._f(lo) <= lo * (1 + 1e-15):
            return lo  # DeltaC(b) = 1: the whole range is the sensitivity
        hi = lo
        while self._f(hi) > hi:
            hi *= 2
        for _ in range(200):
            mid = (lo + hi) / 2
            if self._f(mid) > mid:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-14 * hi:
                break
        return hi  # f(hi) <= hi: private

    def privacy_loss(self, scale: float | None = None, *, grid: int = 2001) -> float:
        """sup of ln p(y|q)/p(y|q') over q, q' in the domain with |q - q'| <= sensitivity,
        computed on a grid of q (the sup over y is |q - q'|/b in closed form)."""
        b = self.scale if scale is None else float(scale)
        q = np.linspace(self.lower, self.upper, grid)
        log_mass = np.log(
            1 - 0.5 * np.exp(-(q - self.lower) / b) - 0.5 * np.exp(-(self.upper - q) / b)
        )
        gap = np.abs(q[:, None] - q[None, :])
        loss = np.where(
            gap <= self.sensitivity * (1 + 1e-12),
            gap / b + log_mass[None, :] - log_mass[:, None],
            0,
        )
        return float(loss.max())


# -- one bit and the piecewise mechanism ---------------------------------------------------------
