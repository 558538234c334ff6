"""A stream's privacy policy: how much privacy loss one device may spend per UTC day.

Each reading privatized with epsilon costs epsilon (sequential composition, so a device's
loss over a day is the sum over its readings). The policy caps that sum per device and per
UTC day of the readings' timestamps, and the agent and the collector enforce it with the
same integer arithmetic: a reading costs ``micro_epsilon(epsilon)`` (rounded up), the cap is
``cap_micro(max_epsilon_per_day)`` (rounded down), so a device may send
``readings_per_day`` = cap // cost readings stamped in one day and never more, whichever end
counts. No floats are summed anywhere.

A day's allowance could all be stamped in one hour, and a device would then weigh far more
in that hour's averages than its rate allows (LDP data poisoning). So the policy also caps
each UTC hour at ``readings_per_hour`` = twice the day's allowance spread evenly over its
24 hours, rounded up (HOUR_SLACK): a device at its full daily rate has room for bursts, and
no device weighs more in a window of whole hours than twice that rate. Both ends enforce
the hour cap as they enforce the day's.

The default, DEFAULT_MAX_EPSILON_PER_DAY = 8, is of the order of the daily budgets of
deployed local differential privacy (docs/privacy.md says why, and what raising it costs).

A device that sends to several streams spends each stream's loss; the *device cap* bounds
their sum per UTC day of the readings' timestamps (DEFAULT_DEVICE_MAX_EPSILON_PER_DAY, the
same 8 by default), booked in the same integer micro-epsilon over every stream with a
policy. Both bounds hold. An agent running several streams of one device splits the cap
between them (``split``: each stream's share rounded down, so the shares never sum past
the cap), and a stream's allowance is then the lower of its policy and its share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import numpy as np
import numpy.typing as npt

from zeal.errors import ParameterError

__all__ = [
    "DAY_MS",
    "DEFAULT_DEVICE_MAX_EPSILON_PER_DAY",
    "DEFAULT_MAX_EPSILON_PER_DAY",
    "HOUR_MS",
    "HOUR_SLACK",
    "MAX_EPSILON_PER_DAY",
    "MICRO",
    "ROLLING",
    "DeviceCaps",
    "cap_micro",
    "check_device_cap",
    "check_policy",
    "check_shares",
    "day_of",
    "device_hour_cap",
    "micro_epsilon",
    "readings_per_day",
    "readings_per_hour",
    "split",
    "tally",
]

MICRO: Final = 10**6
DAY_MS: Final = 86_400_000
HOUR_MS: Final = 3_600_000
#: An hour may hold this many times the day's allowance spread evenly over its hours.
HOUR_SLACK: Final = 2
DEFAULT_MAX_EPSILON_PER_DAY: Final = 8.0
#: The default daily cap of one device over all its streams.
DEFAULT_DEVICE_MAX_EPSILON_PER_DAY: Final = 8.0
#: The largest cap a stream may declare (a reading a millisecond at epsilon 1, about).
MAX_EPSILON_PER_DAY: Final = 1e8


def micro_epsilon(epsilon: float) -> int:
    """epsilon in integer micro-epsilon, rounded up: a ledger never under-counts."""
    return math.ceil(Fraction(epsilon) * MICRO)


def cap_micro(max_epsilon_per_day: float) -> int:
    """A cap in integer micro-epsilon, rounded down: a ledger never allows more."""
    return math.floor(Fraction(max_epsilon_per_day) * MICRO)


def day_of(timestamp_ms: int) -> int:
    """The UTC day (days since 1970-01-01) a reading's timestamp falls in."""
    return timestamp_ms // DAY_MS


def readings_per_day(epsilon: float, max_epsilon_per_day: float) -> int:
    """How many readings one device may have stamped in one UTC day."""
    return cap_micro(max_epsilon_per_day) // micro_epsilon(epsilon)


def readings_per_hour(readings_per_day: int) -> int:
    """How many readings one device may have stamped in one UTC hour: HOUR_SLACK times
    its day's allowance spread evenly, rounded up (so at least one, at most the day's)."""
    return min(readings_per_day, -(-HOUR_SLACK * readings_per_day // 24))


def tally(
    timestamps: Sequence[int] | npt.NDArray[np.int64], period_ms: int
) -> list[tuple[int, int]]:
    """(period, readings) for each UTC period (DAY_MS, HOUR_MS) the timestamps fall in, in
    order: the entries a ledger books for one batch."""
    if len(timestamps) <= 4:  # one-reading messages: plain integers are far cheaper
        counted: dict[int, int] = {}
        for stamp in timestamps:
            period = int(stamp) // period_ms
            counted[period] = counted.get(period, 0) + 1
        return sorted(counted.items())
    periods = np.asarray(timestamps, dtype=np.int64) // period_ms
    if (periods == periods[0]).all():  # the usual batch lies in one period
        return [(int(periods[0]), len(periods))]
    found, counts = np.unique(periods, return_counts=True)
    return list(zip(found.tolist(), counts.tolist(), strict=True))


def check_policy(epsilon: float, max_epsilon_per_day: object) -> float | None:
    """The checked cap: None (no policy) or a number in [epsilon, MAX_EPSILON_PER_DAY]."""
    if max_epsilon_per_day is None:
        return None
    cap = check_device_cap(max_epsilon_per_day)
    if readings_per_day(epsilon, cap) < 1:
        raise ParameterError(
            f"max_epsilon_per_day={cap:g} allows no reading at epsilon={epsilon!r} per "
            "reading: raise the cap or lower epsilon"
        )
    return cap


def check_device_cap(max_epsilon_per_day: object, *, what: str = "max_epsilon_per_day") -> float:
    """A cap per UTC day (a device's, or a stream's before check_policy's own test) checked:
    a number in (0, MAX_EPSILON_PER_DAY]."""
    if isinstance(max_epsilon_per_day, bool) or not isinstance(max_epsilon_per_day, int | float):
        raise ParameterError(f"{what} must be a number, got {max_epsilon_per_day!r}")
    cap = float(max_epsilon_per_day)
    if not (math.isfinite(cap) and 0 < cap <= MAX_EPSILON_PER_DAY):
        raise ParameterError(
            f"{what} must be in (0, {MAX_EPSILON_PER_DAY:g}], got {max_epsilon_per_day!r}"
        )
    return cap


def device_hour_cap(day_cap_micro: int, cost_micro: int) -> int:
    """The device hour rule: what a device may spend in one UTC hour over all its streams,
    in micro-epsilon, when the reading to book costs `cost_micro`: the larger of HOUR_SLACK
    times its even hourly share of the day cap (rounded down) and that one reading. A
    reading is booked if the hour's spend with it stays within this, so the hour never
    holds more than the larger of that share and one reading of the device's costliest
    stream (with the default cap of 8 at epsilon 1: one reading an hour)."""
    return max(HOUR_SLACK * day_cap_micro // 24, cost_micro)


#: The rolling horizons a device may be capped over besides the UTC day, in UTC days.
ROLLING: Final = (30, 365)


@dataclass(frozen=True)
class DeviceCaps:
    """A device's caps across streams, in micro-epsilon (None: no such cap): per UTC day
    (and with it the hour rule, ``device_hour_cap``), and over any ``days`` consecutive
    UTC days for each horizon of ROLLING (``rolling``: horizon -> cap)."""

    day: int | None
    rolling: tuple[tuple[int, int], ...] = ()

    @property
    def any(self) -> bool:
        return self.day is not None or bool(self.rolling)


def check_shares(shares: Sequence[object], streams: int) -> list[Fraction]:
    """The shares of a device cap between `streams` streams, checked and normalized (they
    sum to 1): positive finite numbers, one per stream; none given: an even split."""
    if not shares:
        return [Fraction(1, streams)] * streams
    if len(shares) != streams:
        raise ParameterError(f"give one share per stream: {streams} streams, {len(shares)} shares")
    out: list[Fraction] = []
    for share in shares:
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ParameterError(f"a share must be a number, got {share!r}")
        if not (math.isfinite(share) and share > 0):
            raise ParameterError(f"a share must be a finite number > 0, got {share!r}")
        out.append(Fraction(share))
    total = sum(out)
    return [s / total for s in out]


def split(cap: int, shares: Sequence[Fraction]) -> list[int]:
    """A device cap (micro-epsilon) split between streams by `shares` (check_shares): each
    share rounded down, so the parts never sum past the cap."""
    return [math.floor(cap * s) for s in shares]
