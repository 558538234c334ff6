"""Deleting stored data on purpose: a stream's retention, and one device's data.

Both keep the store's invariant that ``verify`` checks (per device and bucket, the segment
sums equal the aggregates, and the bucket totals equal the sum of the device aggregates):

* :func:`expire` deletes *whole buckets* older than the stream's retention: their segments,
  per-device aggregates and bucket totals together, so every bucket left is untouched and
  every average over the kept window is exactly what it was. Dedup rows of batches that
  arrived before the cutoff (less the allowed clock lead) go too; the ingest refuses
  readings older than the retention (``too_old``), so such a batch sent again cannot come
  back.
* :func:`delete_device_data` removes one device's readings from every bucket: its
  aggregates are subtracted from the bucket totals limb by limb (an UPDATE of ``x = x - y``,
  exact, and commutative with a collector adding to the same bucket meanwhile), its readings
  are cut out of the segments, and its dedup rows, tags and device row are deleted.

The caller owns the transaction (functions take a session and never commit).
"""

from __future__ import annotations

import logging

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from zeal_server.compaction import compact
from zeal_server.models import (
    Aggregate,
    BatchSeen,
    BucketTotal,
    Device,
    DeviceDay,
    DeviceHour,
    DeviceTag,
    Segment,
    Stream,
)
from zeal_server.segments import Columns, decode_columns, encode_columns
from zeal_server.sums import VALUE_COLUMNS

__all__ = [
    "MAX_RETENTION_DAYS",
    "cutoff_ms",
    "delete_device_data",
    "expire",
    "housekeep",
]

log = logging.getLogger("zeal_server.collector")

#: Retention is 1 day to 100 years.
MAX_RETENTION_DAYS = 36_500
DAY_MS = 86_400_000


def cutoff_ms(stream: Stream, now_ms: int) -> int | None:
    """The start of the oldest bucket kept: retention_days before now, rounded down to a
    bucket boundary; None without retention."""
    if stream.retention_days is None:
        return None
    size = stream.bucket_seconds * 1000
    return (now_ms - stream.retention_days * DAY_MS) // size * size


def expire(session: Session, stream: Stream, now_ms: int, clock_lead_ms: int = 0) -> int:
    """Delete the stream's buckets older than its retention; returns the readings deleted.
    `clock_lead_ms` is how far after its arrival a reading may be stamped (the ingest's
    max_future): dedup rows of batches received before cutoff - lead are deleted."""
    cutoff = cutoff_ms(stream, now_ms)
    if cutoff is None:
        return 0
    first_kept = cutoff // (stream.bucket_seconds * 1000)
    readings = int(
        session.scalar(
            select(func.coalesce(func.sum(BucketTotal.n), 0)).where(
                BucketTotal.stream_id == stream.id, BucketTotal.bucket < first_kept
            )
        )
        or 0
    )
    for table in (Segment, Aggregate, BucketTotal):
        session.execute(
            delete(table).where(table.stream_id == stream.id, table.bucket < first_kept)
        )
    devices = select(Device.id).where(Device.stream_id == stream.id).scalar_subquery()
    session.execute(
        delete(BatchSeen).where(
            BatchSeen.device_id.in_(devices), BatchSeen.received_ms < cutoff - clock_lead_ms
        )
    )
    return readings


def delete_device_data(session: Session, stream: Stream, device: Device) -> int:
    """Delete everything stored of one device of the stream; returns its readings."""
    rows = list(
        session.scalars(
            select(Aggregate)
            .where(Aggregate.stream_id == stream.id, Aggregate.device_id == device.id)
            .order_by(Aggregate.bucket)  # one order for every writer: no deadlock
        )
    )
    readings = sum(r.n for r in rows)
    for row in rows:
        session.execute(
            update(BucketTotal)
            .where(BucketTotal.stream_id == stream.id, BucketTotal.bucket == row.bucket)
            .values({c: getattr(BucketTotal, c) - getattr(row, c) for c in VALUE_COLUMNS})
        )
    session.execute(
        delete(BucketTotal).where(
            BucketTotal.stream_id == stream.id,
            BucketTotal.bucket.in_([r.bucket for r in rows]),
            BucketTotal.n == 0,
        )
    )
    buckets = [r.bucket for r in rows]
    for start in range(0, len(buckets), 500):
        segments = session.scalars(
            select(Segment).where(
                Segment.stream_id == stream.id, Segment.bucket.in_(buckets[start : start + 500])
            )
        )
        for segment in list(segments):
            _cut(session, segment, stream.payload_bits, device.id)
    session.execute(
        delete(Aggregate).where(Aggregate.stream_id == stream.id, Aggregate.device_id == device.id)
    )
    session.execute(delete(BatchSeen).where(BatchSeen.device_id == device.id))
    session.execute(delete(DeviceTag).where(DeviceTag.device_id == device.id))
    session.execute(delete(DeviceDay).where(DeviceDay.device_id == device.id))
    session.execute(delete(DeviceHour).where(DeviceHour.device_id == device.id))
    session.execute(delete(Device).where(Device.id == device.id))
    return readings


def _cut(session: Session, segment: Segment, payload_bits: int, device_id: int) -> None:
    """Remove one device's readings from a segment (delete it when nothing is left)."""
    columns = decode_columns(
        segment.codes,
        segment.timestamps,
        segment.devices,
        payload_bits,
        compressed=segment.compacted,
    )
    keep = columns.devices != device_id
    if keep.all():
        return
    if not keep.any():
        session.delete(segment)
        return
    kept = Columns(columns.codes[keep], columns.timestamps[keep], columns.devices[keep])
    codes, timestamps, devices = encode_columns(kept, payload_bits, compress=segment.compacted)
    segment.codes, segment.timestamps, segment.devices = codes, timestamps, devices
    segment.n = int(np.count_nonzero(keep))


def housekeep(session: Session, streams: list[Stream], now_ms: int, *, clock_lead_ms: int) -> None:
    """The collector's periodic housekeeping: compact each stream's closed buckets, and
    delete what is past its retention (whole buckets, see expire)."""
    for stream in streams:
        compact(session, stream, before_bucket=now_ms // (stream.bucket_seconds * 1000) - 1)
        expired = expire(session, stream, now_ms, clock_lead_ms=clock_lead_ms)
        if expired:
            log.info(
                "deleted %d readings of %s older than its retention of %d days",
                expired,
                stream.name,
                stream.retention_days,
            )
