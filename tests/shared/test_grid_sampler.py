"""The grid sampler's exact tables: tent sums, distributions and audit shortcuts vs brute force."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from zeal import Zeal
from zeal._core.grid import GridSampler
from zeal._core.privacy_audit import output_extremes

# A deliberately tiny sampler (4 cells per grid step, 4-bit codes) small enough to enumerate.
TINY = GridSampler(
    payload_bits=4,
    cell_bits=2,
    frac_bits=8,
    w_lo=3,
    w_hi=7,
    cells=41,
    band=13,
    top=3,
    upper=1.0,
    start_at_upper=0.0,
    slope=1.0,
)


def brute_kernel(grid: GridSampler, cell: int, q: int) -> Fraction:
    """Probability that unbiased rounding moves the cell's centre to depth q."""
    centre = Fraction(2 * (cell - grid.top) + 1, 1 << (grid.cell_bits + 1))
    return max(Fraction(0), 1 - abs(centre - q))


def brute_pmf(grid: GridSampler, start: int) -> dict[int, Fraction]:
    pmf: dict[int, Fraction] = {}
    for cell in range(grid.cells):
        w = grid.w_hi if start <= cell < start + grid.band else grid.w_lo
        for q in range(-3, 20):
            k = brute_kernel(grid, cell, q)
            if k:
                pmf[q] = pmf.get(q, Fraction(0)) + Fraction(w, grid.total) * k
    return pmf


def test_tent_sum_matches_brute_force() -> None:
    """The closed-form tent sum equals the sum of rounding weights over any cell range."""
    a = 1 << (TINY.cell_bits + 1)
    for q in range(-2, 14):
        for first in range(0, TINY.cells, 3):
            for stop in range(first, TINY.cells + 1, 4):
                expected = sum(brute_kernel(TINY, c, q) for c in range(first, stop)) * a
                assert TINY.tent_sum(q, first, stop) == expected


def test_pmf_runs_equal_the_enumerated_distribution() -> None:
    """pmf_runs reproduces the distribution built cell by cell, for every start and fraction."""
    g = TINY.frac_bits
    for start in range(TINY.max_start + 1):
        for phi in (0, 77):
            if phi and start == TINY.max_start:
                continue
            runs, den = TINY.pmf_runs((start << g) + phi)
            got = {q: Fraction(num, den) for first, stop, num in runs for q in range(first, stop)}
            lo, hi = brute_pmf(TINY, start), brute_pmf(TINY, start + (1 if phi else 0))
            share = Fraction(phi, 1 << g)
            expected = {
                q: (1 - share) * lo.get(q, 0) + share * hi.get(q, 0) for q in set(lo) | set(hi)
            }
            assert {q: p for q, p in got.items() if p} == {q: p for q, p in expected.items() if p}
            assert sum(got.values()) == 1


def test_audit_extremes_match_a_scan_over_every_band_start() -> None:
    """The audit's shortcut (peak and ends) finds the true max and min over all band starts."""
    for s_lo, s_hi in ((0, TINY.max_start), (5, 17), (9, 9)):
        for q in range(*TINY.depth_range):
            values = [TINY.weight(q, s) for s in range(s_lo, s_hi + 1)]
            assert output_extremes(TINY, q, s_lo, s_hi) == (max(values), min(values))


def test_depth_range_stays_inside_the_code_block() -> None:
    """Every reachable code fits the payload width: depths within [-1, 2**k - 2]."""
    for k in (2, 3, 6, 12, 30):
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
        assert 0 <= z.code_min <= z.code_max <= (1 << k) - 1


@pytest.mark.parametrize("k", [2, 3, 6, 20])
def test_weights_respect_the_budget_exactly(k: int) -> None:
    """w_hi / w_lo <= e**eps as exact rationals, and Z fits a signed 64-bit integer."""
    from decimal import Decimal, localcontext

    for eps in (0.1, 1.0, 8.0):
        grid = Zeal(lower=0, upper=1, epsilon=eps, payload_bits=k)._grid
        assert grid is not None
        with localcontext() as ctx:
            ctx.prec = 80
            assert Decimal(grid.w_hi) / Decimal(grid.w_lo) <= Decimal(eps).exp()
        assert grid.total < 2**63


def test_sampler_uses_the_secure_source_by_default() -> None:
    """Without an rng the codes differ run to run (os.urandom), with a seed they repeat."""
    z = Zeal(lower=0, upper=1, epsilon=1)
    x = np.full(1000, 0.5)
    assert not np.array_equal(z.perturb(x), z.perturb(x))
    a = z.perturb(x, rng=np.random.default_rng(3))
    b = z.perturb(x, rng=np.random.default_rng(3))
    assert np.array_equal(a, b)
