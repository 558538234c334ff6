"""Codes and floats: bit-exact reconstruction, decoding, and refusal of bad input."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeal import CodeError, ParameterError, ReadingError, Zeal, ZealWarning

Z6 = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6)


def test_outputs_share_sign_exponent_and_top_bits() -> None:
    """Every privatized float lies in [2**Eu, 2**(Eu+1)) and shares its top 64 - k bits."""
    for k in (2, 3, 6, 20):
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
        values = z.to_float64(z.perturb(np.linspace(20, 90, 5000), rng=np.random.default_rng(k)))
        assert np.all((values >= 2.0**z.exponent) & (values < 2.0 ** (z.exponent + 1)))
        bits = values.view(np.uint64) >> np.uint64(k)
        assert np.unique(bits).size == 1


def test_float_round_trip_is_bit_exact() -> None:
    """from_float64(to_float64(codes)) returns the codes; floats rebuild x* = x_hat + Abar."""
    codes = np.arange(Z6.code_min, Z6.code_max + 1, dtype=np.uint64)
    values = Z6.to_float64(codes)
    assert np.array_equal(Z6.from_float64(values), codes)
    abar = (
        Fraction(2) ** (Z6.exponent + 1)
        - 2 * Fraction(Z6.grid_step)
        - Fraction(Z6.ebar)
        - Fraction(Z6.C)
    )
    for code, value, estimate in zip(codes, values, Z6.decode(codes), strict=True):
        assert Fraction(float(value)) - abar == Fraction(float(estimate)) or math.isclose(
            float(Fraction(float(value)) - abar), float(estimate), rel_tol=0, abs_tol=1e-12
        ), code


def test_decode_avoids_cancellation() -> None:
    """Decoding at a large exponent is exact to float precision of the estimate itself."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=58)
    top = Fraction(z.ebar) + Fraction(z.C)
    for code in range(z.code_min, z.code_max + 1):
        exact = top - ((1 << z.payload_bits) - 2 - code) * Fraction(z.grid_step)
        assert float(z.decode([code])[0]) == pytest.approx(float(exact), abs=1e-13)


def test_out_of_range_readings_are_clipped() -> None:
    """Readings beyond the range perturb exactly like the range ends."""
    a = Z6.perturb([-1e9, 1e9], rng=np.random.default_rng(5))
    b = Z6.perturb([23.5, 83.9], rng=np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_perturb_keeps_the_shape() -> None:
    """Codes come back as uint64 in the readings' shape."""
    codes = Z6.perturb(np.full((3, 4), 50.0))
    assert codes.shape == (3, 4)
    assert codes.dtype == np.uint64


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_readings_raise_and_nothing_is_perturbed(bad: float) -> None:
    """NaN and infinities raise ReadingError naming the value and its index."""
    with pytest.raises(ReadingError, match=r"reading at index 1 is (nan|inf|-inf)"):
        Z6.perturb([50.0, bad, 60.0])


@pytest.mark.parametrize("bad", [["a", "b"], [1 + 2j], [None]])
def test_non_numeric_readings_raise(bad: list[object]) -> None:
    """Strings, complex numbers and objects are refused with ReadingError."""
    with pytest.raises(ReadingError, match="readings must be real numbers"):
        Z6.perturb(bad)


def test_codes_wider_than_the_payload_raise() -> None:
    """A code with more than payload_bits bits (or negative) raises CodeError naming the range."""
    for bad in ([64], [1 << 40], [-1]):
        with pytest.raises(CodeError, match=r"outside \[|must be >="):
            Z6.decode(bad)
    with pytest.raises(CodeError, match="codes must be integers"):
        Z6.decode([1.5])
    with pytest.raises(CodeError, match=r"code \d+ is outside \[31, 63\]"):
        Z6.estimate_mean([5])


def test_floats_off_the_grid_raise() -> None:
    """Floats that are not outputs of this stream raise CodeError naming the output range."""
    good = float(Z6.to_float64([40])[0])
    above_block = float(np.nextafter(Z6.to_float64([Z6.code_max])[0], math.inf))
    for bad in (50.0, above_block, math.nan, math.inf, good * 2, -good):
        with pytest.raises(CodeError, match="is not an output of this stream"):
            Z6.from_float64([bad])
    below_range = Z6.to_float64(np.array([Z6.code_min]))[0]
    with pytest.raises(CodeError, match=r"code 30 is outside \[31, 63\]"):
        Z6.from_float64([float(np.nextafter(below_range, 0))])
    with pytest.raises(CodeError, match="must be float64"):
        Z6.from_float64([1, 2])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-(2**70), max_value=2**70), min_size=1, max_size=20))
def test_garbage_codes_raise_or_decode_within_range(codes: list[int]) -> None:
    """Any integers either decode to values within the output range or raise CodeError."""
    try:
        array = np.array(codes)
    except OverflowError:
        return
    try:
        decoded = Z6.decode(array)
    except (CodeError, OverflowError):
        return
    assert np.all(decoded >= float(Z6.decode([Z6.code_min])[0]))
    assert np.all(decoded <= float(Z6.decode([Z6.code_max])[0]))


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_garbage_floats_raise_or_round_trip(value: float) -> None:
    """Any float either is a valid output (and round-trips) or raises CodeError."""
    try:
        code = Z6.from_float64(np.array([value]))
    except CodeError:
        return
    assert Z6.to_float64(code)[0] == value


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=-1e6, max_value=1e6) | st.floats(min_value=-1e300, max_value=1e300),
    st.floats(min_value=1e-3, max_value=1e4) | st.floats(min_value=1e-300, max_value=1e300),
    st.floats(min_value=0.05, max_value=10) | st.floats(min_value=1e-9, max_value=20),
    st.none() | st.integers(min_value=2, max_value=52),
)
def test_any_parameters_either_work_or_raise_a_parameter_error(
    lower: float, width: float, eps: float, bits: int | None
) -> None:
    """Random parameters give a working stream or a ParameterError, never anything else."""
    try:
        z = Zeal(lower=lower, upper=lower + width, epsilon=eps, payload_bits=bits)
    except ParameterError:
        return
    codes = z.perturb(
        np.linspace(lower - width, lower + 2 * width, 50), rng=np.random.default_rng(0)
    )
    assert int(codes.min()) >= z.code_min
    assert int(codes.max()) <= z.code_max
    assert z.audit(max_outputs=64).within_budget()


def test_paper_sampler_codes_decode_like_grid_codes() -> None:
    """The paper sampler's outputs are codes in the same k-bit block, decoded the same way."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=12, sampler="paper")
    codes = z.perturb(np.full(10**5, 50.0), rng=np.random.default_rng(9))
    assert abs(z.decode(codes).mean() - 50.0) < 5 * math.sqrt(z.variance(50.0) / 10**5)
