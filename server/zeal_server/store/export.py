"""A stream's readings read back from its segments: per row (``segment_columns``), and as
the rows of an export (``Rows``: time, device, code and its decoded estimate), read in one
session (``export_rows``, the command line's --local) or in a short session per chunk
(``export_chunks``, an HTTP response), written as CSV (``csv_chunks``: ISO 8601 or epoch
times) or Parquet (``parquet_chunks``, with the stream's signed configuration in the file:
pyarrow, the ``parquet`` extra).

Rows come in the order of their first bucket; a chunk's readings by (bucket, device,
time), as a bucket compacted before revision 0007 had them; a raw part's in arrival order.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from zeal import Zeal
from zeal_server.store.fleet import devices_of
from zeal_server.store.models import Device, Segment, Stream
from zeal_server.store.segments import CHUNK, Columns, decode
from zeal_server.store.streams import params_of
from zeal_server.store.sums import OPEN, touching

__all__ = [
    "FORMATS",
    "TIMES",
    "Rows",
    "csv_chunks",
    "estimates_note",
    "export_chunks",
    "export_rows",
    "parquet_chunks",
    "parquet_problem",
    "segment_columns",
]

#: How an export writes its times: ISO 8601 in UTC to the millisecond, or epoch milliseconds.
TIMES = ("iso", "epoch")
#: The formats an export is written in.
FORMATS = ("csv", "parquet")

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


@dataclass(frozen=True)
class Rows:
    """Exported readings: each one's time (ms since 1970, UTC), device, code (what it sent)
    and estimate (the code decoded with the stream's parameters: Zeal.decode)."""

    timestamps: npt.NDArray[np.int64]
    devices: list[str]
    codes: npt.NDArray[np.uint64]
    estimates: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.devices)


def export_rows(
    session: Session,
    stream: Stream,
    first_bucket: int | None = None,
    stop_bucket: int | None = None,
) -> Iterator[Rows]:
    """The stored readings of buckets [first, stop), a segment row at a time, in one
    session (the command line's --local)."""
    names = {d.id: d.name for d in devices_of(session, stream)}
    params = params_of(stream)
    size = stream.bucket_seconds * 1000
    for _, cols in segment_columns(session, stream, first_bucket, stop_bucket):
        yield _rows(_within(cols, size, first_bucket, stop_bucket), names, params)


def _within(cols: Columns, size: int, first: int | None, stop: int | None) -> Columns:
    """The readings of buckets [first, stop) (a chunk may reach past the window)."""
    buckets = cols.timestamps // size
    keep = np.ones(len(cols), dtype=bool)
    if first is not None:
        keep &= buckets >= first
    if stop is not None:
        keep &= buckets < stop
    return cols if keep.all() else cols.take(keep)


def _rows(cols: Columns, names: dict[int, str], params: Zeal) -> Rows:
    devices = [names.get(d, str(d)) for d in cols.devices.tolist()]
    return Rows(cols.timestamps, devices, cols.codes, params.decode(cols.codes))


def csv_chunks(rows: Iterable[Rows], times: str = "iso") -> Iterator[str]:
    """CSV text, header first: ``time,device,code,estimate`` (ISO 8601, UTC, to the
    millisecond) or, with `times` "epoch", ``timestamp_ms,device,code,estimate``. The
    estimate is written exactly (repr), so that decoding the code gives it back."""
    yield ("time" if times == "iso" else "timestamp_ms") + ",device,code,estimate\n"
    for chunk in rows:
        if not len(chunk):
            continue
        if times == "iso":
            stamps = np.datetime_as_string(chunk.timestamps.astype("datetime64[ms]"), unit="ms")
            when = [f"{t}Z" for t in stamps.tolist()]
        else:
            when = [str(t) for t in chunk.timestamps.tolist()]
        yield "".join(
            f"{t},{d},{c},{x!r}\n"
            for t, d, c, x in zip(
                when, chunk.devices, chunk.codes.tolist(), chunk.estimates.tolist(), strict=True
            )
        )


def parquet_problem() -> str | None:
    """Why this server cannot write Parquet (None: it can)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "Parquet needs pyarrow on the server: pip install 'zeal-server[parquet]'"
    return None


class _Sink(io.RawIOBase):
    """Where pyarrow writes: what it wrote since last asked is taken out (``take``)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def parquet_chunks(rows: Iterable[Rows], config: dict[str, Any], note: str) -> Iterator[bytes]:
    """A Parquet file, a row group per chunk of rows, streamed as written: columns time
    (timestamp, ms, UTC), device (dictionary-encoded), code (uint64), estimate (float64);
    the file's metadata holds the stream's signed configuration (``zeal.config``: the
    parameters that decode each code, zeal.mqtt.streamconfig.params_from_config) and
    what the estimates are (``zeal.estimates``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("time", pa.timestamp("ms", tz="UTC")),
            ("device", pa.dictionary(pa.int32(), pa.string())),
            ("code", pa.uint64()),
            ("estimate", pa.float64()),
        ],
        metadata={"zeal.config": json.dumps(config), "zeal.estimates": note},
    )
    sink = _Sink()
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for chunk in rows:
            if not len(chunk):
                continue
            table = pa.table(
                [
                    pa.array(chunk.timestamps, type=pa.timestamp("ms", tz="UTC")),
                    pa.array(chunk.devices, type=pa.string()).dictionary_encode(),
                    pa.array(chunk.codes, type=pa.uint64()),
                    pa.array(chunk.estimates, type=pa.float64()),
                ],
                schema=schema,
            )
            writer.write_table(table)
            if data := sink.take():
                yield data
    yield sink.take()


def export_chunks(
    sessions: sessionmaker[Session],
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    segments_per_chunk: int = 64,
) -> Iterator[Rows]:
    """export_rows for an HTTP response: each chunk of segments is read in a session of
    its own, closed before the chunk is yielded. A client that stops reading (or goes
    away) holds no database connection, however long the response stays open."""
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
            parts = [
                _within(_in_order(s, stream), size, first_bucket, stop_bucket) for s in segments
            ]
        if parts:
            yield _rows(Columns.concat(parts), names, params)
        if len(segments) < segments_per_chunk:
            return
        last = segments[-1]
        after = (last.first_bucket, last.last_bucket, last.tag)
