"""Response models of the planners: ``GET /preview`` (a stream's parameters, its policy,
and a fleet's windows: zeal.planning.windows) and ``GET /preview/compare`` (a comparison's
power: zeal.planning.comparison)."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = [
    "ComparePlanOut",
    "DevicePlanOut",
    "GridPlanOut",
    "PreviewOut",
    "StreamPlanOut",
    "WindowPlanOut",
]


class GridPlanOut(BaseModel):
    """A longitudinal stream's grid (zeal.longitudinal.plan_grid; docs/privacy.md,
    "Longitudinal streams")."""

    grid_points: int = Field(description="grid values: what POST /streams takes")
    step: float = Field(description="the grid's spacing, in the readings' unit")
    per_draw: float = Field(description="the realized epsilon of one code: what a draw costs")
    lifetime: float = Field(
        description="the most a device can ever spend with its memo kept: a draw per value"
    )
    span: float = Field(description="the readings' span over the horizon planned for")
    expected_draws: float = Field(
        description="draws of a device whose readings span `span`: 1 + span / step on "
        "average over its secret offset"
    )
    most_draws: int = Field(description="and at most: floor(span / step) + 2")
    expected_loss: float = Field(description="expected_draws times per_draw")
    rounding_sd: float = Field(description="the rounding's standard deviation at worst")
    std_error_ratio: float = Field(
        description="a code's standard error with the rounding over without, at the middle "
        "of the range"
    )


class ComparePlanOut(BaseModel):
    """A planned device-level comparison of two groups (docs/comparison.md)."""

    payload_bits: int
    std_error: float = Field(description="standard error of the difference of the means")
    df: float = Field(description="degrees of freedom of its t reference")
    noise_variance: float = Field(description="Zeal's variance per reading, averaged")
    effect: float
    power: float = Field(description="probability of finding `effect` at level alpha")
    alpha: float
    target_power: float
    detectable_effect: float = Field(description="smallest effect found with target_power")
    power_from: str = Field(
        description="how power was found: the t approximation, or a seeded simulation of the "
        "test (shape=lognormal)"
    )


class WindowPlanOut(BaseModel):
    """A fleet's windows under the policy (zeal.planning.windows): counts are per device and UTC
    day, averaged over the devices' phases."""

    epsilon: float
    readings_per_day: int = Field(description="the policy's cap per device and UTC day")
    readings_per_hour: int = Field(description="and per UTC hour")
    attempted_per_day: float = Field(description="readings a device takes per day")
    sent_per_day: float = Field(description="readings a device sends within the caps")
    dropped_by_hour: float = Field(description="readings skipped: their UTC hour was full")
    dropped_by_day: float = Field(description="readings skipped: their UTC day was full")
    binding: str = Field(description="which caps skip readings: none, hour, day or both")
    readings_per_window: tuple[float, float, float] = Field(
        description="a device's readings per window: the least, the mean and the most over "
        "the day's windows"
    )
    empty_share: float = Field(description="share of windows a device leaves without reading")
    fleet_empty_share: float = Field(
        description="share of windows no device gives a reading: they have no average"
    )
    std_error: float | None = Field(
        description="standard error of a window's average, over the windows that hold "
        "readings (Zeal's noise at the typical reading)"
    )
    worst_std_error: float | None = Field(description="of the window with the fewest readings")
    guaranteed_half_width: float | None = Field(
        description="guaranteed (Bernstein) half width of that window's interval"
    )
    even_reading_every: float | None = Field(
        description="seconds between readings that spread the day's allowance over 24 hours "
        "(null: an allowance of no reading a day)"
    )
    risk: float = Field(
        description="mean squared error of a window's average over the day's windows, a "
        "window without readings counting as a guess at the middle of the range"
    )


class StreamPlanOut(BaseModel):
    """One stream of a device planned under its cap across streams."""

    stream: str
    share: float = Field(description="its share of the device cap (the shares sum to 1)")
    share_epsilon: float | None = Field(
        description="its share in epsilon per UTC day, rounded down to whole micro-epsilon "
        "(null: no device cap, or a stream without a policy, which the cap does not count)"
    )
    readings_per_day: int | None = Field(
        description="readings a device may send to it per UTC day: the lower of its policy's "
        "and its share's (null: a stream without a policy)"
    )
    readings_per_hour: int | None = Field(description="its policy's cap per UTC hour")
    binds: str = Field(
        description="which cap sets its readings per day: policy (its own), device cap (its "
        "share), yearly cap (its share of a 365th of the yearly budget), or none (a stream "
        "without a policy)"
    )
    windows: WindowPlanOut


class DevicePlanOut(BaseModel):
    """A fleet of devices each running these streams together (zeal-edge run --stream
    a,b,c), the device cap split between them as the agent splits it."""

    device_max_epsilon_per_day: float | None = Field(
        description="the device cap planned (default: the server's "
        "ZEAL_DEVICE_MAX_EPSILON_PER_DAY; null: none)"
    )
    spent_per_day: float = Field(
        description="epsilon a device spends per UTC day over the streams with a policy, at most"
    )
    device_max_epsilon_per_365_days: float | None = Field(
        description="the yearly budget planned (a cap over any 365 UTC days; null: none): a "
        "device reporting every day may spend a 365th of it a day"
    )
    spent_per_year: float = Field(
        description="epsilon a device spends over 365 UTC days at most (365 x spent_per_day)"
    )
    streams: list[StreamPlanOut]


class PreviewOut(BaseModel):
    """What a stream with these parameters would be, before it is created."""

    payload_bits: int
    shared_bits: int
    exponent: int
    sampler: str
    abar: float = Field(description="the addition constant Abar (paper Eq. (22))")
    C: float = Field(description="the output bound C (paper Eq. (6))")
    grid_step: float
    realized_epsilon: float | None = Field(description="privacy loss the sampler realizes")
    transmission_ratio: float = Field(description="TR, paper Eq. (27)")
    n: int = Field(
        description="readings in the average previewed: all devices' readings in a window "
        "together (with devices, reading_every_seconds and interval_seconds, see windows instead)"
    )
    confidence: float
    std_error: float | None = Field(
        description="worst-case standard error of the average of n readings "
        "(null when it exceeds the float64 range, for astronomically wide ranges)"
    )
    guaranteed_half_width: float | None = Field(
        description="half width of the guaranteed (Bernstein, Theorem 3) interval for n "
        "readings (null when it exceeds the float64 range)"
    )
    max_epsilon_per_day: float = Field(description="the privacy policy previewed")
    readings_per_day: int = Field(description="readings one device may send per UTC day")
    readings_per_hour: int = Field(description="and per UTC hour (twice the day's even rate)")
    epsilon_per_day: float | None = Field(
        description="privacy loss per device per day at reading_every_seconds (null without it)"
    )
    within_policy: bool | None = Field(
        description="whether a device reading every reading_every_seconds stays within the "
        "policy, day and hour (null without reading_every_seconds); beyond it, the agent skips"
    )
    binding: str | None = Field(
        default=None,
        description="which caps skip readings of a device reading every "
        "reading_every_seconds: none, hour, day or both (null without reading_every_seconds)",
    )
    windows: WindowPlanOut | None = Field(
        default=None,
        description="with devices, reading_every_seconds and interval_seconds: what each "
        "window of the fleet holds at this epsilon, and what its average is worth",
    )
    device: DevicePlanOut | None = Field(
        default=None,
        description="with with_streams: this stream and those planned together for a device "
        "that runs them all under its cap across streams (this one named '(this stream)')",
    )
    best: WindowPlanOut | None = Field(
        default=None,
        description="the same at the epsilon per reading that serves the windows best under "
        "the policy (the least mean squared error of a window's average, a window without "
        "readings counting as a guess at the middle of the range)",
    )
