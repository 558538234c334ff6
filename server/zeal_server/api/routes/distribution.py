"""The distribution of a window's readings: histogram, quantiles and a threshold's share,
estimated from the stored codes by zeal.distribution (docs/distribution.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from zeal import ParameterError, Zeal
from zeal import distribution as dist
from zeal_server import store
from zeal_server.api.bayesian import selected_devices
from zeal_server.api.deps import (
    API,
    READ,
    Confidence,
    Db,
    Device,
    End,
    Group,
    Start,
    bounds_out,
    echoed,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.api.schemas import (
    HEAVY,
    DistributionOut,
    QuantileOut,
    ShareOut,
    ValueOut,
)

__all__ = ["ESTIMAND", "METHOD", "QuantileLevels", "parse_levels", "quantiles_of", "router"]

router = APIRouter()

METHOD = (
    "penalized maximum likelihood over the codes' exact distribution: log-spline densities "
    f"on {dist.FINE_BINS} bins, with and without point masses at the bounds, over "
    f"{len(dist.LAMBDAS)} smoothness penalties, averaged with Akaike weights; intervals: "
    f"a bootstrap over devices ({dist.BOOTSTRAP_REPS} resamples)"
)
ESTIMAND = (
    "the distribution of all readings in the window, pooled over devices: each reading "
    "weighs the same, so a device that sends more readings weighs more"
)
#: Quantile levels one request may ask for.
MAX_LEVELS = 20

QuantileLevels = Annotated[
    str,
    Query(
        description="comma-separated levels in (0, 1), e.g. 0.5,0.9,0.95 (at most 20)",
        max_length=200,
    ),
]


def parse_levels(text: str, field: str = "quantiles") -> tuple[float, ...]:
    """Quantile levels from `text` (a 422 naming the bad one)."""
    levels: list[float] = []
    for part in text.split(","):
        try:
            level = float(part.strip())
        except ValueError:
            raise invalid("query", field, f"{part.strip()!r} is not a number") from None
        if not 0.0 < level < 1.0:  # NaN fails too
            raise invalid("query", field, f"quantile levels lie in (0, 1), got {part.strip()}")
        levels.append(level)
    if len(levels) > MAX_LEVELS:
        raise invalid("query", field, f"at most {MAX_LEVELS} quantile levels, got {len(levels)}")
    return tuple(dict.fromkeys(levels))


def quantiles_of(
    params: Zeal,
    codes: store.DeviceCodes,
    levels: tuple[float, ...],
    thresholds: tuple[float, ...],
    confidence: float,
) -> tuple[dist.Fit, dist.Bootstrap | None]:
    """The fit of a window's codes and, where offered, its bootstrap."""
    total = codes.counts.sum(axis=0)
    try:
        found = dist.fit(params, total)
        if dist.why_no_interval(params, codes.ids.size, codes.n) is not None:
            return found, None
        return found, dist.device_bootstrap(
            params,
            codes.counts,
            quantiles=levels,
            thresholds=thresholds,
            level=confidence,
            estimate=found,
        )
    except ParameterError as exc:
        raise invalid("query", None, str(exc)) from exc


@router.get(
    f"{API}/streams/{{name}}/distribution",
    dependencies=READ,
    response_model=DistributionOut,
    responses=HEAVY,
)
def distribution(
    name: str,
    db: Db,
    start: Start = None,
    end: End = None,
    group: Group = None,
    device: Device = None,
    bins: Annotated[
        int | None,
        Query(
            ge=1,
            le=dist.FINE_BINS,
            description="histogram bins over [lower, upper] (default: as many as keep each "
            "at least one code step of the stream wide)",
        ),
    ] = None,
    quantiles: QuantileLevels = "0.5,0.9,0.95",
    above: Annotated[
        float | None, Query(description="a threshold: the share of readings above it")
    ] = None,
    confidence: Confidence = 0.95,
) -> DistributionOut:
    """The distribution of the readings in [start, end) (whole buckets), estimated from
    their codes at no further privacy cost: a histogram, quantiles and the share above a
    threshold, each with an interval from a bootstrap over devices where the window holds
    enough devices (`intervals` says why not). An empty window is a 422."""
    stream = stream_or_404(db, name)
    levels = parse_levels(quantiles)
    thresholds: tuple[float, ...] = ()
    if above is not None:
        if not stream.lower <= above <= stream.upper:  # NaN fails too
            raise invalid(
                "query",
                "above",
                f"the threshold must lie in the stream's range [{stream.lower}, "
                f"{stream.upper}], got {above}",
            )
        thresholds = (above,)
    params = store.params_of(stream)
    first, stop = window(stream, start, end)
    wanted = selected_devices(db, stream, group, device)
    codes = store.device_codes(db, stream, params, (first, stop), wanted)
    if codes.n == 0:
        raise invalid("query", "start", "the window holds no readings: nothing to estimate")
    found, boot = quantiles_of(params, codes, levels, thresholds, confidence)
    edges, masses = found.histogram(bins or dist.default_bins(params))
    lo, hi = bounds_out(stream, first, stop)

    def ends(pair: tuple[float, float] | None) -> dict[str, float | None]:
        return {"low": None, "high": None} if pair is None else {"low": pair[0], "high": pair[1]}

    return DistributionOut(
        stream=name,
        start=echoed(start, lo),
        end=echoed(end, hi),
        group=group,
        device=device,
        n=codes.n,
        devices=int(codes.ids.size),
        confidence=confidence,
        edges=edges.tolist(),
        probabilities=masses.tolist(),
        quantiles=[
            QuantileOut(q=q, value=found.quantile(q), **ends(boot.quantiles[q] if boot else None))
            for q in levels
        ],
        above=None
        if above is None
        else ShareOut(
            threshold=above,
            share=found.share_above(above),
            **ends(boot.above[above] if boot else None),
        ),
        mean=ValueOut(value=found.mean(), **ends(boot.mean if boot else None)),
        intervals=dist.why_no_interval(params, int(codes.ids.size), codes.n),
        method=METHOD,
        estimand=ESTIMAND,
    )
