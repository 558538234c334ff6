"""The privacy policy (zeal.policy): exact integer accounting, its place in the parameters,
the fingerprint and the configuration document."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from zeal import ParameterError, Zeal
from zeal.mqtt.streamconfig import config_document, params_from_config
from zeal.policy import (
    DAY_MS,
    DEFAULT_MAX_EPSILON_PER_DAY,
    HOUR_MS,
    cap_micro,
    day_of,
    micro_epsilon,
    readings_per_day,
    readings_per_hour,
    tally,
)


def test_accounting_is_integer_and_never_allows_more_than_the_cap() -> None:
    """A reading costs its epsilon (the float64 value, exactly) rounded up to micro-epsilon,
    the cap is rounded down, so the readings allowed never spend more than the cap. The
    float64 0.1 is a little above 1/10: 80 readings at it spend more than 8, which a float
    ledger would miss (80 additions of 0.1 sum to 7.999999999999988)."""
    assert (micro_epsilon(1.0), cap_micro(8.0)) == (1_000_000, 8_000_000)
    assert readings_per_day(1.0, DEFAULT_MAX_EPSILON_PER_DAY) == 8
    assert sum([0.1] * 80) < 8 < 80 * Fraction(0.1)
    assert micro_epsilon(0.1) == 100_001
    assert readings_per_day(0.1, 8.0) == 79
    assert readings_per_day(0.25, 8.0) == 32  # exact in binary: no rounding
    assert readings_per_day(0.3, 8.0) == 26
    for epsilon in (0.1, 0.3, 1 / 3, 0.7, 1.0, 2.5):
        allowed = readings_per_day(epsilon, 8.0)
        assert allowed * micro_epsilon(epsilon) <= cap_micro(8.0)
        assert (allowed + 1) * micro_epsilon(epsilon) > cap_micro(8.0)
        assert allowed * Fraction(epsilon) <= 8
    assert day_of(0) == 0
    assert day_of(DAY_MS - 1) == 0
    assert day_of(DAY_MS) == 1


def test_an_hour_holds_twice_the_days_even_rate_rounded_up() -> None:
    """The hour's cap: 2 x readings_per_day / 24, rounded up, never above the day's; the
    ledgers tally a batch's stamps per UTC period, a batch across a boundary in both."""
    assert [readings_per_hour(n) for n in (1, 8, 12, 13, 24, 3600, 86_400)] == [
        1, 1, 1, 2, 2, 300, 7200,
    ]  # fmt: skip
    for n in range(1, 2000):
        hourly = readings_per_hour(n)
        assert hourly <= n
        assert 24 * (hourly - 1) < 2 * n <= 24 * hourly
    assert Zeal(lower=0, upper=1, epsilon=1, max_epsilon_per_day=8).readings_per_hour == 1
    assert Zeal(lower=0, upper=1, epsilon=1).readings_per_hour is None  # no policy
    assert tally([], HOUR_MS) == []
    assert tally([5, 6, HOUR_MS - 1], HOUR_MS) == [(0, 3)]
    assert tally([HOUR_MS - 1, HOUR_MS, 3 * HOUR_MS], HOUR_MS) == [(0, 1), (1, 1), (3, 1)]
    assert tally([DAY_MS - 1, DAY_MS], DAY_MS) == [(0, 1), (1, 1)]


def test_the_policy_is_a_parameter_and_part_of_the_fingerprint() -> None:
    plain = Zeal(lower=0, upper=110, epsilon=1)
    default = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8)
    raised = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=24)
    # Parameters without a policy keep the fingerprint they had before policies existed.
    assert plain.fingerprint.hex() == "fbcc38f6440ed8ad"
    assert len({plain.fingerprint, default.fingerprint, raised.fingerprint}) == 3
    assert plain != default != raised
    assert (plain.readings_per_day, default.readings_per_day, raised.readings_per_day) == (
        None,
        8,
        24,
    )
    assert pickle.loads(pickle.dumps(raised)) == raised
    assert "max_epsilon_per_day=24.0" in repr(raised)
    # The mechanism is the same: the policy changes nothing a code means.
    assert default.code_min == plain.code_min
    assert default.abar == plain.abar


@pytest.mark.parametrize(
    ("cap", "reason"),
    [
        (0, "must be in"),
        (-1, "must be in"),
        (float("nan"), "must be in"),
        (float("inf"), "must be in"),
        (1e9, "must be in"),
        ("8", "must be a number"),
        (True, "must be a number"),
        (0.5, "allows no reading at epsilon=1.0"),
    ],
)
def test_bad_policies_are_refused_with_the_reason(cap: object, reason: str) -> None:
    with pytest.raises(ParameterError, match=reason):
        Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=cap)  # type: ignore[arg-type]


def test_the_configuration_document_carries_the_policy_and_its_fingerprint_binds_it() -> None:
    params = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8)
    document = config_document("temps", params)
    assert document["max_epsilon_per_day"] == 8.0
    assert params_from_config(document) == params
    raised = {**document, "max_epsilon_per_day": 80.0}  # altered on the way
    with pytest.raises(ParameterError, match="does not match its parameters"):
        params_from_config(raised)
    legacy = config_document("temps", Zeal(lower=0, upper=110, epsilon=1))
    assert "max_epsilon_per_day" not in legacy
    assert params_from_config(legacy).max_epsilon_per_day is None
