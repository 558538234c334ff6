"""Averages: the debiased average of a window, its series, and a preview of a stream's
parameters (two groups compared: routes/compare.py)."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query

from zeal.estimate import bernstein_half_width
from zeal.protocol import EXPONENT
from zeal_server import store
from zeal_server.deps import (
    API,
    MAX_POINTS,
    READ,
    Confidence,
    Db,
    End,
    Epsilon,
    Group,
    Lower,
    PayloadBits,
    Start,
    Upper,
    as_datetime,
    bounds_out,
    devices_in,
    estimate_out,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.schemas import AverageOut, PointOut, PreviewOut, SeriesOut

__all__ = ["router"]

router = APIRouter()


@router.get(f"{API}/preview", dependencies=READ, response_model=PreviewOut)
def preview(
    lower: Lower,
    upper: Upper,
    epsilon: Epsilon,
    payload_bits: PayloadBits = None,
    exponent: Annotated[int | None, Query(ge=EXPONENT[0], le=EXPONENT[1])] = None,
    n: Annotated[int, Query(ge=1, le=10**15, description="readings averaged")] = 10_000,
    confidence: Confidence = 0.95,
) -> PreviewOut:
    """The derived parameters of a stream and the error of an average of n readings."""
    try:
        params = store.derive_params(lower, upper, epsilon, payload_bits, exponent)
    except store.StoreError as exc:
        raise invalid("query", None, str(exc)) from exc
    variance = params.variance_bound()
    std_error = math.sqrt(variance / n)
    half = bernstein_half_width(confidence, n=n, variance=variance, bound=params.error_bound())
    return PreviewOut(
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
    )


@router.get(f"{API}/streams/{{name}}/average", dependencies=READ, response_model=AverageOut)
def average(
    name: str,
    db: Db,
    start: Start = None,
    end: End = None,
    group: Group = None,
    confidence: Confidence = 0.95,
) -> AverageOut:
    """The debiased average AVG* over whole buckets in [start, end), with its intervals."""
    stream = stream_or_404(db, name)
    first, stop = window(stream, start, end)
    sums = store.window_sums(db, stream, first, stop, devices_in(db, stream, group))
    lo, hi = bounds_out(stream, first, stop)
    return AverageOut(
        stream=name,
        start=lo,
        end=hi,
        group=group,
        n=sums.n,
        confidence=confidence,
        epsilon=stream.epsilon,
        payload_bits=stream.payload_bits,
        estimate=estimate_out(store.estimate(store.params_of(stream), sums, confidence)),
    )


@router.get(f"{API}/streams/{{name}}/series", dependencies=READ, response_model=SeriesOut)
def series(
    name: str,
    db: Db,
    start: Start = None,
    end: End = None,
    interval: Annotated[
        int | None,
        Query(
            ge=1,
            le=100 * 365 * 86400,
            description="seconds per point, a multiple of the bucket (at most 100 years)",
        ),
    ] = None,
    group: Group = None,
    confidence: Confidence = 0.95,
) -> SeriesOut:
    """The average per interval (for charts); intervals without readings are omitted."""
    stream = stream_or_404(db, name)
    step = interval or stream.bucket_seconds
    if step % stream.bucket_seconds:
        raise invalid(
            "query",
            "interval",
            f"interval must be a multiple of the stream's bucket "
            f"({stream.bucket_seconds} s), got {step}",
        )
    per = step // stream.bucket_seconds
    devices = devices_in(db, stream, group)
    first, stop = window(stream, start, end)
    span = store.closed_window(db, stream, first, stop)
    if span is None:
        return SeriesOut(
            stream=name, interval_seconds=step, group=group, confidence=confidence, points=[]
        )
    first, stop = span
    if (stop - first) / per > MAX_POINTS:
        raise invalid(
            "query",
            "interval",
            f"more than {MAX_POINTS} points; choose a longer interval or a shorter window",
        )
    params = store.params_of(stream)
    size = stream.bucket_seconds * 1000
    points = [
        PointOut(
            start=as_datetime(b * size),
            end=as_datetime((b + per) * size),
            n=s.n,
            estimate=estimate_out(store.estimate(params, s, confidence)),
        )
        for b, s in store.series_sums(
            db, stream, first, stop, buckets_per_point=per, device_ids=devices
        ).items()
    ]
    return SeriesOut(
        stream=name, interval_seconds=step, group=group, confidence=confidence, points=points
    )
