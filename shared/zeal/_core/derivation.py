"""What a stream's range, epsilon and width choice derive (paper 001): one pure function,
:func:`derive`, returning the frozen :class:`Derived` that ``Zeal`` carries."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from zeal._core.exact import ceil_log2
from zeal._core.grid import GridSampler
from zeal._core.paper import PaperSampler
from zeal._core.width import (
    bits_at,
    default_bits,
    exact_grid,
    exponent_for_bits,
    smallest_exponent,
)
from zeal.errors import ParameterError, ZealWarning
from zeal.estimate import check_integer, check_real
from zeal.protocol import EPSILON_MAX, EXPONENT, PAYLOAD_BITS

__all__ = ["MAX_EPSILON", "SAMPLERS", "Derived", "derive"]

SAMPLERS: Final = ("grid", "paper")
MAX_EPSILON: Final = EPSILON_MAX
_MIN_BITS, _MAX_BITS = PAYLOAD_BITS
_MAX_EXPONENT = EXPONENT[1]


@dataclass(frozen=True, slots=True)
class Derived:
    """The mechanism's values for one stream (``Zeal``'s docstring names each)."""

    lower: float
    upper: float
    epsilon: float
    sampler: str
    #: Half the range, its midpoint (Ebar), C of Eq. (10) and the density p of Eq. (9).
    half_width: float
    ebar: float
    C: float
    p: float
    #: E_enc (Theorem 5, Eq. (21)) and E_vul (Theorem 7, Eq. (31)).
    e_enc: int
    e_vul: int
    #: The code: E_U*, its width, the bits every output shares, the grid's step (ulp(2**E)).
    exponent: int
    payload_bits: int
    shared_bits: int
    grid_step: float
    #: Abar of Eq. (22) as a float64 (for display; the sampler and decoder use ``top``).
    abar: float
    #: What the decoder subtracts, exactly: Ebar + C for the grid sampler, and for the
    #: paper's sampler what its aggregator does (Eq. (15)).
    top: Fraction
    #: The shared top bits of every output (``shared_bits`` of them, then zeros).
    prefix: int
    grid: GridSampler | None
    paper: PaperSampler | None
    #: ln(w_hi / w_lo) for the grid sampler; None for the paper's (only an audit tells).
    realized_epsilon: float | None
    code_min: int
    code_max: int


def derive(
    lower: float,
    upper: float,
    epsilon: float,
    *,
    payload_bits: int | None = None,
    exponent: int | None = None,
    sampler: str = "grid",
) -> Derived:
    """The values of paper 001 for these parameters, checked (ParameterError), with the code
    width ``payload_bits`` or ``exponent`` choose, else the narrowest whose grid variance
    stays within 1 % of the mechanism's smallest. Raises OverflowError or ZeroDivisionError
    where float64 cannot hold them (``Zeal`` says which parameters)."""
    lo = check_real("lower", lower)
    hi = check_real("upper", upper)
    eps = check_real("epsilon", epsilon)
    if not lo < hi:
        raise ParameterError(f"lower must be below upper, got lower={lower!r}, upper={upper!r}")
    if not 0.0 < eps <= MAX_EPSILON:
        raise ParameterError(f"epsilon must be in (0, {MAX_EPSILON}], got {epsilon!r}")
    if sampler not in SAMPLERS:
        raise ParameterError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if payload_bits is not None and exponent is not None:
        raise ParameterError("give payload_bits or exponent, not both")
    half, c, p = range_terms(lower, upper, epsilon)
    ebar = lo + half
    e_enc = ceil_log2(2 * c)  # Eq. (21)
    e_vul = max(ceil_log2(math.exp(eps) / p) - 1, e_enc)  # Eq. (31)
    chosen = _exponent(c, e_enc, eps, half, payload_bits=payload_bits, exponent=exponent)
    k = bits_at(c, chosen)
    step = math.ldexp(1.0, chosen - 52)
    top = Fraction(ebar) + Fraction(c)
    abar = float(Fraction(2) ** (chosen + 1) - 2 * Fraction(step) - top)  # Eq. (22)
    prefix = ((1023 + chosen) << 52) | ((1 << 52) - (1 << k))
    grid: GridSampler | None = None
    paper: PaperSampler | None = None
    if sampler == "grid":
        grid = exact_grid(
            c=c, e_enc=e_enc, bits=k, exponent=chosen, lower=lo, upper=hi, top=top, epsilon=eps
        )
        q_min, q_max = grid.depth_range
        realized: float | None = math.log(grid.w_hi / grid.w_lo)
        code_min, code_max = (1 << k) - 2 - q_max, (1 << k) - 2 - q_min
    else:
        warnings.warn(
            "sampler='paper' is the paper's float64 inverse-CDF sampler, kept for "
            "comparison: it can leak more than epsilon and is biased at large Abar",
            ZealWarning,
            stacklevel=3,  # the caller of Zeal(...)
        )
        paper = PaperSampler.build(
            ebar=ebar, half_width=half, c=c, p=p, epsilon=eps, exponent=chosen, payload_bits=k
        )
        # The paper's aggregator subtracts the float Abar its sampler added (Eq. (15)).
        top = Fraction(2) ** (chosen + 1) - 2 * Fraction(step) - Fraction(paper.abar)
        realized, code_min, code_max = None, 0, (1 << k) - 1
    return Derived(
        lower=lo,
        upper=hi,
        epsilon=eps,
        sampler=sampler,
        half_width=half,
        ebar=ebar,
        C=c,
        p=p,
        e_enc=e_enc,
        e_vul=e_vul,
        exponent=chosen,
        payload_bits=k,
        shared_bits=64 - k,
        grid_step=step,
        abar=abar,
        top=top,
        prefix=prefix,
        grid=grid,
        paper=paper,
        realized_epsilon=realized,
        code_min=code_min,
        code_max=code_max,
    )


def _exponent(
    c: float,
    e_enc: int,
    epsilon: float,
    half: float,
    *,
    payload_bits: int | None,
    exponent: int | None,
) -> int:
    """E_U* as given, or for the width given, or for the default width."""
    e_min = smallest_exponent(c, e_enc)
    if exponent is not None:
        return check_integer("exponent", exponent, e_min, _MAX_EXPONENT)
    if payload_bits is not None:
        bits = check_integer("payload_bits", payload_bits, _MIN_BITS, _MAX_BITS)
        return exponent_for_bits(c, bits, e_min)
    return exponent_for_bits(c, default_bits(c, epsilon, half, e_min), e_min)


def range_terms(lower: float, upper: float, epsilon: float) -> tuple[float, float, float]:
    """The half range, C of Eq. (10) and the density p of Eq. (9), refused when float64
    cannot hold them (the messages show lower, upper and epsilon as the caller wrote them)."""
    lo, hi, eps = float(lower), float(upper), float(epsilon)
    half = (hi - lo) / 2
    if not math.isfinite(half):
        raise ParameterError(f"the range [{lower!r}, {upper!r}] is too wide for float64")
    if not half > 0:  # (upper - lower) / 2 rounds to 0
        raise ParameterError(f"the range [{lower!r}, {upper!r}] is too narrow for float64")
    s = math.exp(eps / 2)
    c = half * (s + 1) / (s - 1)  # Eq. (10)
    p = (math.exp(eps) - s) / (2 * half * (s + 1))  # Eq. (9)
    if not (math.isfinite(2 * c) and math.isfinite(math.exp(eps) / p) and p > 0):
        raise ParameterError(
            f"the range [{lower!r}, {upper!r}] at epsilon={epsilon!r} gives an output range "
            f"(C = {c!r}) that does not fit in float64"
        )
    if not (math.isfinite(p) and c > 0 and math.exp(eps) / p > 0):  # a subnormal range
        raise ParameterError(
            f"the range [{lower!r}, {upper!r}] at epsilon={epsilon!r} is too narrow for "
            f"float64 (the density p = {p!r} of Eq. (9) overflows)"
        )
    return half, c, p
