"""Planning a fleet's window averages under a privacy policy: what an operator asks before
the devices are out ("500 sensors, a reading a minute, the default policy: what is an
hour's average worth?").

A device reads every ``reading_every`` seconds at its own phase and sends each reading
while its UTC hour holds fewer than ``readings_per_hour`` and its UTC day fewer than
``readings_per_day`` (zeal.policy; the agent skips the rest, and the collector would refuse
them). So the caps bind first come, first served: a device reading more often than its
day's allowance spread evenly fills the early hours of each UTC day and leaves the rest
empty, and every device does so in the same hours.

The average of a window is the mean of the privatized readings the window holds, from all
devices; its only error is Zeal's noise, whose variance averaged over readings with mean
``mean`` and standard deviation ``sd`` is ``Zeal.variance(mean) + sd**2 / (s - 1)``,
s = exp(epsilon / 2) (quadratic in the reading: paper 001, Theorem 2, Eq. (14); as in
zeal.planning.comparison). A window with n readings then has the standard error
sqrt(noise / n), and the guaranteed half-width of the Bernstein bound with the mechanism's
variance bound (zeal.estimate.bernstein_half_width).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from zeal._core.mechanism import Zeal
from zeal.errors import ParameterError
from zeal.estimate import bernstein_half_width
from zeal.planning.comparison import reading_noise
from zeal.policy import MICRO, cap_micro, check_shares, micro_epsilon, split

__all__ = [
    "DAY_SECONDS",
    "DevicePlan",
    "Fleet",
    "StreamPlan",
    "WindowPlan",
    "best_epsilon",
    "binding_of",
    "plan_device",
    "plan_windows",
]

DAY_SECONDS: Final = 86_400
HOUR_SECONDS: Final = 3_600
#: Device phases a day is simulated at (devices read at their own phase).
PHASES: Final = 16


@dataclass(frozen=True)
class Fleet:
    """The fleet planned: `devices` reading every `reading_every` seconds, averaged in
    windows of `interval` seconds on the UTC clock; `mean` and `sd` describe the readings
    (default: the middle of the range, no spread), for Zeal's noise."""

    devices: int
    reading_every: float
    interval: int
    mean: float | None = None
    sd: float = 0.0
    confidence: float = 0.95


@dataclass(frozen=True)
class WindowPlan:
    """What a fleet's windows hold, per device and together, and what their averages are
    worth. Counts are per device and UTC day, averaged over the devices' phases."""

    fleet: Fleet
    epsilon: float
    readings_per_day: int  # the policy's caps at this epsilon
    readings_per_hour: int
    attempted_per_day: float  # readings a device takes
    sent_per_day: float  # readings a device sends within the caps
    dropped_by_hour: float  # readings skipped because their hour was full
    dropped_by_day: float  # readings skipped because their day was full
    binding: str  # "none", "hour", "day" or "both": which caps skip readings
    per_window: tuple[float, float, float]  # readings per device and window: least, mean, most
    empty_share: float  # share of a device's windows that hold none of its readings
    fleet_empty_share: float  # share of windows that hold no reading of any device
    noise_variance: float  # Zeal's variance per reading, averaged over the readings
    std_error: float | None  # of a covered window's average, averaged over the covered windows
    worst_std_error: float | None  # of the covered window with the fewest readings
    guaranteed_half_width: float | None  # of that window, at the fleet's confidence
    #: Reading this seldom spreads the day's allowance over 24 hours (None: an allowance
    #: of no reading a day, a share of a device cap below one reading).
    even_reading_every: float | None
    #: The mean squared error of a window's average over the day's windows: noise / n for a
    #: window with n readings, (upper - lower)**2 / 12 for one with none (a guess at the
    #: middle of the range, readings spread evenly over it).
    risk: float


def binding_of(*, hour: bool, day: bool) -> str:
    """Which caps skip readings, from whether the hour's and the day's do."""
    return {(False, False): "none", (True, False): "hour", (False, True): "day"}.get(
        (hour, day), "both"
    )


def _check(fleet: Fleet) -> None:
    devices, reading_every, interval = fleet.devices, fleet.reading_every, fleet.interval
    if fleet.sd < 0 or not math.isfinite(fleet.sd):
        raise ParameterError(f"sd must be finite and non-negative, got {fleet.sd!r}")
    if devices < 1:
        raise ParameterError(f"devices must be at least 1, got {devices}")
    if not (math.isfinite(reading_every) and 1 <= reading_every <= DAY_SECONDS):
        raise ParameterError(
            f"a fleet's windows are planned for reading_every in [1, 86400] seconds, got "
            f"{reading_every!r}"
        )
    if interval < 1 or (DAY_SECONDS % interval and interval % DAY_SECONDS):
        raise ParameterError(
            f"the window ({interval} s) must divide a day or be whole days: windows are on "
            "the UTC clock"
        )


def _day(
    reading_every: float, per_day: int, per_hour: int, interval: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per phase: (readings taken, skipped at the hour cap, skipped at the day cap) in one
    UTC day, and readings per window of the day (phases x windows)."""
    windows = max(DAY_SECONDS // interval, 1)
    slots = math.ceil(DAY_SECONDS / reading_every)
    phases = PHASES if slots <= 10_000 else 4  # readings of a second: few phases differ
    taken, by_hour, by_day = (np.zeros(phases) for _ in range(3))
    counts = np.zeros((phases, windows))
    for p in range(phases):
        t = (p + 0.5) / phases * reading_every + reading_every * np.arange(slots)
        t = t[t < DAY_SECONDS]
        hour = (t // HOUR_SECONDS).astype(np.int64)
        first = np.searchsorted(hour, hour)  # index of each reading's hour's first reading
        fits_hour = np.arange(t.size) - first < per_hour
        fits_day = np.cumsum(fits_hour) <= per_day
        sent = fits_hour & fits_day
        taken[p], by_hour[p], by_day[p] = t.size, (~fits_hour).sum(), (fits_hour & ~fits_day).sum()
        if interval >= DAY_SECONDS:
            counts[p, 0] = sent.sum() * (interval // DAY_SECONDS)
        else:
            counts[p] = np.bincount((t[sent] // interval).astype(np.int64), minlength=windows)
    return taken, by_hour, by_day, counts


def plan_windows(params: Zeal, fleet: Fleet, *, allowance: int | None = None) -> WindowPlan:
    """The plan of `fleet` under the policy of `params` (its ``max_epsilon_per_day``; none:
    no caps); `allowance`: readings a device may send a day below its policy's (its share of
    a device cap across streams, ``plan_device``), its hour's cap staying the policy's."""
    _check(fleet)
    devices, reading_every, interval = fleet.devices, fleet.reading_every, fleet.interval
    attempted = DAY_SECONDS / reading_every
    per_day = params.readings_per_day or math.ceil(attempted)
    per_hour = params.readings_per_hour or per_day
    if allowance is not None and params.readings_per_day is not None:
        per_day = min(per_day, allowance)
        per_hour = min(per_hour, per_day)
    taken, by_hour, by_day, counts = _day(reading_every, per_day, per_hour, interval)
    hour_drops, day_drops = float(by_hour.mean()), float(by_day.mean())
    centre = (params.lower + params.upper) / 2 if fleet.mean is None else float(fleet.mean)
    if not params.lower <= centre <= params.upper:
        raise ParameterError(
            f"mean must be a reading in the range [{params.lower:g}, {params.upper:g}], got "
            f"{fleet.mean!r}"
        )
    if fleet.sd > (params.upper - params.lower) / 2:
        raise ParameterError(
            f"sd must be at most half the range ({(params.upper - params.lower) / 2:g}): "
            f"readings in the range spread no more, got {fleet.sd!r}"
        )
    noise = reading_noise(params, centre, fleet.sd)
    per_window = counts.mean(axis=0)  # a device's readings per window, over its phases
    # a window holds no reading of any device if each misses it: the share of phases that
    # miss it, to the power of the devices (their phases independent)
    missed = (counts == 0).mean(axis=0)
    fleet_empty = float((missed**devices).mean())
    covered = per_window > 0
    guess = (params.upper - params.lower) ** 2 / 12
    with np.errstate(divide="ignore"):
        risk = np.where(covered, noise / (devices * per_window), guess)
    risk = risk * (1 - missed**devices) + guess * missed**devices
    std_error = worst = half = None
    if covered.any():
        n = devices * per_window[covered]
        errors = np.sqrt(noise / n)
        std_error, worst = float(errors.mean()), float(errors.max())
        fewest = max(math.floor(n.min()), 1)
        half = bernstein_half_width(
            fleet.confidence, n=fewest, variance=params.variance_bound(), bound=params.error_bound()
        )
    return WindowPlan(
        fleet=fleet,
        epsilon=params.epsilon,
        readings_per_day=per_day,
        readings_per_hour=per_hour,
        attempted_per_day=float(taken.mean()),
        sent_per_day=float(taken.mean() - by_hour.mean() - by_day.mean()),
        dropped_by_hour=hour_drops,
        dropped_by_day=day_drops,
        binding=binding_of(hour=hour_drops > 0, day=day_drops > 0),
        per_window=(float(per_window.min()), float(per_window.mean()), float(per_window.max())),
        empty_share=float((counts == 0).mean()),
        fleet_empty_share=fleet_empty,
        noise_variance=noise,
        std_error=std_error,
        worst_std_error=worst,
        guaranteed_half_width=half,
        even_reading_every=DAY_SECONDS / per_day if per_day else None,
        risk=float(risk.mean()),
    )


@dataclass(frozen=True)
class StreamPlan:
    """One stream of a device under the device's cap across streams: its share of the cap
    (epsilon per UTC day; None: no device cap, or a stream without a policy, which the cap
    does not count), the readings a day it may send (the lower of its policy's and its
    share's), which of the two sets them ("policy", "device cap", or "none" for a stream
    without a policy), and its windows."""

    name: str
    share_epsilon: float | None
    readings_per_day: int | None
    binds: str
    plan: WindowPlan


@dataclass(frozen=True)
class DevicePlan:
    """A fleet of devices each running the same streams (``zeal-edge run --stream a,b,c``)
    under a daily cap across them, split by shares as the agent splits it."""

    device_max_epsilon_per_day: float | None
    shares: tuple[float, ...]
    streams: tuple[StreamPlan, ...]
    #: Epsilon a device spends a day over its streams with a policy, at most.
    spent_per_day: float
    #: The yearly budget planned (a cap over any 365 UTC days; None: none), and what a
    #: device spends a year at most (365 days of spent_per_day).
    device_max_epsilon_per_365_days: float | None = None
    spent_per_year: float = 0.0


def plan_device(
    streams: list[tuple[str, Zeal]],
    fleet: Fleet,
    device_max_epsilon_per_day: float | None,
    shares: list[float] | None = None,
    device_max_epsilon_per_365_days: float | None = None,
) -> DevicePlan:
    """Each stream's windows when every device of `fleet` runs `streams` (name, parameters)
    together, its cap split by `shares` (none: evenly) as zeal_edge.device splits it: a
    stream with a policy may spend the lower of its policy and its share (rounded down to
    whole micro-epsilon, then to whole readings); its hour's cap stays its policy's. With a
    yearly budget (a cap over any 365 UTC days), a device that reports every day can spend
    a 365th of it a day, every day: the daily cap split is the lower of the day's cap and
    that (a stream it binds says "yearly cap")."""
    if not streams:
        raise ParameterError("a device plan needs at least one stream")
    parts = check_shares(list(shares or []), len(streams))
    daily = None if device_max_epsilon_per_day is None else cap_micro(device_max_epsilon_per_day)
    yearly = None
    if device_max_epsilon_per_365_days is not None:
        yearly = cap_micro(device_max_epsilon_per_365_days) // 365
        daily = yearly if daily is None else min(daily, yearly)
    caps: list[int | None] = [None] * len(streams) if daily is None else list(split(daily, parts))
    out: list[StreamPlan] = []
    spent = 0
    for (name, params), share in zip(streams, caps, strict=True):
        cost = micro_epsilon(params.epsilon)
        policy = params.readings_per_day
        if policy is None:
            out.append(StreamPlan(name, None, None, "none", plan_windows(params, fleet)))
            continue
        allowance = policy if share is None else min(policy, share // cost)
        binds = "policy" if allowance == policy else "device cap"
        if binds == "device cap" and yearly is not None and daily == yearly:
            binds = "yearly cap"
        plan = plan_windows(params, fleet, allowance=allowance)
        spent += allowance * cost
        out.append(
            StreamPlan(name, None if share is None else share / MICRO, allowance, binds, plan)
        )
    return DevicePlan(
        device_max_epsilon_per_day,
        tuple(float(p) for p in parts),
        tuple(out),
        spent / MICRO,
        device_max_epsilon_per_365_days,
        365 * spent / MICRO,
    )


def best_epsilon(
    make: Callable[[float], Zeal], max_epsilon_per_day: float, fleet: Fleet, candidates: int = 40
) -> WindowPlan:
    """The epsilon per reading that serves the windows best under the policy
    `max_epsilon_per_day`: the smallest mean squared error of a window's average over the
    day's windows (``WindowPlan.risk``), where a window without any reading counts as a
    guess at the middle of the range. A larger epsilon buys less noise per
    reading and fewer readings a day; the candidates spend the day's cap exactly on 1, 2,
    ... readings (up to those taken, on a geometric grid of `candidates`), each epsilon the
    cap over the count in whole micro-epsilon. `make` builds the mechanism for an epsilon
    (the stream's range and width; it may refuse one, which is then skipped)."""
    _check(fleet)
    cap = cap_micro(max_epsilon_per_day)
    most = max(1, min(math.ceil(DAY_SECONDS / fleet.reading_every), cap))
    counts = np.unique(np.geomspace(1, most, num=candidates).round().astype(np.int64))
    best: WindowPlan | None = None
    for count in counts.tolist():
        epsilon = (cap // count) / MICRO
        try:
            params = make(epsilon)
        except ParameterError:
            continue
        plan = plan_windows(params, fleet)
        if plan.std_error is not None and (best is None or _better(plan, best)):
            best = plan
    if best is None:
        raise ParameterError("no epsilon under this policy gives a window any reading")
    return best


def _better(plan: WindowPlan, than: WindowPlan) -> bool:
    return plan.risk < than.risk
