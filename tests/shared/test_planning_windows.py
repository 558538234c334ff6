"""The window planner (zeal.planning.windows) against a simulation of its own: a fleet of 500
sensors reading every minute on -20..50 under the default policy, averaged by the hour."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeal import ParameterError, Zeal
from zeal.planning.windows import Fleet, best_epsilon, plan_device, plan_windows

LOWER, UPPER = -20.0, 50.0


def make(epsilon: float) -> Zeal:
    return Zeal(lower=LOWER, upper=UPPER, epsilon=epsilon, max_epsilon_per_day=8.0)


def sent_times(phase: float, every: float, per_day: int, per_hour: int) -> list[float]:
    """The seconds of a UTC day at which a device reading every `every` seconds from
    `phase` sends, taking readings in order while its hour and its day have room: written
    out reading by reading, apart from the planner's arrays."""
    out: list[float] = []
    in_hour: dict[int, int] = {}
    t = phase
    while t < 86_400:
        hour = int(t // 3600)
        if in_hour.get(hour, 0) < per_hour and len(out) < per_day:
            in_hour[hour] = in_hour.get(hour, 0) + 1
            out.append(t)
        t += every
    return out


def test_the_default_policy_fills_the_first_hours_and_leaves_two_thirds_empty() -> None:
    """8 readings a day at epsilon 1, at most 1 an hour: a device reading every minute sends
    the first reading of hours 0 to 7 (UTC) and skips the rest; every device the same
    hours, so 16 of 24 hourly windows hold no reading at all, and both caps skip readings."""
    plan = plan_windows(
        make(1.0), Fleet(devices=500, reading_every=60, interval=3600, mean=15, sd=20)
    )
    assert (plan.readings_per_day, plan.readings_per_hour) == (8, 1)
    assert plan.binding == "both"
    assert plan.sent_per_day == 8
    assert plan.attempted_per_day == 1440
    assert plan.dropped_by_hour == 1440 - 24
    assert plan.dropped_by_day == 16
    assert plan.empty_share == pytest.approx(16 / 24)
    assert plan.fleet_empty_share == pytest.approx(16 / 24)
    assert plan.per_window == (0.0, pytest.approx(8 / 24), 1.0)
    assert plan.even_reading_every == 10_800  # every 3 hours spreads the 8 over the day
    spread = plan_windows(make(1.0), Fleet(devices=500, reading_every=10_800, interval=3600))
    assert spread.binding == "none"
    assert spread.sent_per_day == 8
    assert spread.fleet_empty_share < 1e-60  # devices' phases cover every hour


def test_the_planned_standard_error_agrees_with_a_simulation() -> None:
    """60 simulated days of the 500-sensor fleet (readings uniform on -20..50, each device
    at its own phase, sending as sent_times says, privatized with Zeal): the error of each
    covered hour's average over its 500 readings has a simulated sd within 10 % of the
    planner's standard error (the simulation's own error is about 3 %), and the hours it
    fills are the planner's."""
    params = make(1.0)
    rng = np.random.default_rng(12)
    devices, days = 500, 60
    spread = (UPPER - LOWER) / math.sqrt(12)
    plan = plan_windows(params, Fleet(devices, 60, 3600, mean=15, sd=spread))
    times = [sent_times(float(rng.uniform(0, 60)), 60, 8, 1) for _ in range(devices)]
    hours = np.concatenate([np.asarray(t) // 3600 for t in times]).astype(int)
    per_hour = np.bincount(hours, minlength=24) / devices
    assert per_hour.tolist() == [1.0] * 8 + [0.0] * 16
    assert np.mean(per_hour == 0) == pytest.approx(plan.fleet_empty_share)
    errors = []
    for _ in range(days):
        raw = rng.uniform(LOWER, UPPER, hours.size)
        decoded = params.decode(params.perturb(raw, rng=rng))
        for hour in range(8):
            chosen = hours == hour
            errors.append(float(decoded[chosen].mean() - raw[chosen].mean()))
    simulated = float(np.std(errors, ddof=1))
    assert plan.std_error is not None
    print(f"planned SE {plan.std_error:.3f}, simulated {simulated:.3f} over {len(errors)} hours")
    assert simulated == pytest.approx(plan.std_error, rel=0.10)


def test_the_best_epsilon_weighs_empty_windows_against_noise() -> None:
    """At the default policy the planner's best epsilon per reading for hourly windows of
    minute readings covers more hours than epsilon 1 (0.333: 24 readings a day, 2 an
    hour, 12 hours) at a higher noise per window, and its risk is the lowest of those
    tried; for daily windows the whole policy goes on one reading."""
    best = best_epsilon(make, 8.0, Fleet(devices=500, reading_every=60, interval=3600))
    at_one = plan_windows(make(1.0), Fleet(devices=500, reading_every=60, interval=3600))
    assert best.risk < at_one.risk
    assert best.fleet_empty_share < at_one.fleet_empty_share
    assert (best.epsilon, best.readings_per_day, best.readings_per_hour) == (0.333333, 24, 2)
    for epsilon in (0.1, 0.5, 1.0, 2.0, 4.0):
        other = plan_windows(make(epsilon), Fleet(devices=500, reading_every=60, interval=3600))
        assert best.risk <= other.risk, epsilon
    daily = best_epsilon(make, 8.0, Fleet(devices=500, reading_every=60, interval=86_400))
    assert daily.epsilon == 8.0
    assert daily.fleet_empty_share == 0


def test_windows_off_the_clock_and_bad_fleets_are_refused() -> None:
    for interval in (7, 5000, 90_000):
        with pytest.raises(ParameterError, match="divide a day"):
            plan_windows(make(1.0), Fleet(devices=5, reading_every=60, interval=interval))
    with pytest.raises(ParameterError, match="devices"):
        plan_windows(make(1.0), Fleet(devices=0, reading_every=60, interval=60))
    for mean in (1e308, -21.0, math.nan):
        with pytest.raises(ParameterError, match="mean must be a reading in the range"):
            plan_windows(make(1.0), Fleet(devices=5, reading_every=60, interval=60, mean=mean))
    with pytest.raises(ParameterError, match="sd must be at most half the range"):
        plan_windows(make(1.0), Fleet(devices=5, reading_every=60, interval=60, sd=1e15))
    with pytest.raises(ParameterError, match="reading_every"):
        plan_windows(make(1.0), Fleet(devices=5, reading_every=1e-9, interval=60))


def test_the_figures_in_docs_privacy_are_the_planners() -> None:
    """docs/privacy.md quotes the planner; these are its figures, formatted as written."""
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "privacy.md").read_text().split())
    fleet = Fleet(devices=500, reading_every=60, interval=3600)
    plan = plan_windows(make(1.0), fleet)
    best = best_epsilon(make, 8.0, fleet)
    even = plan_windows(make(1.0), Fleet(devices=500, reading_every=10_800, interval=3600))
    assert plan.std_error is not None
    assert best.std_error is not None
    assert even.std_error is not None
    assert plan.guaranteed_half_width is not None
    window_mean = Zeal(lower=0.0, upper=110.0, epsilon=1.0, max_epsilon_per_day=24)
    hourly = plan_windows(window_mean, Fleet(devices=200, reading_every=3600, interval=3600))
    per_reading = plan_windows(
        Zeal(lower=0.0, upper=110.0, epsilon=1.0, max_epsilon_per_day=1440), Fleet(200, 60, 3600)
    )
    assert hourly.std_error is not None
    assert per_reading.std_error is not None
    worst = math.sqrt(window_mean.variance_bound() / 200)
    for figure in (
        f"standard error of {plan.std_error:.2f}",
        f"half width of {plan.guaranteed_half_width:.1f}",
        f"({plan.fleet_empty_share:.3f})",
        f"{plan.dropped_by_hour:,.0f} skipped at the hour's cap, {plan.dropped_by_day:.0f} at",
        f"`best` is epsilon {best.epsilon:g} ({best.readings_per_day} a day, "
        f"{best.readings_per_hour} an hour): {round(24 * (1 - best.fleet_empty_share))} hours "
        f"filled, a standard error of {best.std_error:.2f}",
        f"with a standard error of {even.std_error:.2f}",
        f"the planner gives {hourly.std_error:.2f}",
        f"it is {worst:.2f})",
        f"gives {per_reading.std_error:.2f}, at 60 times",
    ):
        assert figure in text, figure


def device_streams() -> list[tuple[str, Zeal]]:
    """A home's sensor with three streams, each under the default policy (8 a day)."""
    return [
        ("humidity", Zeal(lower=0.0, upper=100.0, epsilon=1.0, max_epsilon_per_day=8.0)),
        ("temperature", Zeal(lower=LOWER, upper=UPPER, epsilon=0.5, max_epsilon_per_day=8.0)),
        ("co2", Zeal(lower=400.0, upper=2000.0, epsilon=2.0, max_epsilon_per_day=2.0)),
    ]


def test_a_device_plan_splits_the_cap_and_says_which_cap_binds() -> None:
    """Cap 8 split evenly: each stream may spend 2.666666 epsilon a day; humidity (epsilon
    1) 2 readings and temperature (0.5) 5, both held by the device cap; co2 (epsilon 2,
    policy 2) 1 reading, held by its own policy. Shares 1,2,1 move the allowance."""
    fleet = Fleet(devices=300, reading_every=600, interval=3600)
    plan = plan_device(device_streams(), fleet, 8.0)
    got = [(s.name, s.share_epsilon, s.readings_per_day, s.binds) for s in plan.streams]
    assert got == [
        ("humidity", 2.666666, 2, "device cap"),
        ("temperature", 2.666666, 5, "device cap"),
        ("co2", 2.666666, 1, "policy"),
    ]
    assert plan.spent_per_day == pytest.approx(2 + 2.5 + 2)
    assert [s.plan.sent_per_day for s in plan.streams] == [2, 5, 1]
    shared = plan_device(device_streams(), fleet, 8.0, [1, 2, 1])
    assert [s.readings_per_day for s in shared.streams] == [2, 8, 1]
    assert plan_device(device_streams(), fleet, None).streams[0].binds == "policy"
    with pytest.raises(ParameterError, match="one share per stream"):
        plan_device(device_streams(), fleet, 8.0, [1, 2])


def test_a_device_plans_standard_errors_agree_with_a_simulation() -> None:
    """400 simulated days of 300 homes, each running the three streams together (reading
    every 10 minutes, at its own phase, sending as the agent's split and each stream's hour
    cap allow, privatized with Zeal): for each stream, the simulated sd of a covered hour's
    average error, averaged over its covered hours, is within 10 % of the planner's standard
    error, and that of the hour with the fewest readings within 10 % of its worst."""
    rng = np.random.default_rng(53)
    devices, days, every = 300, 400, 600.0
    plan = plan_device(device_streams(), Fleet(devices, every, 3600), 8.0)
    for (name, params), planned in zip(device_streams(), plan.streams, strict=True):
        spread = (params.upper - params.lower) / math.sqrt(12)
        allowance, per_hour = planned.readings_per_day, params.readings_per_hour
        assert allowance is not None
        assert per_hour is not None
        fleet = Fleet(devices, every, 3600, sd=spread)
        expected = plan_windows(params, fleet, allowance=allowance)
        times = [
            sent_times(float(rng.uniform(0, every)), every, allowance, per_hour)
            for _ in range(devices)
        ]
        hours = np.concatenate([np.asarray(t) // 3600 for t in times]).astype(int)
        covered = np.unique(hours).tolist()
        errors: dict[int, list[float]] = {h: [] for h in covered}
        for _ in range(days):
            raw = rng.uniform(params.lower, params.upper, hours.size)
            decoded = params.decode(params.perturb(raw, rng=rng))
            for hour in covered:
                chosen = hours == hour
                errors[hour].append(float(decoded[chosen].mean() - raw[chosen].mean()))
        sds = {h: float(np.std(e, ddof=1)) for h, e in errors.items()}
        fewest = min(covered, key=lambda h: int((hours == h).sum()))
        assert expected.std_error is not None
        assert expected.worst_std_error is not None
        mean_sd = float(np.mean(list(sds.values())))
        print(
            f"{name}: {allowance} a day in hours {covered}; planned SE {expected.std_error:.4g} "
            f"(worst {expected.worst_std_error:.4g}), simulated {mean_sd:.4g} "
            f"(worst {sds[fewest]:.4g}), {days * len(covered)} hours"
        )
        assert mean_sd == pytest.approx(expected.std_error, rel=0.10), name
        assert sds[fewest] == pytest.approx(expected.worst_std_error, rel=0.10), name


def test_the_device_figures_in_docs_privacy_are_the_planners() -> None:
    """docs/privacy.md's device with three streams: its figures are the planner's."""
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "privacy.md").read_text().split())
    fleet = Fleet(devices=300, reading_every=600, interval=3600)
    plan = plan_device(device_streams(), fleet, 8.0)
    humidity, temperature, co2 = plan.streams
    shared = plan_device(device_streams(), fleet, 8.0, [1, 2, 1])
    errors = [s.plan.std_error for s in (*plan.streams, shared.streams[1])]
    assert all(e is not None for e in errors)
    for figure in (
        f"each stream's share is {humidity.share_epsilon} epsilon a day",
        f"humidity sends {humidity.readings_per_day} readings a day (the device cap binds), "
        f"with a standard error of {errors[0]:.2f}",
        f"temperature {temperature.readings_per_day} (the device cap binds), {errors[1]:.2f}",
        f"CO₂ {co2.readings_per_day} (its own policy binds), {errors[2]:.2f}",
        f"a device spends at most {plan.spent_per_day:g} of its 8 a day",
        f"Shares `1,2,1` give temperature {shared.streams[1].share_epsilon:g} epsilon, "
        f"{shared.streams[1].readings_per_day} readings and a standard error of {errors[3]:.2f}, "
        f"and spend all {shared.spent_per_day:g}",
    ):
        assert figure in text, figure
    assert [s.binds for s in plan.streams] == ["device cap", "device cap", "policy"]
    yearly = plan_device(device_streams(), fleet, 8.0, None, 2190)
    humidity, temperature, co2 = yearly.streams
    for figure in (
        f"each stream's share is {humidity.share_epsilon} epsilon a day",
        f"humidity sends {humidity.readings_per_day} readings a day and temperature "
        f"{temperature.readings_per_day} (the yearly cap binds",
        f"CO₂ {co2.readings_per_day} (its own policy)",
        f"at most {yearly.spent_per_day:g} a day, {yearly.spent_per_year:,g} a year",
    ):
        assert figure in text, figure
    assert [s.binds for s in yearly.streams] == ["yearly cap", "yearly cap", "policy"]
    starved = plan_device(device_streams(), fleet, 8.0, None, 730)  # 2 a day: CO2 buys none
    assert (starved.streams[2].readings_per_day, starved.streams[2].plan.even_reading_every) == (
        0,
        None,
    )
