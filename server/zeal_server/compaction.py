"""Segments after ingest: compaction of closed buckets, reading them back (export),
and verify (segment sums equal the aggregates); what the store occupies.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sqlalchemy import (
    Integer,
    and_,
    cast,
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session, sessionmaker

from zeal import (
    Zeal,
    exact_sum,
    exact_sum_squares,
)
from zeal_server.fleet import devices_of
from zeal_server.models import (
    SQUARE_LIMBS,
    SUM_LIMBS,
    Aggregate,
    BucketTotal,
    Device,
    Segment,
    Stream,
)
from zeal_server.segments import Columns, decode_columns, encode_columns
from zeal_server.streams import params_of
from zeal_server.sums import SQUARE_COLUMNS, SUM_COLUMNS, from_limbs


def compact(
    session: Session, stream: Stream, *, before_bucket: int | None = None, min_parts: int = 1
) -> int:
    """Merge the parts of each closed bucket into one compressed segment; returns buckets done."""
    query = (
        select(Segment.bucket)
        .where(Segment.stream_id == stream.id)
        .group_by(Segment.bucket)
        .having((func.count() > min_parts) | (func.min(cast(Segment.compacted, Integer)) == 0))
        .order_by(Segment.bucket)  # collectors compacting at once lock buckets in one order
    )
    if before_bucket is not None:
        query = query.where(Segment.bucket < before_bucket)
    done = 0
    for bucket in list(session.scalars(query)):
        # Locked: two collectors compacting one bucket at once would both merge its parts
        # (seen: every reading of a bucket twice in its segments). The second waits, then
        # finds the parts the first merged gone, and merges what is left, if anything.
        parts = list(
            session.scalars(
                select(Segment)
                .where(Segment.stream_id == stream.id, Segment.bucket == bucket)
                .order_by(Segment.id)
                .with_for_update()
            )
        )
        if len(parts) <= min_parts and all(p.compacted for p in parts):
            continue
        merged = Columns.concat([columns_of(p, stream.payload_bits) for p in parts]).sorted()
        blobs = encode_columns(merged, stream.payload_bits, compress=True)
        session.execute(delete(Segment).where(Segment.id.in_([p.id for p in parts])))
        session.add(
            Segment(
                stream_id=stream.id,
                bucket=bucket,
                n=len(merged),
                compacted=True,
                codes=blobs[0],
                timestamps=blobs[1],
                devices=blobs[2],
            )
        )
        done += 1
    return done


def columns_of(segment: Segment, payload_bits: int) -> Columns:
    """The decoded columns of one segment."""
    return decode_columns(
        segment.codes,
        segment.timestamps,
        segment.devices,
        payload_bits,
        compressed=segment.compacted,
    )


def segment_columns(
    session: Session,
    stream: Stream,
    first_bucket: int | None = None,
    stop_bucket: int | None = None,
) -> Iterator[tuple[int, Columns]]:
    query = select(Segment).where(Segment.stream_id == stream.id)
    if first_bucket is not None:
        query = query.where(Segment.bucket >= first_bucket)
    if stop_bucket is not None:
        query = query.where(Segment.bucket < stop_bucket)
    # yield_per: an ORM query otherwise loads every segment before the first is yielded.
    query = query.order_by(Segment.bucket, Segment.id).execution_options(yield_per=256)
    for segment in session.scalars(query):
        yield segment.bucket, columns_of(segment, stream.payload_bits)


def export_lines(
    session: Session,
    stream: Stream,
    first_bucket: int | None = None,
    stop_bucket: int | None = None,
) -> Iterator[str]:
    """CSV lines (header first) of the decoded per-reading estimates stored in the segments."""
    yield "timestamp_ms,device,estimate\n"
    names = {d.id: d.name for d in devices_of(session, stream)}
    params = params_of(stream)
    for _, cols in segment_columns(session, stream, first_bucket, stop_bucket):
        yield _csv(cols, names, params)


def _csv(cols: Columns, names: dict[int, str], params: Zeal) -> str:
    """The CSV lines of one segment's readings, in one string."""
    devices = [names.get(d, str(d)) for d in cols.devices.tolist()]
    values = params.decode(cols.codes).tolist()
    return "".join(
        f"{t},{d},{x!r}\n"
        for t, d, x in zip(cols.timestamps.tolist(), devices, values, strict=True)
    )


def export_chunks(
    sessions: sessionmaker[Session],
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    segments_per_chunk: int = 64,
) -> Iterator[str]:
    """export_lines for an HTTP response: each chunk of segments is read in a session of
    its own, closed before the chunk is yielded. A client that stops reading (or goes
    away) holds no database connection, however long the response stays open."""
    yield "timestamp_ms,device,estimate\n"
    with sessions() as session:
        named = select(Device.id, Device.name).where(Device.stream_id == stream.id)
        names: dict[int, str] = {int(i): str(n) for i, n in session.execute(named)}
    params = params_of(stream)
    after: tuple[int, int] | None = None
    while True:
        query = select(Segment).where(
            Segment.stream_id == stream.id,
            Segment.bucket >= first_bucket,
            Segment.bucket < stop_bucket,
        )
        if after is not None:
            query = query.where(
                or_(
                    Segment.bucket > after[0],
                    and_(Segment.bucket == after[0], Segment.id > after[1]),
                )
            )
        query = query.order_by(Segment.bucket, Segment.id).limit(segments_per_chunk)
        with sessions() as session:
            segments = list(session.scalars(query))
            chunk = "".join(
                _csv(columns_of(s, stream.payload_bits), names, params) for s in segments
            )
        if chunk:
            yield chunk
        if len(segments) < segments_per_chunk:
            return
        after = (segments[-1].bucket, segments[-1].id)


def verify(session: Session, stream: Stream) -> list[str]:
    """Compare every (device, bucket)'s segment sums with its aggregates; list mismatches."""
    from_segments: dict[tuple[int, int], list[int]] = {}
    k = stream.payload_bits
    for bucket, cols in segment_columns(session, stream):
        for device in np.unique(cols.devices):
            codes = cols.codes[cols.devices == device]
            acc = from_segments.setdefault((int(device), bucket), [0, 0, 0])
            acc[0] += int(codes.size)
            acc[1] += exact_sum(codes, k)
            acc[2] += exact_sum_squares(codes, k)
    rows = session.execute(select(Aggregate).where(Aggregate.stream_id == stream.id)).scalars()
    from_aggregates = {
        (a.device_id, a.bucket): [
            a.n,
            from_limbs([getattr(a, c) for c in SUM_COLUMNS]),
            from_limbs([getattr(a, c) for c in SQUARE_COLUMNS]),
        ]
        for a in rows
    }
    totals: dict[int, list[int]] = {}
    for (_, bucket), sums in from_aggregates.items():
        acc = totals.setdefault(bucket, [0, 0, 0])
        for i in range(3):
            acc[i] += sums[i]
    rollup = {
        t.bucket: [
            t.n,
            from_limbs([getattr(t, c) for c in SUM_COLUMNS]),
            from_limbs([getattr(t, c) for c in SQUARE_COLUMNS]),
        ]
        for t in session.scalars(select(BucketTotal).where(BucketTotal.stream_id == stream.id))
    }
    problems = [
        f"stream {stream.name} bucket {b}: bucket totals {rollup.get(b)} != sum of device "
        f"aggregates {totals.get(b)}"
        for b in sorted(set(totals) | set(rollup))
        if totals.get(b) != rollup.get(b)
    ]
    for key in sorted(set(from_segments) | set(from_aggregates)):
        seg, agg = from_segments.get(key), from_aggregates.get(key)
        if seg != agg:
            problems.append(
                f"stream {stream.name} device {key[0]} bucket {key[1]}: "
                f"segments {seg} != aggregates {agg}"
            )
    return problems


def storage_bytes(session: Session, stream: Stream) -> dict[str, int]:
    """Bytes the store uses for a stream: segment columns, and aggregates (8 bytes a field)."""
    lengths = session.execute(
        select(
            func.coalesce(func.sum(func.length(Segment.codes)), 0),
            func.coalesce(func.sum(func.length(Segment.timestamps)), 0),
            func.coalesce(func.sum(func.length(Segment.devices)), 0),
        ).where(Segment.stream_id == stream.id)
    ).one()
    rows = (
        session.scalar(
            select(func.count()).select_from(Aggregate).where(Aggregate.stream_id == stream.id)
        )
        or 0
    )
    fields = 3 + 1 + SUM_LIMBS + SQUARE_LIMBS
    return {
        "codes": int(lengths[0]),
        "timestamps": int(lengths[1]),
        "devices": int(lengths[2]),
        "aggregates": int(rows) * fields * 8,
    }
