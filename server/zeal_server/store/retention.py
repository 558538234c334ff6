"""Deleting stored data on purpose: a stream's retention, one device's data; and the
collector's periodic housekeeping.

* :func:`expire` deletes the readings of *whole buckets* older than the stream's retention:
  the segment rows that lie before the cutoff, and from a chunk that reaches past it the
  readings before it (the chunk is written again without them), so every bucket left is
  untouched and every average over the kept window is exactly what it was. The stream's
  dedup horizon moves up to the cutoff: the ingest refuses readings older than it
  (``too_old``), so no batch of the deleted buckets can come back.
* :func:`delete_device_data` removes one device's readings from every segment row that
  holds some (each row written again without them), and its ledger, tags and device row
  (with its sequence state).
* :func:`housekeep` compacts closed buckets, expires, counts the gaps behind the import
  window (``ZEAL_MAX_AGE_SECONDS``) as missing and prunes the privacy ledger behind it:
  state that can no longer change any outcome.

The caller owns the transaction (functions take a session and never commit).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select, tuple_
from sqlalchemy.orm import Session

from zeal_server.store.compaction import chunk_rows, compact, delete_rows
from zeal_server.store.ledger import prune as prune_ledger
from zeal_server.store.models import Device, DevicePeriod, DeviceTag, Segment, Stream
from zeal_server.store.segments import PART, Columns, decode, encode_part, limb_sums
from zeal_server.store.sequences import prune as prune_sequences
from zeal_server.store.sums import VALUE_COLUMNS
from zeal_server.store.versions import bump_caps

__all__ = [
    "MAX_RETENTION_DAYS",
    "cutoff_ms",
    "delete_device_data",
    "expire",
    "housekeep",
]

log = logging.getLogger(__name__)

#: Retention is 1 day to 100 years.
MAX_RETENTION_DAYS = 36_500
DAY_MS = 86_400_000
#: Periods compacted per stream in one housekeeping at most (the rest in the next ones): a
#: database upgraded from before revision 0007 is converted a few days at a time.
HOUSEKEEPING_PERIODS = 64
_KEY = (Segment.first_bucket, Segment.last_bucket, Segment.tag)


def cutoff_ms(stream: Stream, now_ms: int) -> int | None:
    """The start of the oldest bucket kept: retention_days before now, rounded down to a
    bucket boundary; None without retention."""
    if stream.retention_days is None:
        return None
    size = stream.bucket_seconds * 1000
    return (now_ms - stream.retention_days * DAY_MS) // size * size


def expire(session: Session, stream: Stream, now_ms: int) -> int:
    """Delete the stream's readings of buckets older than its retention; returns how many."""
    cutoff = cutoff_ms(stream, now_ms)
    if cutoff is None:
        return 0
    first_kept = cutoff // (stream.bucket_seconds * 1000)
    gone = Segment.stream_id == stream.id, Segment.last_bucket < first_kept
    readings = int(session.scalar(select(func.coalesce(func.sum(Segment.n), 0)).where(*gone)) or 0)
    session.execute(delete(Segment).where(*gone))
    straddling = session.execute(
        select(*_KEY, Segment.encoding, Segment.data)
        .where(Segment.stream_id == stream.id, Segment.first_bucket < first_kept)
        .order_by(*_KEY)
        .with_for_update()
    ).all()
    size = stream.bucket_seconds * 1000
    for row in straddling:
        columns = decode(row.data, row.encoding, stream.payload_bits)
        keep = columns.timestamps // size >= first_kept
        readings += int(np.count_nonzero(~keep))
        _rewrite(session, stream, row, columns.take(keep))
    prune_sequences(session, stream.id, cutoff)
    return readings


def _rewrite(session: Session, stream: Stream, row: Any, columns: Columns) -> None:
    """Replace a segment row by one holding `columns` (none: the row goes)."""
    delete_rows(session, stream, [row])
    if not len(columns):
        return
    if row.encoding == PART:
        sums = limb_sums(columns.codes, np.zeros(1, dtype=np.int64), stream.payload_bits)[0]
        size = stream.bucket_seconds * 1000
        rows = [
            {
                "stream_id": stream.id,
                "first_bucket": int(columns.timestamps.min()) // size,
                "last_bucket": int(columns.timestamps.max()) // size,
                "tag": row.tag,
                "encoding": PART,
                "data": encode_part(columns, stream.payload_bits),
                **dict(zip(VALUE_COLUMNS, sums.tolist(), strict=True)),
            }
        ]
    else:
        rows = chunk_rows(stream, columns)
    session.execute(insert(Segment), rows)


def delete_device_data(session: Session, stream: Stream, device: Device) -> int:
    """Delete everything stored of one device of the stream; returns its readings."""
    readings = 0
    keys = session.execute(
        select(*_KEY)
        .where(Segment.stream_id == stream.id)
        .order_by(*_KEY)  # one order for every writer: no deadlock
        .with_for_update()
    ).all()
    for start in range(0, len(keys), 256):  # the rows' data a few at a time
        rows = session.execute(
            select(*_KEY, Segment.encoding, Segment.data)
            .where(Segment.stream_id == stream.id)
            .where(tuple_(*_KEY).in_([tuple(k) for k in keys[start : start + 256]]))
            .order_by(*_KEY)
        ).all()
        for row in rows:
            columns = decode(row.data, row.encoding, stream.payload_bits)
            theirs = columns.devices == device.id
            if theirs.any():
                readings += int(np.count_nonzero(theirs))
                _rewrite(session, stream, row, columns.take(~theirs))
    session.execute(delete(DeviceTag).where(DeviceTag.device_id == device.id))
    bump_caps(session)  # its tags' caps no longer apply to it here
    session.execute(delete(DevicePeriod).where(DevicePeriod.device_id == device.id))
    session.execute(delete(Device).where(Device.id == device.id))
    return readings


def housekeep(
    session: Session,
    streams: list[Stream],
    now_ms: int,
    *,
    max_age_ms: int | None,
    max_periods: int | None = HOUSEKEEPING_PERIODS,
) -> None:
    """The collector's periodic housekeeping: compact each stream's closed buckets (into the
    open chunks of their periods: compaction.compact), delete what is past its retention, then
    move each stream's dedup horizon to the import window (now - `max_age_ms`: older
    batches are refused anyway), count its devices' gaps behind it as missing, and delete
    the ledger's days and hours behind it. The horizons are moved last, so the stream rows
    are locked only from there to the commit."""
    for stream in streams:
        closed = now_ms // (stream.bucket_seconds * 1000) - 1
        compact(session, stream, before_bucket=closed, max_periods=max_periods)
        expired = expire(session, stream, now_ms)
        if expired:
            log.info(
                "deleted %d readings of %s older than its retention of %d days",
                expired,
                stream.name,
                stream.retention_days,
            )
    if max_age_ms is None:
        return
    for stream in streams:
        prune_sequences(session, stream.id, now_ms - max_age_ms)
    prune_ledger(session, now_ms - max_age_ms)
