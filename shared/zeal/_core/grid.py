"""The exact grid sampler: Zeal's piecewise mechanism realized on the code grid with integers.

The design (docs/mechanism.md, "The grid sampler") asks for outputs on the grid
``y_m = 2**Eu + m*D`` (``D`` the ulp of ``2**Eu``) with probabilities that are known
exactly, unbiased at every code width, and provably within the budget. This module builds
it as follows.

*Frame.* Outputs are measured as a *depth* ``q`` below the top grid point
``T = 2**(Eu+1) - 2D``, which stands for ``Ebar + C`` (the top of the output range, paper
Eq. (8) with Abar from Theorem 5, Eq. (22)). A depth decodes to ``x_hat = Ebar + C - q*D``
and is sent as the code ``2**k - 2 - q`` (the low ``k`` mantissa bits of the float).

*Cells.* The continuous mechanism lives on ``cells`` fine cells of width ``D / 2**F``
starting ``top`` cells above ``T``. Like the paper's density (Eq. (7)) it has two levels:
integer weight ``w_hi`` on a band of ``band`` consecutive cells and ``w_lo`` on every other
cell, so each cell has probability ``w_hi/Z`` or ``w_lo/Z`` with
``Z = w_lo*cells + (w_hi - w_lo)*band`` for *every* input. The weights satisfy
``w_hi/w_lo <= e**eps`` exactly (checked with a correctly rounded exp); the range and band
widths follow the paper's ``2C`` and ``C - h`` for the ratio actually used.

*Unbiased by construction.* The mean depth is affine in the band start ``S``
(Theorem 1's argument, Eq. (13)); solving for the ``S`` whose mean is exactly the input's
depth gives a real start. It is held in fixed point with ``G`` fraction bits and rounded to
an integer cell at random with the matching probability, so the mean stays exact.

*Onto the grid.* The chosen cell's centre is rounded to a neighbouring grid point with
unbiased randomized rounding, done with ``F + 1`` random bits, so ``E[q]`` equals the mean
cell-centre depth.

*Privacy.* Cell probabilities lie in ``{w_lo/Z, w_hi/Z}`` whatever the input and the band
start; the rounding kernel does not depend on the input. Hence for every output and any two
inputs the probability ratio is at most ``w_hi/w_lo``: the realized loss
``ln(w_hi/w_lo) <= eps``. No output is reachable from one input and not another.

All sampling is integer arithmetic on random 64-bit words (rejection for the uniform choice
of a weight unit), so the probabilities the code realizes are exactly the ones
:func:`pmf_runs` computes; the privacy audit uses those.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from zeal._core.exact import floor_times_exp
from zeal._core.randomness import Randomness, random_words, uniform_below
from zeal.errors import ParameterError

__all__ = ["GridSampler", "build_grid_sampler"]

#: The range holds about 2**CELL_BITS cells whatever the width, so cell edges sit within a
#: few parts per 10**8 of the continuous mechanism's breakpoints.
CELL_BITS = 26
_MAX_F = 40
_Z_LIMIT = 1 << 63

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GridSampler:
    """Integer tables of the exact grid sampler for one set of stream parameters."""

    payload_bits: int
    cell_bits: int  # F: 2**F cells per grid step
    frac_bits: int  # G: fixed-point fraction bits of the band start
    w_lo: int
    w_hi: int
    cells: int
    band: int
    top: int  # the first cell starts `top` cells above depth 0
    upper: float
    start_at_upper: float  # band start (cells) for the reading `upper`
    slope: float  # band-start cells per unit of (upper - x)

    @property
    def total(self) -> int:
        """Z, the total weight; a cell has probability w/Z."""
        return self.w_lo * self.cells + (self.w_hi - self.w_lo) * self.band

    @property
    def ratio(self) -> Fraction:
        """w_hi / w_lo, the realized privacy ratio (at most e**epsilon)."""
        return Fraction(self.w_hi, self.w_lo)

    @property
    def max_start(self) -> int:
        """Largest band start, in cells."""
        return self.cells - self.band

    @property
    def depth_range(self) -> tuple[int, int]:
        """Smallest and largest output depth q the sampler can produce."""
        a = 1 << (self.cell_bits + 1)
        first_centre = 1 - 2 * self.top
        last_centre = 2 * (self.cells - 1 - self.top) + 1
        return first_centre // a, -(-last_centre // a)

    # -- sampling ---------------------------------------------------------------------------

    def fixed_starts(self, readings: _F64) -> _I64:
        """Band starts in fixed point (G fraction bits) for clipped readings.

        This is the only float arithmetic in the sampler; the audit calls it too.
        """
        starts = self.start_at_upper + self.slope * (self.upper - readings)
        scaled = np.floor(starts * float(1 << self.frac_bits))
        limit = float(self.max_start << self.frac_bits)
        return np.clip(scaled, 0.0, limit).astype(np.int64)

    def sample(self, readings: _F64, rng: Randomness) -> npt.NDArray[np.uint64]:
        """Codes for clipped, finite readings (1-D float64)."""
        n = readings.size
        g, f = self.frac_bits, self.cell_bits
        t = self.fixed_starts(readings)
        words = random_words(rng, n).view(np.int64) & np.int64((1 << 63) - 1)
        frac_mask = np.int64((1 << g) - 1)
        start = (t >> g) + ((words & frac_mask) < (t & frac_mask))
        unit = uniform_below(rng, self.total, n)
        left_end = start * self.w_lo
        band_end = left_end + self.w_hi * self.band
        cell = np.where(
            unit < left_end,
            unit // self.w_lo,
            np.where(
                unit < band_end,
                start + (unit - left_end) // self.w_hi,
                start + self.band + (unit - band_end) // self.w_lo,
            ),
        )
        a = 1 << (f + 1)
        round_bits = (words >> g) & np.int64(a - 1)
        # Depth of the cell centre is (2*(cell - top) + 1) / a grid steps; adding a uniform
        # integer in [0, a) and flooring rounds it up with probability equal to its fraction.
        depth = ((2 * (cell - self.top) + 1 + a + round_bits) >> (f + 1)) - 1
        codes: npt.NDArray[np.uint64] = ((1 << self.payload_bits) - 2 - depth).astype(np.uint64)
        return codes

    # -- exact distribution ----------------------------------------------------------------

    def tent_sum(self, q: int, first: int, stop: int) -> int:
        """Sum over cells in [first, stop) of their rounding weight onto depth q, times 2**(F+1).

        A cell whose centre lies at distance d grid steps from q moves there with probability
        max(0, 1 - d); in units of 2**-(F+1) that is max(0, a - |2c + beta|).
        """
        a = 1 << (self.cell_bits + 1)
        beta = 1 - 2 * self.top - q * a
        lo = max(first, (-a - beta) // 2 + 1)
        hi = min(stop, -((beta - a) // 2))
        mid = (-beta) // 2 + 1
        total = 0
        b = min(hi, mid)
        if b > lo:
            total += (b - lo) * (a + beta) + (lo + b - 1) * (b - lo)
        c = max(lo, mid)
        if hi > c:
            total += (hi - c) * (a - beta) - (c + hi - 1) * (hi - c)
        return total

    def weight(self, q: int, start: int) -> int:
        """P(depth q | band at `start`) times Z * 2**(F+1): an exact integer."""
        return self.w_lo * self.tent_sum(q, 0, self.cells) + (self.w_hi - self.w_lo) * (
            self.tent_sum(q, start, start + self.band)
        )

    def _special_depths(self, start: int) -> set[int]:
        """Depths near a boundary of the two weight levels; elsewhere the pmf is flat."""
        f = self.cell_bits
        q_min, q_max = self.depth_range
        out = {q_min, q_max}
        for boundary in (
            -self.top,
            start - self.top,
            start + self.band - self.top,
            self.cells - self.top,
        ):
            base = boundary >> f
            out.update(q for q in range(base - 1, base + 3) if q_min <= q <= q_max)
        return out

    def pmf_runs(self, fixed_start: int) -> tuple[list[tuple[int, int, int]], int]:
        """Exact output distribution for a fixed-point band start.

        Returns ``(runs, denominator)``: runs ``(q_first, q_stop, numerator)`` cover every
        reachable depth in order, each depth in a run having probability
        ``numerator / denominator``.
        """
        g = self.frac_bits
        s0, phi = fixed_start >> g, fixed_start & ((1 << g) - 1)
        starts = [(s0, (1 << g) - phi)] + ([(s0 + 1, phi)] if phi else [])
        special: set[int] = set()
        for s, _ in starts:
            special |= self._special_depths(s)

        def numerator(q: int) -> int:
            return sum(share * self.weight(q, s) for s, share in starts)

        _q_min, q_max = self.depth_range
        runs: list[tuple[int, int, int]] = []
        ordered = sorted(special)
        for i, q in enumerate(ordered):
            runs.append((q, q + 1, numerator(q)))
            following = ordered[i + 1] if i + 1 < len(ordered) else q_max + 1
            if following > q + 1:
                value = numerator(q + 1)
                if numerator(following - 1) != value:
                    raise AssertionError("pmf is not flat between boundaries")
                runs.append((q + 1, following, value))
        return runs, (1 << g) * self.total * (1 << (self.cell_bits + 1))

    def cell_variance_bound(self) -> Fraction:
        """Upper bound on Var[q] (grid steps squared) over all inputs (computed once: every
        estimate asks for it)."""
        return self._cell_variance_bound

    @functools.cached_property
    def _cell_variance_bound(self) -> Fraction:
        """Upper bound on Var[q] (grid steps squared) over all inputs.

        Law of total variance: Var[q] = Var[cell centre] + E[rounding variance]. The first is
        convex in the band start (its S**2 coefficient is P(band)(1 - P(band)) >= 0), so its
        maximum over [0, max_start] is at an end; mixing two adjacent starts adds at most a
        quarter of the squared step of the mean. Rounding adds at most 1/4.
        """
        z = self.total
        diff = self.w_hi - self.w_lo

        def sum_sq(first: int, stop: int) -> Fraction:  # sum of (c - top + 1/2)**2
            def s2(n: int) -> Fraction:  # sum_{c<n} (c + h)**2 with h = 1/2 - top
                h = Fraction(1, 2) - self.top
                return (
                    Fraction(n * (n - 1) * (2 * n - 1), 6)
                    + 2 * h * Fraction(n * (n - 1), 2)
                    + n * h * h
                )

            return s2(stop) - s2(first)

        def depth_sum(first: int, stop: int) -> Fraction:  # sum of (c - top + 1/2)
            return Fraction((stop - first) * (first + stop - 1), 2) + (stop - first) * (
                Fraction(1, 2) - self.top
            )

        def variance(s: int) -> Fraction:
            m = (self.w_lo * depth_sum(0, self.cells) + diff * depth_sum(s, s + self.band)) / z
            m2 = (self.w_lo * sum_sq(0, self.cells) + diff * sum_sq(s, s + self.band)) / z
            return m2 - m * m

        step = Fraction(diff * self.band, z)
        cells_var = max(variance(0), variance(self.max_start)) + step * step / 4
        scale = Fraction(1, 1 << (2 * self.cell_bits))
        return cells_var * scale + Fraction(1, 4)


def build_grid_sampler(
    *,
    payload_bits: int,
    lower: float,
    upper: float,
    top_value: Fraction,
    grid_step: float,
    epsilon: float,
) -> GridSampler:
    """Choose integer tables for the grid sampler, or raise ParameterError.

    ``top_value`` is Ebar + C (the value of depth 0); the output depths must stay within the
    k-bit block, i.e. in [-1, 2**k - 2] grid steps (Theorem 6 leaves that room). Finer cells
    are tried when the coarser ones leave too little room.
    """
    spread = float(2 * top_value - Fraction(lower) - Fraction(upper)) / grid_step  # 2C/D
    first = max(1, CELL_BITS - max(0, math.floor(math.log2(max(spread, 1e-300)))))
    if first > _MAX_F:
        raise ParameterError(
            f"grid step {grid_step!r} is more than 2**{_MAX_F - CELL_BITS} times the output "
            "range; choose a smaller exponent (more payload bits change nothing here)"
        )
    for cell_bits in range(first, min(first + 12, _MAX_F) + 1):
        tables = _tables(
            payload_bits,
            cell_bits,
            lower=lower,
            upper=upper,
            top_value=top_value,
            grid_step=grid_step,
            epsilon=epsilon,
        )
        if tables is not None:
            return tables
    raise ParameterError(
        f"the exact grid sampler cannot fit epsilon={epsilon!r} on [{lower!r}, {upper!r}] "
        f"into {payload_bits} payload bits with 64-bit integer weights"
    )


def _tables(
    k: int,
    f: int,
    *,
    lower: float,
    upper: float,
    top_value: Fraction,
    grid_step: float,
    epsilon: float,
) -> GridSampler | None:
    unit = Fraction(grid_step) / (1 << f)
    depth_lo = (top_value - Fraction(upper)) / unit  # depth of the mean for `upper`
    depth_hi = (top_value - Fraction(lower)) / unit
    top_max = 1 << f
    bottom_max = ((1 << k) - 2) << f
    w_hi_cap = (_Z_LIMIT - 1) // (top_max + bottom_max)
    w_lo = w_hi_cap * 10**6 // (floor_times_exp(10**6, epsilon) + 1)
    if w_lo < 1:
        return None  # e**epsilon times the cells does not fit in 63 bits
    w_hi = floor_times_exp(w_lo, epsilon)
    if w_hi <= w_lo:
        return None  # epsilon too small for the weight resolution

    root = math.sqrt(w_hi / w_lo)
    half = float(depth_hi - depth_lo) / 2
    centre = float(depth_hi + depth_lo) / 2
    # The mean's reach is cells (root-1)/(root+1) at the best band width (paper's C - h for
    # this ratio); one extra cell of reach absorbs the half-cell misalignment of `top`.
    min_cells = math.ceil((2 * half + 1) * (root + 1) / (root - 1))
    diff = w_hi - w_lo
    for cells in range(min_cells, min_cells + 4):
        best_band = round(cells / (root + 1))
        for band in (best_band, best_band + 1, best_band - 1):
            if not 1 <= band < cells:
                continue
            z = w_lo * cells + diff * band
            if z >= _Z_LIMIT:
                continue
            ideal_top = cells / 2 - centre
            for top in sorted({math.floor(ideal_top), math.ceil(ideal_top)}):
                if not (0 <= top <= top_max and cells - top <= bottom_max):
                    continue
                mean_at_0 = -top + Fraction(w_lo * cells * cells + diff * band * band, 2 * z)
                mean_at_end = mean_at_0 + Fraction(diff * band * (cells - band), z)
                if mean_at_0 > depth_lo or mean_at_end < depth_hi:
                    continue
                per_cell = Fraction(z, diff * band)
                return GridSampler(
                    payload_bits=k,
                    cell_bits=f,
                    frac_bits=min(40, 61 - cells.bit_length(), 63 - (f + 1)),
                    w_lo=w_lo,
                    w_hi=w_hi,
                    cells=cells,
                    band=band,
                    top=top,
                    upper=float(upper),
                    start_at_upper=float((depth_lo - mean_at_0) * per_cell),
                    slope=float(per_cell / unit),
                )
    return None
