"""The exact distribution of one reading's codes under the grid sampler (from its integer
tables; see :mod:`zeal._core.grid`): what ``Zeal.output_distribution`` returns, and what tests
and the privacy audit compare samples and losses against."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from zeal._core.grid import GridSampler

__all__ = ["OutputDistribution"]


@dataclass(frozen=True)
class OutputDistribution:
    """Exact distribution of one reading's codes under the grid sampler.

    ``runs`` are ``(first_code, stop_code, numerator)``: every code in ``[first, stop)`` has
    probability ``numerator / denominator``. Between the few codes near a boundary of the
    two weight levels the distribution is flat, so a handful of runs cover any width.
    """

    runs: tuple[tuple[int, int, int], ...]
    denominator: int
    top_value: Fraction  # decoded value of code 2**k - 2 (depth 0)
    grid_step: Fraction
    payload_bits: int

    @classmethod
    def of(
        cls, grid: GridSampler, fixed_start: int, top_value: Fraction, grid_step: float
    ) -> OutputDistribution:
        depth_runs, denominator = grid.pmf_runs(fixed_start)
        top_code = (1 << grid.payload_bits) - 2
        runs = tuple(
            sorted(
                (top_code - (stop - 1), top_code - first + 1, num)
                for first, stop, num in depth_runs
            )
        )
        return cls(runs, denominator, top_value, Fraction(grid_step), grid.payload_bits)

    def _moment_sums(self) -> tuple[int, int, int]:
        """Sums over codes of P*den, P*den*q and P*den*q**2 (q the depth), exactly."""
        top_code = (1 << self.payload_bits) - 2

        def s1(n: int) -> int:
            return n * (n - 1) // 2

        def s2(n: int) -> int:
            return (n - 1) * n * (2 * n - 1) // 6

        mass = first_moment = second_moment = 0
        for first, stop, num in self.runs:
            q_lo, q_hi = top_code - (stop - 1), top_code - first + 1  # depths [q_lo, q_hi)
            mass += num * (q_hi - q_lo)
            first_moment += num * (s1(q_hi) - s1(q_lo))
            second_moment += num * (s2(q_hi) - s2(q_lo))
        return mass, first_moment, second_moment

    def total(self) -> Fraction:
        """Total probability (exactly 1 when the tables are right)."""
        return Fraction(self._moment_sums()[0], self.denominator)

    def mean(self) -> Fraction:
        """E[decode] as an exact rational."""
        _, m1, _ = self._moment_sums()
        return self.top_value - self.grid_step * Fraction(m1, self.denominator)

    def variance(self) -> Fraction:
        """Var[decode] as an exact rational."""
        _, m1, m2 = self._moment_sums()
        e1 = Fraction(m1, self.denominator)
        return self.grid_step**2 * (Fraction(m2, self.denominator) - e1 * e1)

    def codes(self) -> npt.NDArray[np.int64]:
        """All codes with positive probability, ascending (small widths only)."""
        return np.arange(self.runs[0][0], self.runs[-1][1], dtype=np.int64)

    def numerators(self) -> list[int]:
        """Probability numerators for :meth:`codes`, in order."""
        return [num for first, stop, num in self.runs for _ in range(first, stop)]

    def probabilities(self) -> npt.NDArray[np.float64]:
        """Probabilities for :meth:`codes` as floats (for tests and plots)."""
        return np.array([float(Fraction(n, self.denominator)) for n in self.numerators()])
