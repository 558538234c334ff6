"""Exact sums over time buckets: the 24-bit limbs the aggregates are kept in, the window
and series sums averages read, and bucket alignment (the only home of the open-window
sentinels, +-2**62 buckets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    cast,
    func,
    select,
)
from sqlalchemy.orm import Session

from zeal import (
    Estimate,
    Zeal,
)
from zeal_server.models import (
    LIMB_BITS,
    SQUARE_LIMBS,
    SUM_LIMBS,
    Aggregate,
    BucketTotal,
    Stream,
)

_LIMB_MASK = (1 << LIMB_BITS) - 1
SUM_COLUMNS = [f"s{i}" for i in range(SUM_LIMBS)]
SQUARE_COLUMNS = [f"q{i}" for i in range(SQUARE_LIMBS)]
VALUE_COLUMNS = ["n", *SUM_COLUMNS, *SQUARE_COLUMNS]


def to_limbs(value: int, count: int) -> list[int]:
    limbs = [(value >> (LIMB_BITS * i)) & _LIMB_MASK for i in range(count)]
    if value >> (LIMB_BITS * count):
        raise OverflowError(f"{value} needs more than {count} limbs")
    return limbs


def from_limbs(limbs: list[int]) -> int:
    return sum(int(v or 0) << (LIMB_BITS * i) for i, v in enumerate(limbs))


#: Which devices a sum covers: all (None), a subquery of ids (group_devices), or ids.
Devices = Select[Any] | list[int] | None


@dataclass(frozen=True)
class Sums:
    n: int
    sum_codes: int
    sum_squares: int


def _table(device_ids: Devices) -> type[Aggregate] | type[BucketTotal]:
    """Ungrouped sums read the per-bucket rollup; grouped ones the per-device rows."""
    return BucketTotal if device_ids is None else Aggregate


def _sum_columns(table: type[Aggregate] | type[BucketTotal]) -> list[ColumnElement[Any]]:
    return [
        func.coalesce(func.sum(getattr(table, c)), 0) for c in ["n", *SUM_COLUMNS, *SQUARE_COLUMNS]
    ]


def _to_sums(row: Any, offset: int = 0) -> Sums:
    values = [int(v or 0) for v in row[offset:]]
    return Sums(
        values[0], from_limbs(values[1 : 1 + SUM_LIMBS]), from_limbs(values[1 + SUM_LIMBS :])
    )


def _window(
    query: Select[Any],
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices,
) -> Select[Any]:
    table = _table(device_ids)
    query = query.where(
        table.stream_id == stream.id,
        table.bucket >= first_bucket,
        table.bucket < stop_bucket,
    )
    if device_ids is not None:
        query = query.where(Aggregate.device_id.in_(device_ids))
    return query


def window_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices = None,
) -> Sums:
    """Exact sums over buckets [first, stop) and (optionally) some devices."""
    row = session.execute(
        _window(
            select(*_sum_columns(_table(device_ids))), stream, first_bucket, stop_bucket, device_ids
        )
    ).one()
    return _to_sums(row)


@dataclass(frozen=True)
class DeviceSums:
    """One group's devices with readings in a window: their ids, readings and exact sums of
    codes (the partitions of a device-level comparison), and the group's totals from the
    same read (with the sum of squared codes only when asked for)."""

    ids: frozenset[int]
    counts: list[int]
    sum_codes: list[int]
    n: int
    total_codes: int
    total_squares: int | None
    #: The device ids in the order of `counts` and `sum_codes`.
    order: tuple[int, ...] = ()

    @property
    def total(self) -> Sums:
        if self.total_squares is None:
            raise ValueError("these sums were read without their squares")
        return Sums(self.n, self.total_codes, self.total_squares)


def device_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices = None,
    *,
    squares: bool = False,
) -> DeviceSums:
    """Exact sums over buckets [first, stop) per device (of `device_ids`, or all). Devices
    without readings are absent.

    A group can hold 100,000 devices, so the rows come straight from the driver into numpy:
    every column is a sum of one limb over a device's buckets, far below 2**63, so int64
    holds them exactly; limbs are combined into exact integers only afterwards. The squares
    (four more columns per row) are read only when asked for."""
    names = ["n", *SUM_COLUMNS, *(SQUARE_COLUMNS if squares else [])]
    limbs = [
        cast(func.coalesce(func.sum(getattr(Aggregate, c)), 0), BigInteger) for c in names
    ]  # PostgreSQL's sum(bigint) is numeric (Decimal in Python): bigint is what fits
    query = select(Aggregate.device_id, *limbs).where(
        Aggregate.stream_id == stream.id,
        Aggregate.bucket >= first_bucket,
        Aggregate.bucket < stop_bucket,
    )
    if device_ids is not None:
        query = query.where(Aggregate.device_id.in_(device_ids))
    rows = session.connection().execute(query.group_by(Aggregate.device_id)).cursor.fetchall()
    table = np.array(rows, dtype=np.int64).reshape(-1, 1 + len(names))
    columns = [int(v) for v in table[:, 1:].sum(axis=0)]
    codes = table[:, 2 : 2 + SUM_LIMBS].astype(object)
    combined = codes[:, 0]
    for i in range(1, SUM_LIMBS):
        combined = combined + (codes[:, i] << (LIMB_BITS * i))
    return DeviceSums(
        ids=frozenset(table[:, 0].tolist()),
        counts=table[:, 1].tolist(),
        sum_codes=[int(c) for c in combined],
        n=columns[0],
        total_codes=from_limbs(columns[1 : 1 + SUM_LIMBS]),
        total_squares=from_limbs(columns[1 + SUM_LIMBS :]) if squares else None,
        order=tuple(table[:, 0].tolist()),
    )


def series_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    *,
    buckets_per_point: int,
    device_ids: Devices = None,
) -> dict[int, Sums]:
    """Exact sums per point of `buckets_per_point` buckets, keyed by the point's first bucket."""
    table = _table(device_ids)
    key = ((table.bucket - first_bucket) // buckets_per_point).label("point")
    query = _window(
        select(key, *_sum_columns(table)), stream, first_bucket, stop_bucket, device_ids
    )
    rows = session.execute(query.group_by(key).order_by(key)).all()
    return {first_bucket + int(r[0]) * buckets_per_point: _to_sums(r, 1) for r in rows}


def estimate(params: Zeal, sums: Sums, confidence: float) -> Estimate | None:
    if sums.n == 0:
        return None
    return params.estimate_from_sums(
        sums.n, sums.sum_codes, sums.sum_squares, confidence=confidence
    )


#: An open window end: bucket numbers at or beyond these are "no bound" (sentinels).
_OPEN = 1 << 62
_FINITE = 1 << 61


def bucket_bounds(stream: Stream, start_ms: int | None, end_ms: int | None) -> tuple[int, int]:
    """Buckets [first, stop) covering [start, end): whole buckets, start rounded down; an
    end not given is open (a sentinel no bucket reaches)."""
    size = stream.bucket_seconds * 1000
    first = -_OPEN if start_ms is None else math.floor(start_ms / size)
    stop = _OPEN if end_ms is None else -(-end_ms // size)
    return first, stop


def window_ms(stream: Stream, first: int, stop: int) -> tuple[int | None, int | None]:
    """The buckets [first, stop) as milliseconds, None for an open end."""
    size = stream.bucket_seconds * 1000
    return (
        None if first <= -_FINITE else first * size,
        None if stop >= _FINITE else stop * size,
    )


def closed_window(
    session: Session, stream: Stream, first: int, stop: int
) -> tuple[int, int] | None:
    """The buckets [first, stop) with open (or unreachably far) ends replaced by the
    stream's first and last bucket with data, so a series knows how many points it spans;
    None when an end is open and the stream holds no data."""
    if first > -_FINITE and stop < _FINITE:
        return first, stop
    row = session.execute(
        select(func.min(BucketTotal.bucket), func.max(BucketTotal.bucket)).where(
            BucketTotal.stream_id == stream.id
        )
    ).one()
    lowest: int | None = row[0]
    highest: int | None = row[1]
    if lowest is None or highest is None:
        return None
    first = max(first, int(lowest)) if first > -_FINITE else int(lowest)
    stop = min(stop, int(highest) + 1) if stop < _FINITE else int(highest) + 1
    return first, stop
