"""Exact arithmetic helpers: powers of two, e^eps comparisons, integer sums of codes."""

from __future__ import annotations

import decimal
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["ceil_log2", "exact_sum", "exact_sum_squares", "floor_times_exp"]

_U64 = npt.NDArray[np.uint64]


def ceil_log2(value: Fraction | int | float) -> int:
    """Smallest integer j with 2**j >= value, computed exactly (value > 0)."""
    v = Fraction(value)
    if v <= 0:
        raise ValueError(f"ceil_log2 needs a positive value, got {value!r}")
    j = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** j < v:
        j += 1
    while Fraction(2) ** (j - 1) >= v:
        j -= 1
    return j


def floor_times_exp(n: int, epsilon: float) -> int:
    """floor(n * e**epsilon) for the exact real value of the float epsilon.

    Decimal's exp is correctly rounded; at 90 digits the product of an integer below 2**64
    and e**epsilon (irrational for epsilon != 0) is resolved far beyond the integer part.
    """
    with decimal.localcontext() as ctx:
        ctx.prec = 90
        product = decimal.Decimal(n) * decimal.Decimal(epsilon).exp()
        result = int(product.to_integral_value(rounding=decimal.ROUND_FLOOR))
        margin = decimal.Decimal(10) ** -60 * product
        if not (result + margin <= product and product < result + 1 - margin):
            raise ArithmeticError("e**epsilon times n is too close to an integer to decide")
    return result


def exact_sum(codes: _U64, bits: int) -> int:
    """Exact integer sum of codes below 2**bits (no float, no overflow)."""
    if codes.size == 0:
        return 0
    chunk = max(1, 1 << max(0, 63 - bits))
    if codes.size <= chunk:
        return int(codes.sum(dtype=np.uint64))
    return sum(int(codes[i : i + chunk].sum(dtype=np.uint64)) for i in range(0, codes.size, chunk))


def exact_sum_squares(codes: _U64, bits: int) -> int:
    """Exact integer sum of squared codes below 2**bits.

    Small codes are squared directly; wide ones are split into three 18-bit limbs so that
    every partial product and chunk sum stays below 2**63.
    """
    if codes.size == 0:
        return 0
    if 2 * bits <= 62:
        return exact_sum(codes * codes, 2 * bits)
    mask = np.uint64((1 << 18) - 1)
    d = codes & mask
    b = (codes >> np.uint64(18)) & mask
    a = codes >> np.uint64(36)
    s = {
        name: exact_sum(x * y, 36)
        for name, x, y in (
            ("aa", a, a),
            ("ab", a, b),
            ("bb", b, b),
            ("ad", a, d),
            ("bd", b, d),
            ("dd", d, d),
        )
    }
    return (
        (s["aa"] << 72)
        + (s["ab"] << 55)
        + ((s["bb"] + 2 * s["ad"]) << 36)
        + (s["bd"] << 19)
        + s["dd"]
    )
