"""Exact-arithmetic helpers against Python integers and rationals."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zeal._core.exact import ceil_log2, exact_sum, exact_sum_squares, floor_times_exp


@given(st.fractions(min_value=Fraction(1, 10**30), max_value=10**30))
def test_ceil_log2_is_exact(value: Fraction) -> None:
    """2**(j-1) < value <= 2**j for j = ceil_log2(value)."""
    j = ceil_log2(value)
    assert Fraction(2) ** (j - 1) < value <= Fraction(2) ** j


def test_ceil_log2_at_powers_of_two() -> None:
    """Exact powers of two give their own exponent."""
    assert [ceil_log2(2.0**e) for e in (-3, 0, 8)] == [-3, 0, 8]
    assert ceil_log2(246.61248517044527) == 8


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=1, max_value=52),
    st.integers(min_value=0, max_value=3000),
    st.integers(0, 2**32),
)
def test_sums_of_codes_are_exact(bits: int, n: int, seed: int) -> None:
    """exact_sum and exact_sum_squares agree with Python integer arithmetic."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, size=n, dtype=np.uint64)
    as_ints = [int(c) for c in codes]
    assert exact_sum(codes, bits) == sum(as_ints)
    assert exact_sum_squares(codes, bits) == sum(c * c for c in as_ints)


def test_floor_times_exp_brackets_the_product() -> None:
    """floor(n e**eps) is the integer part: checked against a high-precision rational bound."""
    assert floor_times_exp(10**6, 1.0) == 2718281
    assert floor_times_exp(1, 8.0) == 2980
