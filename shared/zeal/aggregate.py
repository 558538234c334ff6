"""The server side of the Zeal mechanism: codes back to float64 values, decoding, and the
debiased average AVG* (Eq. (15)) with its standard error and Bernstein bounds (Theorems 3
and 4), all from exact integer sums of codes.

:class:`Aggregation` is a mixin of :class:`zeal.Zeal` (the parameters it reads are declared
below and set by Zeal); use it through Zeal.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from zeal._exact import exact_sum, exact_sum_squares
from zeal.errors import CodeError, ParameterError
from zeal.estimate import (
    Estimate,
    bernstein_half_width,
    bernstein_tail,
    check_confidence,
    check_real,
    normal_quantile,
)
from zeal.grid import GridSampler

__all__ = ["Aggregation"]

_U64 = npt.NDArray[np.uint64]
_F64 = npt.NDArray[np.float64]


class Aggregation:
    """Decoding and estimation for a stream's parameters (a mixin of Zeal)."""

    __slots__ = ()

    C: float
    ebar: float
    lower: float
    upper: float
    payload_bits: int
    shared_bits: int
    grid_step: float
    code_min: int
    code_max: int
    _grid: GridSampler | None
    _prefix: int
    _top: Fraction

    def mechanism_variance(self, reading: float) -> float:
        raise NotImplementedError  # Zeal's (Theorem 2)

    def _valid_codes(self, codes: npt.ArrayLike) -> _U64:
        array = np.asarray(codes)
        if array.size == 0:
            return np.zeros(array.shape, dtype=np.uint64)
        if array.dtype.kind not in "iu":
            raise CodeError(f"codes must be integers, got an array of {array.dtype}")
        if array.dtype.kind == "i" and array.size and int(array.min()) < 0:
            raise CodeError(f"codes must be >= {self.code_min}, got {int(array.min())}")
        result = array.astype(np.uint64, copy=False)
        if result.size:
            low, high = int(result.min()), int(result.max())
            if low < self.code_min or high > self.code_max:
                bad = low if low < self.code_min else high
                raise CodeError(
                    f"code {bad} is outside [{self.code_min}, {self.code_max}], the codes this "
                    f"stream's {self.payload_bits}-bit mechanism can produce"
                )
        return result

    def _codes_of_floats(self, values: _F64) -> _U64:
        bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
        mask = np.uint64((1 << self.payload_bits) - 1)
        off_grid = np.flatnonzero((bits & ~mask) != np.uint64(self._prefix))
        if off_grid.size:
            i = int(off_grid[0])
            raise CodeError(
                f"value {float(values.ravel()[i])!r} at index {i} is not an output of this "
                f"stream: outputs are float64 in [{self._value_of(self.code_min)!r}, "
                f"{self._value_of(self.code_max)!r}] sharing their top {self.shared_bits} bits"
            )
        return bits & mask

    def _value_of(self, code: int) -> float:
        return float(np.array([self._prefix | code], dtype=np.uint64).view(np.float64)[0])

    def to_float64(self, codes: npt.ArrayLike) -> _F64:
        """The privatized values x* = x + Abar, rebuilt bit-exactly from codes."""
        valid = self._valid_codes(codes)
        values: _F64 = (valid | np.uint64(self._prefix)).view(np.float64)
        return values

    def from_float64(self, values: npt.ArrayLike) -> _U64:
        """Codes of privatized float64 values; values off the grid or out of range raise."""
        array = np.asarray(values)
        if array.dtype.kind != "f":
            raise CodeError(f"privatized values must be float64, got an array of {array.dtype}")
        return self._valid_codes(self._codes_of_floats(array.astype(np.float64, copy=False)))

    def decode(self, codes: npt.ArrayLike) -> _F64:
        """Per-reading estimates x* - Abar = Ebar + C - q D, computed without cancellation.

        Unbiased for the grid sampler. For the paper sampler Abar is its float64 Abar, which
        is what that sampler added and what the paper's aggregator subtracts.

        q D is exact (an integer times a power of two); no float near 2**exponent is formed.
        """
        valid = self._valid_codes(codes)
        depth = ((1 << self.payload_bits) - 2) - valid.astype(np.int64)
        estimates: _F64 = self.ebar + (self.C - depth.astype(np.float64) * self.grid_step)
        return estimates

    def _sum_numerator(self) -> tuple[int, int, int, int]:
        """(top, D, denominator, highest code) with decoded sums = (n * top - D * (n *
        highest - sum of codes)) / denominator exactly: the common denominator of the top
        value and the grid step, over which the arithmetic is in integers."""
        step = Fraction(self.grid_step)
        denominator = math.lcm(self._top.denominator, step.denominator)
        top = self._top.numerator * (denominator // self._top.denominator)
        grid = step.numerator * (denominator // step.denominator)
        return top, grid, denominator, (1 << self.payload_bits) - 2

    def decoded_sums(self, counts: list[int], sum_codes: list[int]) -> _F64:
        """Per partition, the sum of its decoded values (n times AVG*, Eq. (15)) from the
        exact sums of its codes, in exact integer arithmetic and rounded once: the partition
        statistics of a comparison (``zeal.compare.Partitions``), at integer cost per
        partition instead of a whole estimate's."""
        if len(counts) != len(sum_codes):
            raise ParameterError(f"{len(counts)} counts but {len(sum_codes)} sums of codes")
        top, grid, denominator, highest = self._sum_numerator()
        sums = [
            (n * top - grid * (n * highest - codes)) / denominator  # int / int: rounded once
            for n, codes in zip(counts, sum_codes, strict=True)
        ]
        return np.asarray(sums, dtype=np.float64)

    def mean_of_sums(self, n: int, sum_codes: int) -> float:
        """AVG* (Eq. (15)) from n and the exact sum of codes, rounded once: the same float
        as :meth:`estimate_from_sums`'s mean, without the squares its standard error needs."""
        if n < 1:
            raise CodeError("cannot estimate a mean from zero codes")
        top, grid, denominator, highest = self._sum_numerator()
        return (n * top - grid * (n * highest - sum_codes)) / (n * denominator)

    def variance_bound(self) -> float:
        """An upper bound on Var[decode] valid for every reading in range.

        Grid: computed exactly from the sampler's tables (see GridSampler.cell_variance_bound).
        Paper: Theorem 2 at |z| = 1 plus D**2/4, nominal since that sampler is biased.
        """
        d2 = self.grid_step * self.grid_step
        if self._grid is not None:
            return float(self._grid.cell_variance_bound()) * d2 * (1 + 1e-12)
        return self.mechanism_variance(self.upper) + d2 / 4

    def error_bound(self) -> float:
        """M: the largest |decode - reading| any reading in range can produce."""
        low = float(self._decoded(self.code_min))
        high = float(self._decoded(self.code_max))
        return max(high - self.lower, self.upper - low)

    def _decoded(self, code: int) -> Fraction:
        depth = (1 << self.payload_bits) - 2 - code
        return self._top - depth * Fraction(self.grid_step)

    def estimate_mean(self, codes: npt.ArrayLike, *, confidence: float = 0.95) -> Estimate:
        """AVG* (Eq. (15)) of codes with its standard error and two intervals.

        The sums are exact integers over codes; the mean is formed in rational arithmetic
        and rounded once. ``std_error`` uses the sample variance (for a single code, the
        worst-case variance bound).
        """
        valid = self._valid_codes(codes).ravel()
        k = self.payload_bits
        return self.estimate_from_sums(
            int(valid.size),
            exact_sum(valid, k),
            exact_sum_squares(valid, k),
            confidence=confidence,
        )

    def estimate_from_sums(
        self, n: int, sum_codes: int, sum_squares: int, *, confidence: float = 0.95
    ) -> Estimate:
        """The same estimate from exact sums of codes and of squared codes (e.g. a store's).

        Raises CodeError when the sums cannot come from n valid codes.
        """
        level = check_confidence(confidence)
        if n < 1:
            raise CodeError("cannot estimate a mean from zero codes")
        if not (
            n * self.code_min <= sum_codes <= n * self.code_max
            and sum_squares >= 0
            and sum_codes * sum_codes <= n * sum_squares
        ):
            raise CodeError(
                f"sums (n={n}, sum={sum_codes}, squares={sum_squares}) are not "
                "those of valid codes of this stream"
            )
        top = (1 << self.payload_bits) - 2
        sum_q = n * top - sum_codes
        sum_q2 = n * top * top - 2 * top * sum_codes + sum_squares
        step = Fraction(self.grid_step)
        mean = float(self._top - step * Fraction(sum_q, n))
        if n > 1:
            sample_var = float(step * step * Fraction(n * sum_q2 - sum_q * sum_q, n * (n - 1)))
        else:
            sample_var = self.variance_bound()
        std_error = math.sqrt(sample_var / n)
        z = normal_quantile(level)
        half = bernstein_half_width(
            level, n=n, variance=self.variance_bound(), bound=self.error_bound()
        )
        return Estimate(
            mean=mean,
            n=n,
            std_error=std_error,
            ci=(mean - z * std_error, mean + z * std_error),
            guaranteed=(mean - half, mean + half),
            in_range=self.lower <= mean <= self.upper,
            confidence=level,
        )

    def absolute_bound(self, lam: float, *, n: int) -> float:
        """Upper bound on P(|AVG* - AVG| >= lam) for n readings (Theorem 3, two-sided)."""
        return bernstein_tail(lam, n=n, variance=self.variance_bound(), bound=self.error_bound())

    def relative_bound(self, lam: float, *, n: int, average: float) -> float:
        """Upper bound on P(|AVG* - AVG| / |AVG| >= lam) (Theorem 4, derived from Theorem 3)."""
        avg = check_real("average", average)
        if avg == 0:
            raise ParameterError("the relative error is undefined for an average of 0")
        return self.absolute_bound(lam * abs(avg), n=n)
