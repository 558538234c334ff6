"""The planners: what a stream's parameters, a device's readings under its caps, a
longitudinal stream's grid and a comparison of two groups would give, before the data exist
(``/preview``, ``/preview/device``, ``/preview/grid``, ``/preview/compare``;
docs/planning.md)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from zeal import ParameterError, Zeal
from zeal.estimate import bernstein_half_width
from zeal.longitudinal import plan_grid
from zeal.planning.comparison import plan_comparison, zero_inflated
from zeal.planning.windows import (
    Fleet,
    WindowPlan,
    best_epsilon,
    binding_of,
    plan_device,
    plan_windows,
)
from zeal.policy import DEFAULT_MAX_EPSILON_PER_DAY, MAX_EPSILON_PER_DAY
from zeal.protocol import EXPONENT
from zeal_server import store
from zeal_server.api.deps import (
    API,
    READ,
    Confidence,
    Db,
    Epsilon,
    Lower,
    PayloadBits,
    Upper,
    invalid,
)
from zeal_server.api.previews import (
    ComparePlanOut,
    DevicePlanOut,
    GridPlanOut,
    PreviewOut,
    StreamPlanOut,
    WindowPlanOut,
)
from zeal_server.api.schemas import HEAVY

__all__ = ["router"]

router = APIRouter()
#: The stream previewed, among a device's streams (/preview's with_streams).
THIS_STREAM = "(this stream)"


@router.get(f"{API}/preview", dependencies=READ, response_model=PreviewOut, responses=HEAVY)
def preview(
    lower: Lower,
    upper: Upper,
    epsilon: Epsilon,
    payload_bits: PayloadBits = None,
    exponent: Annotated[int | None, Query(ge=EXPONENT[0], le=EXPONENT[1])] = None,
    n: Annotated[
        int,
        Query(
            ge=1,
            le=10**15,
            description="readings in the average: all devices' readings in a window together",
        ),
    ] = 10_000,
    confidence: Confidence = 0.95,
    max_epsilon_per_day: Annotated[
        float,
        Query(gt=0, le=MAX_EPSILON_PER_DAY, description="the privacy policy (see POST /streams)"),
    ] = DEFAULT_MAX_EPSILON_PER_DAY,
    reading_every: Annotated[
        float | None,
        Query(
            alias="reading_every_seconds",
            ge=0.001,
            le=86_400,
            description="seconds between two readings of one device (at most 1,000 a second)",
        ),
    ] = None,
    devices: Annotated[
        int | None,
        Query(
            ge=1,
            le=10**7,
            description="devices in the fleet (with reading_every_seconds, interval_seconds)",
        ),
    ] = None,
    interval: Annotated[
        int | None,
        Query(
            alias="interval_seconds",
            ge=1,
            le=366 * 86_400,
            description="seconds per window averaged, on the UTC clock as /series's "
            "interval_seconds: a divisor of a day or whole days (with devices, "
            "reading_every_seconds)",
        ),
    ] = None,
    mean: Annotated[
        float | None,
        Query(description="typical reading, for the noise (default: the middle of the range)"),
    ] = None,
    sd: Annotated[
        float,
        Query(ge=0, le=1e15, description="spread of the readings, for the noise"),
    ] = 0.0,
    with_streams: Annotated[
        str | None,
        Query(
            description="existing streams each device also runs with this one (comma-separated; "
            "with devices, reading_every_seconds and interval_seconds): `device` then plans "
            "them together under the device cap"
        ),
    ] = None,
    shares: Annotated[
        str | None,
        Query(description="with with_streams: the device cap's split, this stream's first"),
    ] = None,
    device_max_epsilon_per_day: Annotated[
        float | None,
        Query(gt=0, le=MAX_EPSILON_PER_DAY, description="the device cap (default: the server's)"),
    ] = None,
    *,
    request: Request,
    db: Db,
) -> PreviewOut:
    """The derived parameters of a stream, the error of an average of n readings, and the
    privacy loss per device and day: what the policy allows, and what a device reading
    every `reading_every_seconds` would spend. With `devices` and `interval_seconds` too, the
    fleet's windows (docs/privacy.md, "Planning a fleet"): what each holds under the day's
    and the hour's caps, which cap binds, how many windows stay empty, the standard error
    and guaranteed half width of a window's average, and the same at the epsilon per
    reading that serves the windows best."""
    try:
        params = store.derive_params(
            lower,
            upper,
            epsilon,
            payload_bits,
            exponent=exponent,
            max_epsilon_per_day=max_epsilon_per_day,
        )
    except store.StoreError as exc:
        raise invalid("query", None, str(exc)) from exc
    daily = None if reading_every is None else math.ceil(86_400 / reading_every)
    hourly = None if reading_every is None else math.ceil(3_600 / reading_every)
    variance = params.variance_bound()
    std_error = math.sqrt(variance / n)
    half = bernstein_half_width(confidence, n=n, variance=variance, bound=params.error_bound())
    asked = (devices, interval)
    if any(v is not None for v in asked) and (reading_every is None or None in asked):
        raise invalid(
            "query",
            "devices"
            if devices is None
            else "interval_seconds"
            if interval is None
            else "reading_every_seconds",
            "a fleet's windows need devices, reading_every_seconds and interval_seconds together",
        )
    windows = best = device = None
    if with_streams is not None and reading_every is None:
        raise invalid("query", "with_streams", "a device's streams are planned for a fleet")
    if devices is not None and interval is not None and reading_every is not None:
        fleet = Fleet(devices, reading_every, interval, mean=mean, sd=sd, confidence=confidence)

        def make(epsilon: float) -> Zeal:
            try:
                return store.derive_params(
                    lower, upper, epsilon, payload_bits, max_epsilon_per_day=max_epsilon_per_day
                )
            except store.StoreError as exc:
                raise ParameterError(str(exc)) from exc

        try:
            windows = plan_windows(params, fleet)
            best = best_epsilon(make, max_epsilon_per_day, fleet)
        except ParameterError as exc:
            raise invalid("query", None, str(exc)) from exc
        if with_streams is not None:
            found = _existing(db, with_streams, taken=(THIS_STREAM,))
            entries = [(THIS_STREAM, params), *found]
            device = _device_plan(request, entries, fleet, shares, device_max_epsilon_per_day)
    over: tuple[bool, bool] | None = None  # the hour's cap, the day's cap
    if daily is not None and hourly is not None:
        over = hourly > (params.readings_per_hour or 0), daily > (params.readings_per_day or 0)
    return PreviewOut(
        binding=None if over is None else binding_of(hour=over[0], day=over[1]),
        windows=None if windows is None else window_out(windows),
        device=device,
        best=None if best is None else window_out(best),
        payload_bits=params.payload_bits,
        shared_bits=params.shared_bits,
        exponent=params.exponent,
        sampler=params.sampler,
        abar=params.abar,
        C=params.C,
        grid_step=params.grid_step,
        realized_epsilon=params.realized_epsilon,
        transmission_ratio=params.transmission_ratio,
        n=n,
        confidence=confidence,
        std_error=std_error if math.isfinite(std_error) else None,
        guaranteed_half_width=half if math.isfinite(half) else None,
        max_epsilon_per_day=max_epsilon_per_day,
        readings_per_day=params.readings_per_day or 0,
        readings_per_hour=params.readings_per_hour or 0,
        epsilon_per_day=None if daily is None else daily * params.epsilon,
        within_policy=None if over is None else not any(over),
    )


@router.get(
    f"{API}/preview/device", dependencies=READ, response_model=DevicePlanOut, responses=HEAVY
)
def preview_device(
    request: Request,
    db: Db,
    streams: Annotated[
        str,
        Query(
            description="the streams each device runs together, comma-separated names of "
            "existing streams"
        ),
    ],
    devices: Annotated[int, Query(ge=1, le=10**7, description="devices in the fleet")],
    reading_every: Annotated[
        float,
        Query(
            alias="reading_every_seconds",
            ge=1,
            le=86_400,
            description="seconds between two readings of one device in each stream",
        ),
    ],
    interval: Annotated[
        int,
        Query(
            alias="interval_seconds",
            ge=1,
            le=366 * 86_400,
            description="seconds per window averaged (a divisor of a day or whole days)",
        ),
    ],
    shares: Annotated[
        str | None,
        Query(
            description="the device cap's split, comma-separated numbers, one per stream "
            "(zeal-edge run --shares; default: evenly)"
        ),
    ] = None,
    device_max_epsilon_per_day: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_EPSILON_PER_DAY,
            description="the device cap planned (default: the server's)",
        ),
    ] = None,
    device_max_epsilon_per_365_days: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_EPSILON_PER_DAY,
            description="a yearly budget: the device's cap over any 365 UTC days (default: "
            "the server's ZEAL_DEVICE_MAX_EPSILON_PER_365_DAYS, none unless set); a device "
            "reporting every day spends a 365th of it a day",
        ),
    ] = None,
    confidence: Confidence = 0.95,
) -> DevicePlanOut:
    """Each stream's windows when every device of a fleet runs these streams together under
    its daily cap across streams, split as the agent splits it (docs/privacy.md, "One
    device, several streams"): its share, the readings a day it may send, which cap binds
    (its own policy or its share of the device cap), and each window's average's standard
    error (noise at the middle of each stream's range)."""
    found = _existing(db, streams)
    fleet = Fleet(devices, reading_every, interval, confidence=confidence)
    return _device_plan(
        request, found, fleet, shares, device_max_epsilon_per_day, device_max_epsilon_per_365_days
    )


def _existing(db: Db, streams: str, *, taken: tuple[str, ...] = ()) -> list[tuple[str, Zeal]]:
    """The named streams' parameters (comma-separated names; a 422 names what is wrong)."""
    names = [n.strip() for n in streams.split(",")]
    if len(set(names) | set(taken)) != len(names) + len(taken):
        raise invalid("query", "streams", "a stream is named twice")
    found = []
    for name in names:
        row = store.stream_by_name(db, name)
        if row is None:
            raise invalid("query", "streams", f"no stream {name!r}")
        found.append((name, store.params_of(row)))
    return found


def _device_plan(
    request: Request,
    found: list[tuple[str, Zeal]],
    fleet: Fleet,
    shares: str | None,
    device_max_epsilon_per_day: float | None,
    yearly: float | None = None,
) -> DevicePlanOut:
    """The device plan of streams `found` (zeal.planning.windows.plan_device), answered
    (`yearly`: the cap over 365 days planned; None: the server's)."""
    try:
        parts = None if shares is None else [float(x) for x in shares.split(",")]
    except ValueError:
        raise invalid("query", "shares", "shares are comma-separated numbers") from None
    cap = device_max_epsilon_per_day
    if cap is None:
        cap = request.app.state.settings.device_max_epsilon_per_day
    if yearly is None:
        yearly = request.app.state.settings.device_rolling_caps.get(365)
    try:
        plan = plan_device(found, fleet, cap, parts, yearly)
    except ParameterError as exc:
        field = "shares" if "share" in str(exc) else None
        raise invalid("query", field, str(exc)) from exc
    return DevicePlanOut(
        device_max_epsilon_per_day=plan.device_max_epsilon_per_day,
        spent_per_day=plan.spent_per_day,
        device_max_epsilon_per_365_days=plan.device_max_epsilon_per_365_days,
        spent_per_year=plan.spent_per_year,
        streams=[
            StreamPlanOut(
                stream=s.name,
                share=share,
                share_epsilon=s.share_epsilon,
                readings_per_day=s.readings_per_day,
                readings_per_hour=None if s.readings_per_day is None else s.plan.readings_per_hour,
                binds=s.binds,
                windows=window_out(s.plan),
            )
            for s, share in zip(plan.streams, plan.shares, strict=True)
        ],
    )


def window_out(plan: WindowPlan) -> WindowPlanOut:
    # the plan's fields by name; the fleet asked about (nested) is left out
    return WindowPlanOut(**{**asdict(plan), "readings_per_window": plan.per_window})


@router.get(
    f"{API}/preview/compare", dependencies=READ, response_model=ComparePlanOut, responses=HEAVY
)
def preview_compare(
    lower: Lower,
    upper: Upper,
    epsilon: Epsilon,
    devices: Annotated[int, Query(ge=2, le=10**7, description="devices per group")],
    readings: Annotated[int, Query(ge=1, le=10**9, description="readings per device (their mean)")],
    between_sd: Annotated[
        float, Query(ge=0, le=1e15, description="spread of device means within a group")
    ],
    payload_bits: PayloadBits = None,
    within_sd: Annotated[
        float | None,
        Query(ge=0, le=1e15, description="spread of readings around their device's mean"),
    ] = None,
    zero_share: Annotated[
        float | None,
        Query(ge=0, lt=1, description="instead of within_sd: the share of zero readings"),
    ] = None,
    positive_mean: Annotated[
        float | None, Query(ge=0, le=1e15, description="with zero_share: mean of the rest")
    ] = None,
    cv: Annotated[
        float | None, Query(ge=0, le=1e6, description="with zero_share: their CV")
    ] = None,
    mean: Annotated[
        float | None, Query(description="typical reading (default: the middle of the range)")
    ] = None,
    readings_cv: Annotated[
        float,
        Query(
            ge=0,
            le=100,
            description="coefficient of variation of readings per device (0: all equal)",
        ),
    ] = 0.0,
    shape: Annotated[
        Literal["normal", "lognormal"],
        Query(
            description="shape of the device means: normal, or lognormal (skewed to the right "
            "of lower, as in most fleets; power is then simulated)"
        ),
    ] = "normal",
    effect: Annotated[float, Query(ge=0, le=1e15, description="the difference to detect")] = 0.0,
    alpha: Annotated[float, Query(gt=0, lt=1, description="the test's level")] = 0.05,
    power: Annotated[float, Query(gt=0, lt=1, description="the power wanted")] = 0.8,
) -> ComparePlanOut:
    """The standard error, power and minimum detectable effect of the default device-level
    comparison (method=cluster) of two groups, before the data exist (docs/comparison.md).
    Give the spread of readings within a device as within_sd, or as zero_share,
    positive_mean and cv (then mean defaults to the readings' mean)."""
    try:
        params = store.derive_params(lower, upper, epsilon, payload_bits, max_epsilon_per_day=None)
    except store.StoreError as exc:
        raise invalid("query", None, str(exc)) from exc
    if within_sd is None:
        if zero_share is None or positive_mean is None or cv is None:
            raise invalid(
                "query",
                "within_sd",
                "give within_sd, or zero_share, positive_mean and cv",
            )
        typical, within_sd = zero_inflated(zero_share, positive_mean, cv)
        mean = typical if mean is None else mean
    try:
        plan = plan_comparison(
            params,
            devices=devices,
            readings=readings,
            between_sd=between_sd,
            within_sd=within_sd,
            mean=mean,
            readings_cv=readings_cv,
            shape=shape,
            effect=effect,
            alpha=alpha,
            target_power=power,
        )
    except ParameterError as exc:
        raise invalid("query", None, str(exc)) from exc
    return ComparePlanOut(
        payload_bits=params.payload_bits,
        std_error=plan.std_error,
        df=plan.df,
        noise_variance=plan.noise_variance,
        effect=effect,
        power=plan.power,
        alpha=alpha,
        target_power=power,
        detectable_effect=plan.detectable,
        power_from=plan.power_from,
    )


@router.get(f"{API}/preview/grid", dependencies=READ, response_model=GridPlanOut)
def preview_grid(
    lower: Lower,
    upper: Upper,
    epsilon: Epsilon,
    span: Annotated[
        float,
        Query(
            ge=0,
            le=1e15,
            description="how far a device's readings range over the horizon planned for "
            "(a home's temperature over a year, say), in the readings' unit",
        ),
    ],
    payload_bits: PayloadBits = None,
    budget: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_EPSILON_PER_DAY,
            description="the loss a device may spend over that horizon: the most grid values "
            "whose expected loss stays within it",
        ),
    ] = None,
    grid_points: Annotated[
        int | None,
        Query(ge=2, le=1024, description="or this many grid values, to see what they give"),
    ] = None,
) -> GridPlanOut:
    """A longitudinal stream's grid (docs/privacy.md, "Longitudinal streams"): with
    `budget`, the most grid values whose expected loss for a device whose readings span
    `span` stays within it; with `grid_points`, what that grid gives. Either way: the draws
    such a device makes (expected over its secret offset, and at most), its loss, the most
    it can ever spend, and what the rounding adds to a code's error."""
    if (budget is None) == (grid_points is None):
        raise invalid("query", "budget", "give budget or grid_points (one of them)")
    try:
        params = store.derive_params(lower, upper, epsilon, payload_bits, max_epsilon_per_day=None)
        plan = plan_grid(params, span=span, budget=budget, points=grid_points)
    except (store.StoreError, ParameterError) as exc:
        raise invalid(
            "query", "budget" if grid_points is None else "grid_points", str(exc)
        ) from exc
    return GridPlanOut(
        grid_points=plan.points,
        expected_loss=plan.expected_loss,
        **{k: v for k, v in asdict(plan).items() if k != "points"},
    )
