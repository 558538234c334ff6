"""The paper's float64 inverse-CDF sampler, kept for comparison (``sampler="paper"``).

It draws ``u = j / 2**53`` with ``j`` uniform on ``[0, 2**53)`` and evaluates the inverse CDF
of the density of Eq. (7) in float64, with Abar from Theorem 5 (Eq. (22)) already added, as
the paper's Section "Floating point vulnerability" describes. Its outputs are rounded by the
float arithmetic, which makes it (docs/mechanism.md; measured by the audit and the tests)
neither hole-free nor unbiased at large Abar. Do not use it for real data. At the smallest
exponents its outputs can even leave the binade; they are clamped to the k-bit block (see
``_inverse``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zeal._core.randomness import Randomness, random_words

__all__ = ["UNIFORM_BITS", "PaperSampler"]

UNIFORM_BITS = 53
_SCALE = 2.0**-UNIFORM_BITS

_F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PaperSampler:
    """Float constants of the paper's sampler, all computed in float64 as the paper would."""

    ebar: float
    half_width: float  # h
    c: float
    p: float
    p_tail: float  # p / e**eps
    abar: float
    block_low: float  # the smallest and largest floats a k-bit code can carry
    block_high: float

    @classmethod
    def build(
        cls,
        *,
        ebar: float,
        half_width: float,
        c: float,
        p: float,
        epsilon: float,
        exponent: int,
        payload_bits: int,
    ) -> PaperSampler:
        ulp = 2.0 ** (exponent - 52)
        abar = 2.0 ** (exponent + 1) - 2 * ulp - ebar - c  # Eq. (22), float arithmetic
        return cls(
            ebar=ebar,
            half_width=half_width,
            c=c,
            p=p,
            p_tail=p / float(np.exp(epsilon)),
            abar=abar,
            block_low=2.0 ** (exponent + 1) - ulp * 2.0**payload_bits,
            block_high=2.0 ** (exponent + 1) - ulp,
        )

    def pieces(self, x: _F64) -> tuple[tuple[_F64, _F64, float], ...]:
        """Per piece: (start value, cumulative mass before it, density) for readings x.

        Eq. (11) and (12) for L(x) and R(x), evaluated left to right in float64.
        """
        h, c = self.half_width, self.c
        x_min = np.full_like(x, self.ebar - c + self.abar)
        left = (c + h) / 2 * ((x - self.ebar) / h) - (c - h) / 2 + self.ebar + self.abar
        right = left + c - h
        m1 = (left - x_min) * self.p_tail
        m12 = m1 + (right - left) * self.p
        return (
            (x_min, np.zeros_like(x), self.p_tail),
            (left, m1, self.p),
            (right, m12, self.p_tail),
        )

    def piece_starts(self, x: float) -> tuple[int, int]:
        """First uniform integer j of the band piece and of the right tail, for one reading."""
        pieces = self.pieces(np.array([x]))
        top = 1 << UNIFORM_BITS
        return tuple(  # type: ignore[return-value]
            min(top, int(np.ceil(float(pieces[i][1][0]) * 2.0**UNIFORM_BITS))) for i in (1, 2)
        )

    def evaluate(self, x: float, piece: int, j: npt.NDArray[np.int64]) -> _F64:
        """The inverse CDF of one piece at uniform integers j (monotone in j), one reading."""
        start, before, density = self.pieces(np.array([x]))[piece]
        return self._inverse(start[0], before[0], density, j.astype(np.float64) * _SCALE)

    def _inverse(
        self, start: _F64 | np.float64, before: _F64 | np.float64, density: float, u: _F64
    ) -> _F64:
        """start + (u - before) / density, clamped to the k-bit block.

        At the smallest exponents the float rounding can leave the binade (u near 1 gives
        2**(Eu+1) itself, against Theorem 5); such values cannot be sent as a code, so they
        are clamped to the block, as any k-bit implementation of this sampler must.
        """
        result: _F64 = np.clip(start + (u - before) / density, self.block_low, self.block_high)
        return result

    def sample_values(self, readings: _F64, rng: Randomness) -> _F64:
        """Privatized float64 values x* for clipped readings (1-D)."""
        (s0, b0, d0), (s1, b1, d1), (s2, b2, d2) = self.pieces(readings)
        j = random_words(rng, readings.size) >> np.uint64(64 - UNIFORM_BITS)
        u = j.astype(np.float64) * _SCALE
        values: _F64 = np.where(
            u < b1,
            self._inverse(s0, b0, d0, u),
            np.where(u < b2, self._inverse(s1, b1, d1, u), self._inverse(s2, b2, d2, u)),
        )
        return values
