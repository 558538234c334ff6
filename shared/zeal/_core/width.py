"""The code width: how many low bits of a privatized float64 are sent (Theorem 6, Eq. (28)),
and the binade exponent E_U* that gives it; and the range's terms C and p (Eqs. (9),
(10)), refused when float64 cannot hold them."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Final

from zeal._core.exact import ceil_log2
from zeal._core.grid import GridSampler, build_grid_sampler
from zeal.errors import ParameterError
from zeal.protocol import EXPONENT, PAYLOAD_BITS

__all__ = [
    "DEFAULT_GRID_VARIANCE_SHARE",
    "bits_at",
    "default_bits",
    "exact_grid",
    "exponent_for_bits",
    "smallest_exponent",
]

#: The default width keeps the grid's extra variance (at most D**2/4) within this share of
#: the mechanism's smallest variance (Theorem 2 at z = 0).
DEFAULT_GRID_VARIANCE_SHARE: Final = 0.01


def bits_at(c: float, exponent: int) -> int:
    """64 - gamma_min at an exponent for output half-range C (Theorem 6, Eq. (28)), exactly."""
    step = Fraction(2) ** (exponent - 52)
    gamma = 12 + exponent - ceil_log2(2 * Fraction(c) + 3 * step)
    return 64 - gamma


def smallest_exponent(c: float, e_enc: int) -> int:
    """The smallest exponent at or above E_enc (Eq. (21)) whose code fits in 52 bits."""
    e = max(e_enc, EXPONENT[0])
    while bits_at(c, e) > PAYLOAD_BITS[1]:
        e += 1
    if e > EXPONENT[1]:
        raise ParameterError("the output range does not fit in float64")
    return e


def exponent_for_bits(c: float, bits: int, e_min: int) -> int:
    """Smallest exponent whose code needs at most `bits` bits (finest grid for the width)."""
    e = e_min
    while bits_at(c, e) > bits:
        e += 1
    return e


def default_bits(c: float, epsilon: float, half_width: float, e_min: int) -> int:
    """The narrowest width whose grid step D keeps D**2/4 within DEFAULT_GRID_VARIANCE_SHARE
    of the mechanism's smallest variance (Theorem 2, Eq. (14), at z = 0)."""
    s = math.exp(epsilon / 2)
    # sqrt of Eq. (14) at z = 0, formed without squaring h (which could overflow)
    smallest_sd = half_width * math.sqrt((s + 3) / 3) / (s - 1)
    max_step = 2 * math.sqrt(DEFAULT_GRID_VARIANCE_SHARE) * smallest_sd
    _mantissa, exp2 = math.frexp(max_step)  # max_step = mantissa * 2**exp2, mantissa in [.5,1)
    return bits_at(c, max(e_min, exp2 - 1 + 52))


def exact_grid(
    *,
    c: float,
    e_enc: int,
    bits: int,
    exponent: int,
    lower: float,
    upper: float,
    top: Fraction,
    epsilon: float,
) -> GridSampler:
    """The grid sampler at `bits` payload bits (exponent `exponent`), or a ParameterError
    that names the widest width the grid can realize exactly for these parameters."""

    def build(k: int, e: int) -> GridSampler:
        return build_grid_sampler(
            payload_bits=k,
            lower=lower,
            upper=upper,
            top_value=top,
            grid_step=math.ldexp(1.0, e - 52),
            epsilon=epsilon,
        )

    try:
        return build(bits, exponent)
    except ParameterError as exc:
        supported = None
        for k in range(bits - 1, PAYLOAD_BITS[0] - 1, -1):
            e = exponent_for_bits(c, k, smallest_exponent(c, e_enc))
            try:
                build(bits_at(c, e), e)
            except ParameterError:
                continue
            supported = k
            break
        limit = "no payload width" if supported is None else f"at most {supported} payload bits"
        raise ParameterError(
            f"payload_bits={bits} (exponent={exponent}) cannot be realized exactly by "
            f"the grid sampler for lower={lower!r}, upper={upper!r}, "
            f"epsilon={epsilon!r}: it supports {limit} here ({exc})"
        ) from exc
