"""A stream's readings read back from its segments: per row (``segment_columns``) and as
CSV lines of the decoded per-reading estimates (``export_lines``, and ``export_chunks`` for
an HTTP response).

Rows come in the order of their first bucket; a chunk's readings by (bucket, device,
time), as a bucket compacted before revision 0007 had them; a raw part's in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from zeal import Zeal
from zeal_server.store.fleet import devices_of
from zeal_server.store.models import Device, Segment, Stream
from zeal_server.store.segments import CHUNK, Columns, decode
from zeal_server.store.streams import params_of
from zeal_server.store.sums import OPEN, touching

__all__ = ["estimates_note", "export_chunks", "export_lines", "segment_columns"]

_KEY = (Segment.first_bucket, Segment.last_bucket, Segment.tag)


def _in_order(segment: Segment, stream: Stream) -> Columns:
    columns = decode(segment.data, segment.encoding, stream.payload_bits)
    if segment.encoding != CHUNK or segment.first_bucket == segment.last_bucket:
        return columns
    buckets = columns.timestamps // (stream.bucket_seconds * 1000)
    return columns.take(np.argsort(buckets, kind="stable"))


def segment_columns(
    session: Session,
    stream: Stream,
    first_bucket: int | None = None,
    stop_bucket: int | None = None,
) -> Iterator[tuple[int, Columns]]:
    """(first bucket, readings) of each segment row with readings in [first, stop) (all of
    the row's readings: a chunk may reach past the window)."""
    first = -OPEN if first_bucket is None else first_bucket
    query = select(Segment).where(
        *touching(stream, first, OPEN if stop_bucket is None else stop_bucket)
    )
    # yield_per: an ORM query otherwise loads every segment before the first is yielded.
    query = query.order_by(*_KEY).execution_options(yield_per=256)
    for segment in session.scalars(query):
        yield segment.first_bucket, _in_order(segment, stream)


def estimates_note(stream: Stream) -> str:
    """What an export's rows are, for the reader surprised by a value outside the range
    (the HTTP response's Zeal-Estimates header, the CLI's stderr). ASCII: it is a header."""
    unit = f" {stream.unit}" if stream.unit else ""
    return (
        "each estimate is one device's privatized reading, decoded: unbiased but noisy, so "
        f"values outside the stream's range [{stream.lower!r}, {stream.upper!r}]{unit} are "
        "expected; only averages over many readings are accurate (docs/mechanism.md)"
    )


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
    size = stream.bucket_seconds * 1000
    for _, cols in segment_columns(session, stream, first_bucket, stop_bucket):
        yield _csv(_within(cols, size, first_bucket, stop_bucket), names, params)


def _within(cols: Columns, size: int, first: int | None, stop: int | None) -> Columns:
    """The readings of buckets [first, stop) (a chunk may reach past the window)."""
    buckets = cols.timestamps // size
    keep = np.ones(len(cols), dtype=bool)
    if first is not None:
        keep &= buckets >= first
    if stop is not None:
        keep &= buckets < stop
    return cols if keep.all() else cols.take(keep)


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
    size = stream.bucket_seconds * 1000
    after: tuple[int, int, int] | None = None
    while True:
        query = select(Segment).where(*touching(stream, first_bucket, stop_bucket))
        if after is not None:
            query = query.where(
                or_(
                    Segment.first_bucket > after[0],
                    and_(Segment.first_bucket == after[0], Segment.last_bucket > after[1]),
                    and_(
                        Segment.first_bucket == after[0],
                        Segment.last_bucket == after[1],
                        Segment.tag > after[2],
                    ),
                )
            )
        query = query.order_by(*_KEY).limit(segments_per_chunk)
        with sessions() as session:
            segments = list(session.scalars(query))
            chunk = "".join(
                _csv(_within(_in_order(s, stream), size, first_bucket, stop_bucket), names, params)
                for s in segments
            )
        if chunk:
            yield chunk
        if len(segments) < segments_per_chunk:
            return
        last = segments[-1]
        after = (last.first_bucket, last.last_bucket, last.tag)
