"""Two device groups compared (``zeal.compare``): devices are the independent units;
readings only when asked (``unit=reading``). And the planner of such a
comparison (``zeal.planning.comparison``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from zeal import ParameterError, Zeal
from zeal import compare as methods
from zeal.errors import FitError
from zeal.estimate import cut, difference_of
from zeal_server import store
from zeal_server.api.deps import (
    API,
    READ,
    Confidence,
    Db,
    End,
    Start,
    devices_in,
    invalid,
    stream_or_404,
    window,
)
from zeal_server.api.schemas import HEAVY, CompareOut

__all__ = ["router"]

router = APIRouter()

Method = Literal["cluster", "device_means", "trimmed", "winsorized", "censored"]
#: Withdrawn: time blocks hold the same devices, so their differences are not independent.
WITHDRAWN = "paired_blocks"


Rows = tuple[list[int], list[int]]  # readings and exact sums of codes, per partition


def _partitions(params: Zeal, rows: Rows) -> methods.Partitions:
    """Readings and decoded sums (AVG* times n, from the exact code sums) per partition."""
    counts, codes = rows
    return methods.Partitions.of(counts, params.decoded_sums(counts, codes))


@router.get(
    f"{API}/streams/{{name}}/compare", dependencies=READ, response_model=CompareOut, responses=HEAVY
)
def compare(
    name: str,
    db: Db,
    a: Annotated[str, Query(alias="group_a", description="first group, key:value", max_length=200)],
    b: Annotated[
        str, Query(alias="group_b", description="second group, key:value", max_length=200)
    ],
    start: Start = None,
    end: End = None,
    confidence: Confidence = 0.95,
    unit: Annotated[
        Literal["device", "reading"],
        Query(
            alias="independent",
            description="the independent units: devices (default; readings of one device "
            "are correlated) or readings (valid only if every reading is independent)",
        ),
    ] = "device",
    method: Annotated[
        Method | Literal["paired_blocks"],
        Query(
            description="cluster: reading-weighted means, device-level cluster-robust "
            "standard error (default); device_means: mean of device means, Welch; "
            "trimmed, winsorized, censored: robust means of each group's device means "
            "(their estimand is named in the answer). paired_blocks was withdrawn (422): "
            "its time blocks hold the same devices, so they are not independent"
        ),
    ] = "cluster",
    block_seconds: Annotated[
        int | None,
        Query(
            ge=1,
            description="withdrawn with paired_blocks (422 when given): time blocks of the "
            "same devices are not independent units",
        ),
    ] = None,
    proportion: Annotated[
        float,
        Query(
            ge=0,
            lt=0.5,
            description="share of each group's device means cut at each end (robust "
            "methods; with censored and proportion_upper, at the low end): round(P * "
            "proportion) of P",
        ),
    ] = 0.1,
    proportion_upper: Annotated[
        float | None,
        Query(
            ge=0,
            lt=0.5,
            description="censored only: share censored at the high end (paper 003's beta; "
            "default: proportion)",
        ),
    ] = None,
    allow_overlap: Annotated[
        bool, Query(description="compare groups that share devices (refused otherwise)")
    ] = False,
) -> CompareOut:
    """Difference of two device groups' averages (A minus B) with its standard error,
    degrees of freedom, CI and two-sided p-value, by the chosen method (docs/comparison.md)."""
    if method == WITHDRAWN or block_seconds is not None:
        raise invalid(
            "query",
            "block_seconds" if block_seconds is not None else "method",
            "paired time blocks were withdrawn: every block holds the same devices, so each "
            "device's effect enters every block difference and the standard error is far too "
            "small (docs/comparison.md); compare devices with method=cluster, device_means, "
            "trimmed, winsorized or censored",
        )
    if proportion_upper is not None and method != "censored":
        raise invalid(
            "query", "proportion_upper", "proportion_upper applies to method=censored only"
        )
    stream = stream_or_404(db, name)
    first, stop = window(stream, start, end)
    params = store.params_of(stream)
    groups = [devices_in(db, stream, g) for g in (a, b)]
    reading = unit == "reading"
    per_device = [store.device_sums(db, stream, first, stop, g, squares=reading) for g in groups]
    shared = per_device[0].ids & per_device[1].ids
    if shared and not allow_overlap:
        raise invalid(
            "query",
            "group_b",
            f"groups {a} and {b} share {len(shared)} device(s) with readings: a comparison "
            "needs disjoint groups (allow_overlap=true compares them anyway)",
        )
    # the groups' averages (AVG*), from the same read as the partitions
    means = [params.mean_of_sums(p.n, p.total_codes) if p.n > 1 else None for p in per_device]
    out = CompareOut(
        stream=name,
        group_a=a,
        group_b=b,
        a=a,
        b=b,
        n_a=per_device[0].n,
        n_b=per_device[1].n,
        mean_a=means[0],
        mean_b=means[1],
        confidence=confidence,
        independent=unit,
        unit=unit,
        method="reading" if reading else method,
        estimand=methods.estimand(
            "reading" if reading else method,
            proportion,
            proportion_upper if method == "censored" else None,
        ),
        warnings=[f"groups {a} and {b} share {len(shared)} device(s)"] if shared else [],
    )
    if reading:
        est = [
            (
                None
                if p.n < 2
                else store.estimate(params, p.total, confidence)
                if params.grid_points is None
                else store.clustered(params, p.counts, p.sum_codes, confidence)
            )
            for p in per_device
        ]
        if est[0] and est[1]:
            found = difference_of(est[0], est[1], confidence)
            out.difference, out.std_error = found.difference, found.std_error
            out.ci, out.p_value = _cut(found.ci, params), found.p_value
        return out
    rows = (
        (per_device[0].counts, per_device[0].sum_codes),
        (per_device[1].counts, per_device[1].sum_codes),
    )
    return _fill(out, method, rows, params, proportion=(proportion, proportion_upper))


def _cut(ci: tuple[float, float] | None, params: Zeal) -> tuple[float, float] | None:
    """A difference's interval cut to what a difference of two values of the stream can be
    (its range's width either way, zeal.estimate.cut): every method's estimand lies there."""
    if ci is None:
        return None
    width = params.upper - params.lower
    return cut(ci[0], ci[1], -width, width)


def _fill(
    out: CompareOut,
    method: str,
    rows: tuple[Rows, Rows],
    params: Zeal,
    *,
    proportion: tuple[float, float | None],
) -> CompareOut:
    """The comparison of the partitions, or the reason there is none (a warning)."""
    level = out.confidence
    try:
        pa, pb = (_partitions(params, r) for r in rows)
        if method == "cluster":
            found = methods.cluster_weighted(pa, pb, confidence=level)
        elif method == "device_means":
            found = methods.device_means(pa, pb, confidence=level)
        elif method == "censored":
            low, high = proportion
            found = methods.censored(pa, pb, proportion=low, upper=high, confidence=level)
        else:
            robust = methods.trimmed if method == "trimmed" else methods.winsorized
            found = robust(pa, pb, proportion=proportion[0], confidence=level)
    except FitError as exc:
        raise invalid("query", "method", f"no {method} comparison: {exc}") from exc
    except ParameterError as exc:
        out.warnings.append(f"no {method} comparison: {exc}")
        return out
    out.method, out.estimand = found.method, found.estimand
    out.difference, out.std_error, out.df = found.difference, found.std_error, found.df
    out.ci, out.p_value = _cut(found.ci, params), found.p_value
    out.partitions, out.smallest, out.median = found.partitions, found.smallest, found.median
    out.warnings.extend(found.warnings)
    return out
