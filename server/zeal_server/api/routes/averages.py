"""Averages: the debiased average of a window and its series (what a stream, a device or a
comparison would give before the data exist: routes/preview.py)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Query

from zeal import Zeal
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
    Group,
    Start,
    as_datetime,
    bounds_out,
    echoed,
    estimate_out,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.api.routes.distribution import quantiles_of
from zeal_server.api.schemas import HEAVY, AverageOut, PointOut, QuantileOut, SeriesOut
from zeal_server.store.models import Stream

__all__ = ["router"]

router = APIRouter()
#: Points of a series with quantile=: each is a fit and a bootstrap of its own.
MAX_QUANTILE_POINTS = 100

Exclude = Annotated[
    Literal["none", "implausible"],
    Query(
        description="implausible: leave out the devices whose own readings in the window "
        "prove them dishonest (their guaranteed interval at level 1 - 1e-9 lies wholly "
        "outside [lower, upper]; docs/privacy.md); the answer names them in `excluded`"
    ),
]


def _no_bayes_on_memoized(params: Zeal, estimator: str) -> None:
    """The Bayes estimates treat every code as an independent reading, which a
    longitudinal stream's memoized codes are not: refused there, rather than overconfident."""
    if estimator == "bayes" and params.grid_points is not None:
        raise invalid(
            "query",
            "estimator",
            "a longitudinal stream's codes repeat (one memoized code per grid value and "
            "device), and the Bayes estimates would take them for independent readings: "
            "use estimator=avg, whose errors come from devices",
        )


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
    _no_bayes_on_memoized(params, estimator)
    read = bayes_reader(params, model, prior, confidence) if estimator == "bayes" else None
    devices = selected_devices(db, stream, group, device)
    excluded: list[str] = []
    if exclude == "implausible":
        devices, excluded = store.without_implausible(db, stream, params, first, stop, devices)
    n, found = store.window_estimate(
        db, stream, params, (first, stop), device_ids=devices, confidence=confidence
    )
    lo, hi = bounds_out(stream, first, stop)
    lo, hi = echoed(start, lo), echoed(end, hi)
    bayes = None
    if read is not None:
        codes = None
        if model != "mean" and n:
            per_bucket = window_codes(db, stream, first, stop, devices)
            codes = np.concatenate([*per_bucket.values(), np.zeros(0, np.int64)])
        bayes = read(n, found.mean if found else None, codes)
    return AverageOut(
        stream=name,
        start=lo,
        end=hi,
        group=group,
        device=device,
        n=n,
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
    _no_bayes_on_memoized(params, estimator)
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
    found_of = store.series_estimates(
        db,
        stream,
        params,
        (first, stop),
        buckets_per_point=per,
        device_ids=devices,
        confidence=confidence,
    )
    codes = (
        _point_codes(db, stream, (first, stop), per, devices) if read and model != "mean" else {}
    )
    points = []
    for b, (n, found) in found_of.items():
        point = PointOut(
            start=as_datetime(b * size),
            end=as_datetime((b + per) * size),
            n=n,
            estimate=estimate_out(found),
        )
        if read is not None:
            point.bayes = read(n, found.mean if found else None, codes.get(b))
        if quantile is not None and n:
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
