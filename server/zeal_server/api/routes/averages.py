"""Averages: the debiased average of a window, its series, and a preview of a stream's
parameters (two groups compared: routes/compare.py)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Query, Request

from zeal import ParameterError, Zeal
from zeal.estimate import bernstein_half_width
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
from zeal_server.api.bayesian import (
    BayesModel,
    Estimator,
    PriorText,
    bayes_reader,
    selected_devices,
    window_codes,
)
from zeal_server.api.deps import (
    API,
    MAX_POINTS,
    READ,
    Confidence,
    Db,
    Device,
    End,
    Epsilon,
    Group,
    Lower,
    PayloadBits,
    Start,
    Upper,
    as_datetime,
    bounds_out,
    echoed,
    estimate_out,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.api.previews import DevicePlanOut, PreviewOut, StreamPlanOut, WindowPlanOut
from zeal_server.api.routes.distribution import quantiles_of
from zeal_server.api.schemas import HEAVY, AverageOut, PointOut, QuantileOut, SeriesOut
from zeal_server.store.models import Stream

__all__ = ["router"]

router = APIRouter()
#: The stream previewed, among a device's streams (/preview's with_streams).
THIS_STREAM = "(this stream)"
#: Points of a series with quantile=: each is a fit and a bootstrap of its own.
MAX_QUANTILE_POINTS = 100


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


Exclude = Annotated[
    Literal["none", "implausible"],
    Query(
        description="implausible: leave out the devices whose own readings in the window "
        "prove them dishonest (their guaranteed interval at level 1 - 1e-9 lies wholly "
        "outside [lower, upper]; docs/privacy.md); the answer names them in `excluded`"
    ),
]


@router.get(
    f"{API}/streams/{{name}}/average", dependencies=READ, response_model=AverageOut, responses=HEAVY
)
def average(
    name: str,
    db: Db,
    start: Start = None,
    end: End = None,
    group: Group = None,
    device: Device = None,
    confidence: Confidence = 0.95,
    estimator: Estimator = "avg",
    model: BayesModel = "mean",
    prior: PriorText = None,
    exclude: Exclude = "none",
) -> AverageOut:
    """The debiased average AVG* over whole buckets in [start, end), with its intervals;
    with estimator=bayes, a Bayes estimate beside it (docs/bayes.md)."""
    stream = stream_or_404(db, name)
    first, stop = window(stream, start, end)
    params = store.params_of(stream)
    read = bayes_reader(params, model, prior, confidence) if estimator == "bayes" else None
    devices = selected_devices(db, stream, group, device)
    excluded: list[str] = []
    if exclude == "implausible":
        devices, excluded = store.without_implausible(db, stream, params, first, stop, devices)
    sums = store.window_sums(db, stream, first, stop, devices)
    found = store.estimate(params, sums, confidence)
    lo, hi = bounds_out(stream, first, stop)
    lo, hi = echoed(start, lo), echoed(end, hi)
    bayes = None
    if read is not None:
        codes = None
        if model != "mean" and sums.n:
            per_bucket = window_codes(db, stream, first, stop, devices)
            codes = np.concatenate([*per_bucket.values(), np.zeros(0, np.int64)])
        bayes = read(sums.n, found.mean if found else None, codes)
    return AverageOut(
        stream=name,
        start=lo,
        end=hi,
        group=group,
        device=device,
        n=sums.n,
        confidence=confidence,
        epsilon=stream.epsilon,
        payload_bits=stream.payload_bits,
        estimate=estimate_out(found),
        bayes=bayes,
        excluded=excluded,
    )


@router.get(
    f"{API}/streams/{{name}}/series", dependencies=READ, response_model=SeriesOut, responses=HEAVY
)
def series(
    name: str,
    db: Db,
    start: Start = None,
    end: End = None,
    interval: Annotated[
        int | None,
        Query(
            alias="interval_seconds",
            ge=1,
            le=100 * 365 * 86400,
            description="seconds per point, a multiple of the bucket (at most 100 years)",
        ),
    ] = None,
    group: Group = None,
    device: Device = None,
    confidence: Confidence = 0.95,
    estimator: Estimator = "avg",
    model: BayesModel = "mean",
    prior: PriorText = None,
    exclude: Exclude = "none",
    quantile: Annotated[
        float | None,
        Query(
            gt=0,
            lt=1,
            description="a quantile level: each point's quantile of the readings beside its "
            f"average, with its interval (docs/distribution.md; at most {MAX_QUANTILE_POINTS} "
            "points)",
        ),
    ] = None,
) -> SeriesOut:
    """The average per interval (for charts); intervals without readings are omitted. Points
    are aligned to the clock: they begin at `start` when it is given, else at UTC multiples
    of the interval (an hour's points at whole hours, a day's at midnight UTC). With
    estimator=bayes, each point's Bayes estimate beside its AVG* (docs/bayes.md); with
    quantile=Q, each point's quantile Q as /distribution estimates it."""
    stream = stream_or_404(db, name)
    step = interval or stream.bucket_seconds
    if step % stream.bucket_seconds:
        raise invalid(
            "query",
            "interval_seconds",
            f"interval_seconds must be a multiple of the stream's bucket "
            f"({stream.bucket_seconds} s), got {step}",
        )
    per = step // stream.bucket_seconds
    params = store.params_of(stream)
    read = bayes_reader(params, model, prior, confidence) if estimator == "bayes" else None
    devices = selected_devices(db, stream, group, device)
    excluded: list[str] = []
    first, stop = window(stream, start, end)
    if exclude == "implausible":
        devices, excluded = store.without_implausible(db, stream, params, first, stop, devices)
    span = store.closed_window(db, stream, first, stop)
    empty = SeriesOut(
        stream=name,
        interval_seconds=step,
        group=group,
        device=device,
        confidence=confidence,
        points=[],
        excluded=excluded,
    )
    if span is None:
        return empty
    # Points lie on the clock: from start's bucket when start is given, else at multiples of
    # the interval since the epoch (UTC), not from the first bucket that holds data.
    origin = first if start is not None else 0
    first, stop = span
    first = origin + (first - origin) // per * per
    most = MAX_POINTS if quantile is None else MAX_QUANTILE_POINTS
    if (stop - first) / per > most:
        raise invalid(
            "query",
            "interval_seconds",
            f"more than {most} points{' with a quantile' if quantile is not None else ''}; "
            "choose a longer interval or a shorter window",
        )
    size = stream.bucket_seconds * 1000
    sums = store.series_sums(db, stream, first, stop, buckets_per_point=per, device_ids=devices)
    codes = (
        _point_codes(db, stream, (first, stop), per, devices) if read and model != "mean" else {}
    )
    points = []
    for b, s in sums.items():
        found = store.estimate(params, s, confidence)
        point = PointOut(
            start=as_datetime(b * size),
            end=as_datetime((b + per) * size),
            n=s.n,
            estimate=estimate_out(found),
        )
        if read is not None:
            point.bayes = read(s.n, found.mean if found else None, codes.get(b))
        if quantile is not None and s.n:
            point.quantile = _point_quantile(db, stream, params, (b, b + per), devices, quantile)
        points.append(point)
    empty.points = points
    return empty


def _point_quantile(
    db: Db,
    stream: Stream,
    params: Zeal,
    span: tuple[int, int],
    devices: store.Devices,
    level: float,
) -> QuantileOut:
    """A series point's quantile, as /distribution answers it for the point's window."""
    codes = store.device_codes(db, stream, params, span, devices)
    found, boot = quantiles_of(params, codes, (level,), (), 0.95)
    low, high = boot.quantiles[level] if boot else (None, None)
    return QuantileOut(q=level, value=found.quantile(level), low=low, high=high)


def _point_codes(
    db: Db, stream: Stream, span: tuple[int, int], per: int, devices: store.Devices
) -> dict[int, np.ndarray]:
    """The window's codes grouped by series point (keyed by the point's first bucket)."""
    first, stop = span
    grouped: dict[int, list[np.ndarray]] = {}
    for bucket, codes in window_codes(db, stream, first, stop, devices).items():
        grouped.setdefault(first + (bucket - first) // per * per, []).append(codes)
    return {k: np.concatenate(v) for k, v in grouped.items()}
