"""Exact sums over time buckets, read from the segments: of a window, per point of a series,
per device; and bucket alignment (the only home of the open-window sentinels, +-2**62
buckets).

A segment row carries the limb sums of all its readings, so the rows a window holds whole
are summed in SQL; a row that reaches past the window's edges, or any row when only some
devices are asked for, is decoded and its readings counted one by one (integer arithmetic
throughout, so every figure is exact). A row never crosses a period (about a day of
buckets), so the rows a window touches start at or after its first period.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.orm import Session

from zeal import Estimate, Zeal, exact_sum, exact_sum_squares
from zeal.distribution import code_index, code_rows
from zeal.longitudinal import clustered_estimate
from zeal_server.store.models import LIMB_BITS, SQUARE_LIMBS, SUM_LIMBS, Segment, Stream
from zeal_server.store.segments import LIMBS, decode, decode_runs

_LIMB_MASK = (1 << LIMB_BITS) - 1
SUM_COLUMNS = [f"s{i}" for i in range(SUM_LIMBS)]
SQUARE_COLUMNS = [f"q{i}" for i in range(SQUARE_LIMBS)]
VALUE_COLUMNS = ["n", *SUM_COLUMNS, *SQUARE_COLUMNS]
#: Buckets per period: a segment row never spans two (compaction merges within one).
PERIOD_SECONDS = 86_400


def to_limbs(value: int, count: int) -> list[int]:
    limbs = [(value >> (LIMB_BITS * i)) & _LIMB_MASK for i in range(count)]
    if value >> (LIMB_BITS * count):
        raise OverflowError(f"{value} needs more than {count} limbs")
    return limbs


def from_limbs(limbs: list[int]) -> int:
    return sum(int(v or 0) << (LIMB_BITS * i) for i, v in enumerate(limbs))


def period_buckets(stream: Stream) -> int:
    """Buckets per period (about a day; one bucket if buckets are a day or longer)."""
    return max(1, PERIOD_SECONDS // stream.bucket_seconds)


#: Which devices a sum covers: all (None), a subquery of ids (group_devices), or ids.
Devices = Select[Any] | list[int] | None


@dataclass(frozen=True)
class Sums:
    n: int
    sum_codes: int
    sum_squares: int

    @staticmethod
    def of(limbs: npt.NDArray[np.int64] | list[Any]) -> Sums:
        values = [int(v) for v in limbs]
        return Sums(
            values[0], from_limbs(values[1 : 1 + SUM_LIMBS]), from_limbs(values[1 + SUM_LIMBS :])
        )


def _sum_columns() -> list[ColumnElement[Any]]:
    return [func.coalesce(func.sum(getattr(Segment, c)), 0) for c in VALUE_COLUMNS]


def touching(stream: Stream, first: int, stop: int) -> list[ColumnElement[bool]]:
    """The rows holding readings of buckets [first, stop)."""
    where = [Segment.stream_id == stream.id, Segment.first_bucket < stop]
    where.append(Segment.last_bucket >= first)
    if first > -_FINITE:
        size = period_buckets(stream)
        where.append(Segment.first_bucket >= first // size * size)
    return where


def _inside(stream: Stream, first: int, stop: int) -> list[ColumnElement[bool]]:
    """The rows whose readings all lie in buckets [first, stop)."""
    return [
        Segment.stream_id == stream.id,
        Segment.first_bucket >= first,
        Segment.last_bucket < stop,
    ]


class _Members:
    """Membership of device ids in a set, by table lookup."""

    def __init__(self, ids: npt.NDArray[np.int64]) -> None:
        self.top = int(ids.max()) if ids.size else -1
        self.table = np.zeros(self.top + 2, dtype=bool)
        self.table[ids[ids >= 0]] = True

    def __call__(self, devices: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        found: npt.NDArray[np.bool_] = self.table[np.clip(devices, -1, self.top + 1)]
        return found


def _members(session: Session, device_ids: Devices) -> _Members | None:
    if device_ids is None:
        return None
    ids = list(session.scalars(device_ids)) if isinstance(device_ids, Select) else device_ids
    return _Members(np.asarray(ids, dtype=np.int64))


def _readings(
    session: Session,
    stream: Stream,
    where: list[ColumnElement[bool]],
    window: tuple[int, int],
    *,
    members: _Members | None,
    times: bool = False,
) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]]:
    """(devices, codes, timestamps) of the readings of buckets `window` [first, stop) (of
    the member devices) in the rows `where` selects, row by row, each row's in its stored
    order. A row that lies inside the window is read without its timestamps (an empty
    array stands for them) unless `times`."""
    first, stop = window
    size = stream.bucket_seconds * 1000
    query = (
        select(Segment.first_bucket, Segment.last_bucket, Segment.encoding, Segment.data)
        .where(*where)
        .order_by(Segment.first_bucket, Segment.last_bucket, Segment.tag)
        .execution_options(yield_per=256)
    )
    k = stream.payload_bits
    none = np.zeros(0, dtype=np.int64)
    for low, high, encoding, data in session.execute(query):
        if not times and low >= first and high < stop:
            codes, run_devices, lengths = decode_runs(data, encoding, k)
            if members is not None:
                runs = members(run_devices)
                codes = codes[np.repeat(runs, lengths)]
                run_devices, lengths = run_devices[runs], lengths[runs]
            yield np.repeat(run_devices, lengths), codes, none
            continue
        columns = decode(data, encoding, k)
        keep = None if members is None else members(columns.devices)
        if low < first or high >= stop:
            buckets = columns.timestamps // size
            inside = (buckets >= first) & (buckets < stop)
            keep = inside if keep is None else keep & inside
        if keep is not None:
            columns = columns.take(keep)
        yield columns.devices, columns.codes, columns.timestamps


def window_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices = None,
) -> Sums:
    """Exact sums over buckets [first, stop) and (optionally) some devices."""
    members = _members(session, device_ids)
    total = np.zeros(LIMBS, dtype=np.int64)
    where = touching(stream, first_bucket, stop_bucket)
    if members is None:
        inside = _inside(stream, first_bucket, stop_bucket)
        total += np.array(session.execute(select(*_sum_columns()).where(*inside)).one(), np.int64)
        where.append((Segment.first_bucket < first_bucket) | (Segment.last_bucket >= stop_bucket))
    window = (first_bucket, stop_bucket)
    found = [c for _, c, _ in _readings(session, stream, where, window, members=members)]
    codes = np.concatenate(found) if found else np.zeros(0, dtype=np.uint64)
    k = stream.payload_bits
    base = Sums.of(total)
    return Sums(
        base.n + int(codes.size),
        base.sum_codes + exact_sum(codes, k),
        base.sum_squares + exact_sum_squares(codes, k),
    )


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
    """Exact sums over buckets [first, stop) per device (of `device_ids`, or all), in
    ascending device order. Devices without readings are absent."""
    members = _members(session, device_ids)
    where = touching(stream, first_bucket, stop_bucket)
    window = (first_bucket, stop_bucket)
    rows = _readings(session, stream, where, window, members=members)
    found = _grouped(((d, c) for d, c, _ in rows), stream.payload_bits, squares=squares)
    ids = found.keys.tolist()
    return DeviceSums(
        ids=frozenset(ids),
        counts=found.counts,
        sum_codes=found.sums,
        n=sum(found.counts),
        total_codes=sum(found.sums),
        total_squares=None if found.squares is None else sum(found.squares),
        order=tuple(ids),
    )


@dataclass(frozen=True)
class DeviceCodes:
    """The codes of a window counted per device: ``ids`` ascending, ``counts[i, row]``
    device ``ids[i]``'s readings with a code of that row (zeal.distribution.code_rows: one
    code a row but on the widest streams), the input of zeal.distribution."""

    ids: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]

    @property
    def n(self) -> int:
        return int(self.counts.sum())


def device_codes(
    session: Session,
    stream: Stream,
    params: Zeal,
    window: tuple[int, int],
    device_ids: Devices = None,
) -> DeviceCodes:
    """The codes of buckets [first, stop) per device (of `device_ids`, or all); devices
    without readings are absent."""
    members = _members(session, device_ids)
    where = touching(stream, *window)
    width = code_rows(params)
    devices: list[npt.NDArray[np.int64]] = []
    codes: list[npt.NDArray[np.int64]] = []
    for d, c, _ in _readings(session, stream, where, window, members=members):
        devices.append(d)
        codes.append(code_index(params, c))
    if not devices:
        return DeviceCodes(np.zeros(0, np.int64), np.zeros((0, width), np.int64))
    ids, index = np.unique(np.concatenate(devices), return_inverse=True)
    flat = np.bincount(index * width + np.concatenate(codes), minlength=ids.size * width)
    return DeviceCodes(ids.astype(np.int64), flat.reshape(ids.size, width).astype(np.int64))


@dataclass(frozen=True)
class _Grouped:
    """Readings counted and summed by a non-negative integer key, exactly."""

    keys: npt.NDArray[np.int64]
    counts: list[int]
    sums: list[int]
    squares: list[int] | None


#: bincount adds float64 weights: pieces of 14 bits keep every partial sum an integer below
#: 2**53 (exact) for fewer than 2**39 readings per key. Codes are at most 28 bits.
_PIECE = 14


def _grouped(
    parts: Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]],
    payload_bits: int,
    *,
    squares: bool,
) -> _Grouped:
    """The keys found in `parts` ((keys, codes) pairs; keys >= 0), ascending, with each
    key's count and exact sums of codes (and of squared codes) over every part."""
    pairs = [(k, c) for k, c in parts if k.size]
    if not pairs:
        return _Grouped(np.zeros(0, dtype=np.int64), [], [], [] if squares else None)
    keys = np.concatenate([k for k, _ in pairs])
    codes = np.concatenate([c for _, c in pairs])
    if payload_bits > 2 * _PIECE:
        raise ValueError(f"codes of {payload_bits} bits are wider than the store keeps")
    counts = np.bincount(keys)
    found = np.flatnonzero(counts)
    mask = np.uint64((1 << _PIECE) - 1)

    def summed(values: npt.NDArray[np.uint64], pieces: int) -> list[int]:
        total = np.zeros(found.size, dtype=object)
        for i in range(pieces):
            piece = ((values >> np.uint64(_PIECE * i)) & mask).astype(np.float64)
            weights = np.bincount(keys, weights=piece, minlength=counts.size)[found]
            total = total + (weights.astype(np.int64).astype(object) << (_PIECE * i))
        return [int(v) for v in total]

    return _Grouped(
        found.astype(np.int64),
        counts[found].tolist(),
        summed(codes, 2),
        summed(codes * codes, 4) if squares else None,
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
    members = _members(session, device_ids)
    size, per = stream.bucket_seconds * 1000, buckets_per_point
    where = touching(stream, first_bucket, stop_bucket)
    points: dict[int, Sums] = {}
    if members is None:  # rows inside one point are summed whole, in SQL
        point = (Segment.first_bucket - first_bucket) // per
        whole = [*_inside(stream, first_bucket, stop_bucket)]
        whole.append(point == (Segment.last_bucket - first_bucket) // per)
        query = select(point, *_sum_columns()).where(*whole).group_by(point)
        for p, *values in session.execute(query):
            points[int(p)] = Sums.of(values)
        where.append(point != (Segment.last_bucket - first_bucket) // per)
    window = (first_bucket, stop_bucket)
    rows = _readings(session, stream, where, window, members=members, times=True)
    found = _grouped(
        (((t // size - first_bucket) // per, c) for _, c, t in rows),
        stream.payload_bits,
        squares=True,
    )
    assert found.squares is not None
    for p, n, total, squared in zip(
        found.keys.tolist(), found.counts, found.sums, found.squares, strict=True
    ):
        had = points.get(p, Sums(0, 0, 0))
        points[p] = Sums(had.n + n, had.sum_codes + total, had.sum_squares + squared)
    return {first_bucket + p * per: points[p] for p in sorted(points)}


def device_series_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    *,
    buckets_per_point: int,
    device_ids: Devices = None,
) -> dict[int, tuple[list[int], list[int]]]:
    """Per point of `buckets_per_point` buckets (keyed by its first bucket), each device's
    readings and exact sum of codes (a longitudinal stream's series: its standard errors
    come from devices). Every row is decoded."""
    members = _members(session, device_ids)
    size, per = stream.bucket_seconds * 1000, buckets_per_point
    window = (first_bucket, stop_bucket)
    where = touching(stream, first_bucket, stop_bucket)
    parts = [
        ((t // size - first_bucket) // per, d, c)
        for d, c, t in _readings(session, stream, where, window, members=members, times=True)
    ]
    if not parts:
        return {}
    points = np.concatenate([p for p, _, _ in parts])
    devices = np.concatenate([d for _, d, _ in parts])
    keys, inverse = np.unique(np.stack([points, devices], axis=1), axis=0, return_inverse=True)
    codes = np.concatenate([c for _, _, c in parts])
    found = _grouped(
        iter([(inverse.ravel().astype(np.int64), codes)]), stream.payload_bits, squares=False
    )
    out: dict[int, tuple[list[int], list[int]]] = {}
    for k, n, total in zip(found.keys.tolist(), found.counts, found.sums, strict=True):
        counts, sums = out.setdefault(first_bucket + int(keys[k, 0]) * per, ([], []))
        counts.append(n)
        sums.append(total)
    return dict(sorted(out.items()))


def clustered(
    params: Zeal, counts: list[int], sum_codes: list[int], confidence: float
) -> Estimate | None:
    """A longitudinal stream's estimate from its devices' sums (zeal.longitudinal)."""
    if not counts or sum(counts) == 0:
        return None
    return clustered_estimate(params, counts, sum_codes, confidence=confidence)


def window_estimate(
    session: Session,
    stream: Stream,
    params: Zeal,
    window: tuple[int, int],
    *,
    device_ids: Devices,
    confidence: float,
) -> tuple[int, Estimate | None]:
    """A window's readings and the estimate of their average: from the exact sums, or on a
    longitudinal stream from each device's (its codes repeat: errors from devices)."""
    if params.grid_points is None:
        sums = window_sums(session, stream, *window, device_ids)
        return sums.n, estimate(params, sums, confidence)
    per = device_sums(session, stream, *window, device_ids)
    return per.n, clustered(params, per.counts, per.sum_codes, confidence)


def series_estimates(
    session: Session,
    stream: Stream,
    params: Zeal,
    window: tuple[int, int],
    *,
    buckets_per_point: int,
    device_ids: Devices,
    confidence: float,
) -> dict[int, tuple[int, Estimate | None]]:
    """Per point of a series (keyed by its first bucket): its readings and the estimate of
    their average, as window_estimate gives them."""
    if params.grid_points is None:
        sums = series_sums(
            session, stream, *window, buckets_per_point=buckets_per_point, device_ids=device_ids
        )
        return {b: (s.n, estimate(params, s, confidence)) for b, s in sums.items()}
    per = device_series_sums(
        session, stream, *window, buckets_per_point=buckets_per_point, device_ids=device_ids
    )
    return {
        b: (sum(counts), clustered(params, counts, totals, confidence))
        for b, (counts, totals) in per.items()
    }


def estimate(params: Zeal, sums: Sums, confidence: float) -> Estimate | None:
    if sums.n == 0:
        return None
    return params.estimate_from_sums(
        sums.n, sums.sum_codes, sums.sum_squares, confidence=confidence
    )


#: An open window end: bucket numbers at or beyond these are "no bound" (sentinels).
OPEN = 1 << 62
_FINITE = 1 << 61


def bucket_bounds(stream: Stream, start_ms: int | None, end_ms: int | None) -> tuple[int, int]:
    """Buckets [first, stop) covering [start, end): whole buckets, start rounded down; an
    end not given is open (a sentinel no bucket reaches)."""
    size = stream.bucket_seconds * 1000
    first = -OPEN if start_ms is None else math.floor(start_ms / size)
    stop = OPEN if end_ms is None else -(-end_ms // size)
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
        select(func.min(Segment.first_bucket), func.max(Segment.last_bucket)).where(
            Segment.stream_id == stream.id
        )
    ).one()
    lowest: int | None = row[0]
    highest: int | None = row[1]
    if lowest is None or highest is None:
        return None
    first = max(first, int(lowest)) if first > -_FINITE else int(lowest)
    stop = min(stop, int(highest) + 1) if stop < _FINITE else int(highest) + 1
    return first, stop
