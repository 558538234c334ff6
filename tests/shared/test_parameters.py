"""Stream parameters: the paper's figures, width selection, validation, value semantics."""

from __future__ import annotations

import math
import pickle
import warnings

import pytest

from zeal import ParameterError, Zeal, ZealWarning


def test_paper_figures_humidity_range() -> None:
    """lower=23.5, upper=83.9, eps=1: C=123.31, e_enc=e_vul=8; at Eu=58, 61 shared bits."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=58)
    assert round(z.C, 2) == 123.31
    assert z.e_enc == 8
    assert z.e_vul == 8
    assert z.shared_bits == 61
    assert z.payload_bits == 3
    assert round(z.transmission_ratio, 3) == 0.047


def test_paper_figures_taxi_range() -> None:
    """lower=1, upper=120, eps=1: C=242.94 and e_enc=9."""
    z = Zeal(lower=1, upper=120, epsilon=1)
    assert round(z.C, 2) == 242.94
    assert z.e_enc == 9


def test_derived_values_follow_the_paper_formulas() -> None:
    """p, Abar and the grid step match Eq. (9), Eq. (22) and ulp(2**Eu)."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=40)
    s = math.exp(0.5)
    assert z.p == pytest.approx((math.e - s) / (2 * 30.2 * (s + 1)))
    assert z.grid_step == 2.0**-12
    assert z.abar == pytest.approx(2.0**41 - 2 * 2.0**-12 - 53.7 - z.C, rel=1e-15)


def test_payload_bits_picks_the_finest_exponent_of_that_width() -> None:
    """payload_bits=k gives exactly k bits at the smallest exponent that needs at most k."""
    for k in range(2, 25):
        z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=k)
        assert z.payload_bits == k
        if z.exponent > z.e_enc:
            finer = Zeal(lower=23.5, upper=83.9, epsilon=1, exponent=z.exponent - 1)
            assert finer.payload_bits > k


def test_default_width_is_the_fewest_bits_within_one_percent_variance() -> None:
    """Default width: D**2/4 within 1 % of the smallest variance; one bit less would not be."""
    for eps in (0.1, 1.0, 4.0):
        z = Zeal(lower=0, upper=110, epsilon=eps)
        smallest = z.mechanism_variance(z.ebar)
        assert z.grid_step**2 / 4 <= 0.01 * smallest
        narrower = Zeal(lower=0, upper=110, epsilon=eps, payload_bits=z.payload_bits - 1)
        assert narrower.grid_step**2 / 4 > 0.01 * smallest


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lower": 5, "upper": 5, "epsilon": 1}, "lower must be below upper"),
        ({"lower": 6, "upper": 5, "epsilon": 1}, "lower must be below upper"),
        ({"lower": math.nan, "upper": 5, "epsilon": 1}, "lower must be finite"),
        ({"lower": 0, "upper": math.inf, "epsilon": 1}, "upper must be finite"),
        ({"lower": 0, "upper": 1, "epsilon": math.nan}, "epsilon must be finite"),
        ({"lower": 0, "upper": 1, "epsilon": 0}, "epsilon must be in (0, 20.0]"),
        ({"lower": 0, "upper": 1, "epsilon": -1}, "epsilon must be in (0, 20.0]"),
        ({"lower": 0, "upper": 1, "epsilon": 25}, "epsilon must be in (0, 20.0]"),
        ({"lower": 0, "upper": 1, "epsilon": "1"}, "epsilon must be a real number"),
        ({"lower": True, "upper": 1, "epsilon": 1}, "lower must be a real number"),
        (
            {"lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 1},
            "payload_bits=1 is outside [2, 52]",
        ),
        (
            {"lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 53},
            "payload_bits=53 is outside [2, 52]",
        ),
        (
            {"lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 4.0},
            "payload_bits must be an integer",
        ),
        ({"lower": 0, "upper": 1, "epsilon": 1, "exponent": 1023}, "exponent=1023 is outside"),
        ({"lower": 0, "upper": 1, "epsilon": 1, "exponent": -5}, "exponent=-5 is outside"),
        ({"lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 4, "exponent": 3}, "not both"),
        ({"lower": 0, "upper": 1, "epsilon": 1, "sampler": "fast"}, "sampler must be one of"),
        ({"lower": -1e308, "upper": 1e308, "epsilon": 1}, "too wide for float64"),
        ({"lower": 0, "upper": 1e308, "epsilon": 1}, "does not fit in float64"),
        # Found by schemathesis on /preview: a subnormal range made p overflow to infinity.
        ({"lower": -2.2250738585e-313, "upper": 0.0, "epsilon": 0.5}, "too narrow for float64"),
        ({"lower": 0.0, "upper": 5e-324, "epsilon": 20}, "too narrow for float64"),
        ({"lower": 0, "upper": 1e300, "epsilon": 1e-6}, "too extreme for float64"),
    ],
)
def test_bad_parameters_raise_a_value_error_naming_the_problem(kwargs: dict, message: str) -> None:
    """Every invalid parameter raises a ParameterError (a ValueError) that says what was wrong."""
    with pytest.raises(ParameterError) as info:
        Zeal(**kwargs)
    assert isinstance(info.value, ValueError)
    assert message in str(info.value)


def test_too_wide_grid_payload_is_refused_naming_the_limit() -> None:
    """A width the exact sampler cannot realize is refused with the largest one it can."""
    with pytest.raises(ParameterError, match=r"supports at most 31 payload bits"):
        Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=40)


def test_parameters_are_frozen_hashable_and_picklable() -> None:
    """Instances are immutable values that survive pickling unchanged."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6)
    with pytest.raises(AttributeError):
        z.epsilon = 2  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(z))
    assert copy == z
    assert hash(copy) == hash(z)
    assert copy.fingerprint == z.fingerprint
    assert copy.payload_bits == 6


def test_fingerprint_is_stable_and_tells_parameters_apart() -> None:
    """The fingerprint is 8 fixed bytes per parameter set and differs when anything changes."""
    z = Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6)
    # Pinned: agents and collectors on different versions must agree on these bytes.
    assert z.fingerprint == bytes.fromhex("d878dd561432845d")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        others = [
            Zeal(lower=23.5, upper=83.9, epsilon=1.5, payload_bits=6),
            Zeal(lower=23.4, upper=83.9, epsilon=1, payload_bits=6),
            Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=7),
            Zeal(lower=23.5, upper=83.9, epsilon=1, payload_bits=6, sampler="paper"),
        ]
    assert len({z.fingerprint, *(o.fingerprint for o in others)}) == 5


def test_paper_sampler_warns() -> None:
    """Choosing the paper's float sampler warns that it is for comparison only."""
    with pytest.warns(ZealWarning, match="comparison"):
        Zeal(lower=0, upper=1, epsilon=1, sampler="paper")
