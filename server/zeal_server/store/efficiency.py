"""Bits per reading on the wire and in the store, beside the formats they replace.

Everything here is measured on the stream's own stored data: the wire figure from the
payload bytes the collector received, the store figures from the segment rows (``store_bits``
their data, ``store_code_bits`` the codes sections of the sample's rows, ``database_bits``
the stream's share of the whole database, zeal_server.store.footprint, and at least its
segments' bytes while its tables still fit in their first pages), and the alternatives by
encoding a sample of the most recent stored readings in those formats:

* a JSON message per reading, ``{"ts": <ms>, "value": <privatized value>}`` (the device is
  in the topic, as with Zeal's own payload);
* a raw float64 value (64 bits, timestamp not counted: the comparison most flattering to
  the alternative);
* the paper's storage format: the privatized float64 values x* = x + Abar (paper Eq. (11)),
  compressed with zstandard at level 3, as measured by the paper's compression ratio CR
  (Eq. (34)); it holds values only, so it is compared with the store's codes column, and
  the whole segment (codes, timestamps, devices) is reported beside it;
* the paper's transmission format, 64 - gamma_min bits per value (TR, Eq. (27)).

Arriving batches are stored raw until their bucket closes and is compacted; the segment
figures are those of the compacted rows (``compacted`` says which share of the readings
they hold), or of the raw parts while nothing is compacted yet (``compacted`` 0).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import zstandard
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from zeal_server.store.footprint import stream_bytes
from zeal_server.store.models import Segment, Stream
from zeal_server.store.segments import CHUNK, PART, Columns, decode, section_sizes
from zeal_server.store.streams import params_of

__all__ = ["SAMPLE", "json_bits", "recent_columns", "stream_efficiency"]

#: Readings (most recent first) from which the alternative formats are measured.
SAMPLE = 65_536


def recent_columns(session: Session, stream: Stream, limit: int = SAMPLE) -> Columns | None:
    """Up to ``limit`` readings from the stream's most recent segment rows (None if none):
    compacted ones while there are, else raw parts."""
    return _recent(session, stream, limit)[0]


def _recent(session: Session, stream: Stream, limit: int) -> tuple[Columns | None, int, int]:
    """The readings of `recent_columns`, and the code bytes and readings of their rows.

    The rows are streamed (``yield_per``), newest first, and the reading stops once it has
    enough: a stream of months holds a great many rows (loading them all made ``/stats``
    slow)."""
    for compacted in (True, False):
        query = (
            select(Segment.encoding, Segment.data, Segment.n)
            .where(
                Segment.stream_id == stream.id,
                (Segment.encoding != PART) if compacted else (Segment.encoding == PART),
            )
            .order_by(Segment.last_bucket.desc(), Segment.first_bucket.desc(), Segment.tag)
            .execution_options(yield_per=64)
        )
        chosen = []
        held = 0
        result = session.execute(query)
        for row in result:
            chosen.append(row)
            held += row.n
            if held >= limit:
                break
        result.close()
        if not chosen:
            continue
        both = Columns.concat([decode(r.data, r.encoding, stream.payload_bits) for r in chosen])
        code_bytes = sum(section_sizes(r.data)[-1 if r.encoding == CHUNK else 0] for r in chosen)
        sampled = Columns(both.codes[:limit], both.timestamps[:limit], both.devices[:limit])
        return sampled, code_bytes, held
    return None, 0, 0


def json_bits(timestamps: np.ndarray, values: np.ndarray) -> float:
    """Mean bits of ``json.dumps({"ts": t, "value": v})`` over the readings, computed exactly
    without encoding each one: the text is ``{"ts": `` t ``, "value": `` v ``}``, the
    lengths of the decimal integers t are counted by comparison with powers of ten, and the
    float values take at most 2^k distinct texts (checked against json.dumps in the tests).
    """
    magnitude = np.abs(timestamps.astype(np.int64))
    powers = 10 ** np.arange(1, 19, dtype=np.int64)
    ts_chars = np.searchsorted(powers, magnitude, side="right") + 1 + (timestamps < 0)
    distinct, inverse = np.unique(values, return_inverse=True)
    value_chars = np.array([len(json.dumps(float(v))) for v in distinct])[inverse]
    fixed = len('{"ts": , "value": }')
    return 8 * float(np.mean(fixed + ts_chars + value_chars))


def stream_efficiency(
    session: Session,
    stream: Stream,
    *,
    readings: int,
    received_bytes: int,
) -> dict[str, Any] | None:
    """Bits per reading of Zeal and of the alternatives, with the ratios (None: no data)."""
    sample, code_bytes, code_readings = _recent(session, stream, SAMPLE)
    if sample is None or readings == 0:
        return None
    params = params_of(stream)
    values = params.decode(sample.codes)
    json_size = json_bits(sample.timestamps, values)
    privatized = params.to_float64(sample.codes)
    paper_bits = (
        8 * len(zstandard.ZstdCompressor(level=3).compress(privatized.tobytes())) / len(sample)
    )
    wire_bits = 8 * received_bytes / readings
    by_state: dict[bool, list[int]] = {}
    for encoding, *rest in session.execute(
        select(Segment.encoding, func.sum(Segment.n), func.sum(func.length(Segment.data)))
        .where(Segment.stream_id == stream.id)
        .group_by(Segment.encoding)
    ):
        acc = by_state.setdefault(encoding != PART, [0, 0])
        for i, v in enumerate(rest):
            acc[i] += int(v or 0)
    total = sum(v[0] for v in by_state.values()) or 1
    done = by_state.get(True, [0, 0])
    n, data_bytes = done if done[0] else by_state.get(False, [0, 0])
    code_bits = 8 * code_bytes / (code_readings or 1)
    # The database's bytes grow a page at a time: a small stream's rows may still fit in the
    # pages its tables keep empty, where the page count says nothing yet. The bytes its
    # segments hold are on disk whatever the pages say: the figure is at least those.
    pages = sum(stream_bytes(session, stream).values())
    held = sum(v[1] for v in by_state.values())
    database = max(pages, held)
    return {
        "sample": len(sample),
        "wire_bits": wire_bits,
        "json_bits": json_size,
        "float64_bits": 64.0,
        "wire_vs_json": json_size / wire_bits,
        "wire_vs_float64": 64.0 / wire_bits,
        "store_bits": 8 * data_bytes / (n or 1),
        "store_code_bits": code_bits,
        "database_bits": 8 * database / total,
        "database_pages_grown": pages >= held,
        "paper_store_bits": paper_bits,
        "paper_wire_bits": float(64 - params.shared_bits),
        "store_vs_paper": paper_bits / code_bits,
        "compacted": done[0] / total,
        "compression_ratio_cr": paper_bits / 64,
        "transmission_ratio_tr": params.transmission_ratio,
    }
