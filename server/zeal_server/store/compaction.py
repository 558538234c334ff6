"""Compaction: raw parts merged into compressed chunks; and verify.

A transaction adds a raw part per bucket it touches. The collector's housekeeping (every
30 s) merges the parts of closed buckets (before the previous one) of each period (about a
day of buckets, ``sums.period_buckets``) with the period's *open* chunks (those below
``OPEN_BYTES``) and its rows from before revision 0007, and splits what they hold into
chunks of at most ``CHUNK_BYTES``, filled in bucket order (whole buckets each, where a
bucket fits): a chunk stays inline in a PostgreSQL page, with no TOAST table and index
beside it, and a query that reaches into a period decodes a few kilobytes at its edges, not
the day. A full chunk is not rewritten again: a late part makes a new chunk that may
overlap it (rows may overlap in buckets, and every sum adds them). A bucket still open but
holding ``CROWDED`` parts is merged too (its later parts join the open chunk at the next
housekeeping, which rewrites a few kilobytes at most).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.orm import Session

from zeal_server.store.models import Segment, Stream
from zeal_server.store.segments import CHUNK, PART, Columns, decode, encode_chunk, limb_sums
from zeal_server.store.sums import VALUE_COLUMNS, period_buckets

__all__ = ["CHUNK_BYTES", "CROWDED", "OPEN_BYTES", "chunk_rows", "compact", "delete_rows", "verify"]

#: A chunk's data holds at most this many bytes: with its key and sums the row stays
#: below the 8,160 bytes PostgreSQL keeps inline in a page.
CHUNK_BYTES = 7_600
#: A chunk smaller than this is still open: compaction merges the period's new parts
#: into it (rewriting a few kilobytes, never a full chunk).
OPEN_BYTES = CHUNK_BYTES * 7 // 8
#: Parts in one bucket that get the bucket compacted before it closes: a long bucket that
#: many transactions fill is merged into its period's open chunk as it goes.
CROWDED = 64
#: Readings tried in a first chunk (then as many as the last chunk's size suggests).
_FIRST_GUESS = 8_192
_KEY = (Segment.first_bucket, Segment.last_bucket, Segment.tag)


def chunk_rows(
    stream: Stream, columns: Columns, *, limit: int = CHUNK_BYTES
) -> list[dict[str, Any]]:
    """Readings of one period as chunk rows of at most `limit` bytes of data, filled in
    bucket order: each a run of whole buckets (a bucket is cut only where it alone holds
    more than a chunk), full but for the last."""
    size = stream.bucket_seconds * 1000
    buckets = columns.timestamps // size
    order = np.lexsort((columns.codes, columns.timestamps, columns.devices, buckets))
    columns, buckets = columns.take(order), buckets[order]
    boundaries = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
    rows, start, guess = [], 0, _FIRST_GUESS
    while start < len(columns):
        take = min(len(columns) - start, guess)
        while True:
            cut = start + take
            if cut < len(columns):  # the last bucket boundary within the piece, if any
                at = int(np.searchsorted(boundaries, cut, side="right")) - 1
                cut = int(boundaries[at]) if at >= 0 and boundaries[at] > start else cut
            piece = columns.take(np.arange(start, cut)).sorted()
            data = encode_chunk(piece, stream.payload_bits)
            if len(data) <= limit or cut - start == 1:
                break
            take = max(1, int(take * min(0.95, limit / len(data))))
        rows.append(_row(stream, piece, data, int(buckets[start]), int(buckets[cut - 1])))
        guess = max(1, int((cut - start) * limit * 0.97 / max(len(data), 1)))
        start = cut
    return rows


def _row(stream: Stream, columns: Columns, data: bytes, first: int, last: int) -> dict[str, Any]:
    sums = limb_sums(columns.codes, np.zeros(1, dtype=np.int64), stream.payload_bits)[0]
    return {
        "stream_id": stream.id,
        "first_bucket": first,
        "last_bucket": last,
        "tag": secrets.randbits(63),
        "encoding": CHUNK,
        "data": data,
        **dict(zip(VALUE_COLUMNS, sums.tolist(), strict=True)),
    }


def _mergeable(stream: Stream, before_bucket: int | None) -> list[Any]:
    """Rows compaction may merge: parts and rows from before 0007 (any size), and open
    chunks (those before `before_bucket` only, if given)."""
    where = [
        Segment.stream_id == stream.id,
        (Segment.encoding != CHUNK) | (func.length(Segment.data) < OPEN_BYTES),
    ]
    if before_bucket is not None:
        where.append(Segment.last_bucket < before_bucket)
    return where


def compact(
    session: Session,
    stream: Stream,
    *,
    before_bucket: int | None = None,
    max_periods: int | None = None,
) -> int:
    """Merge the mergeable rows (``_mergeable``) of each period that holds a part, or more
    than one open chunk, before `before_bucket`, into chunks; a period with a bucket of
    ``CROWDED`` parts or more (a long bucket that many transactions fill) has all its
    mergeable rows merged. Oldest period first; at most `max_periods` (None: all). Returns
    the periods rewritten."""
    size = period_buckets(stream)
    period = Segment.first_bucket // size
    where = _mergeable(stream, before_bucket)
    closed = (
        select(period)
        .where(*where)
        .group_by(period)
        .having((func.count() > 1) | (func.min(Segment.encoding) < CHUNK))
    )
    periods = {int(p): where for p in session.scalars(closed)}
    if before_bucket is not None:
        parts = [Segment.stream_id == stream.id, Segment.encoding == PART]
        crowded = select(Segment.first_bucket).where(*parts).group_by(Segment.first_bucket)
        for bucket in session.scalars(crowded.having(func.count() >= CROWDED)):
            periods[int(bucket) // size] = _mergeable(stream, None)
    done = 0
    for number in sorted(periods)[:max_periods]:
        # Locked: two collectors compacting one period at once would both merge its rows
        # (every reading of them twice). The second waits, then finds the rows the first
        # merged gone, and merges what is left, if anything.
        rows = session.execute(
            select(*_KEY, Segment.encoding, Segment.data)
            .where(*periods[number], Segment.first_bucket >= number * size)
            .where(Segment.first_bucket < (number + 1) * size)
            .order_by(*_KEY)
            .with_for_update()
        ).all()
        if len(rows) < 2 and all(r.encoding == CHUNK for r in rows):
            continue
        merged = Columns.concat([decode(r.data, r.encoding, stream.payload_bits) for r in rows])
        delete_rows(session, stream, rows)
        session.execute(insert(Segment), chunk_rows(stream, merged))
        done += 1
    return done


def delete_rows(session: Session, stream: Stream, rows: Sequence[Any]) -> None:
    """Delete segment rows by their keys (one statement, executed for many rows: a list of
    keys in one IN clause is not indexed on PostgreSQL and scans the table per row)."""
    if not rows:
        return
    session.connection().execute(
        delete(Segment).where(
            Segment.stream_id == stream.id,
            Segment.first_bucket == bindparam("k_first"),
            Segment.last_bucket == bindparam("k_last"),
            Segment.tag == bindparam("k_tag"),
        ),
        [{"k_first": r.first_bucket, "k_last": r.last_bucket, "k_tag": r.tag} for r in rows],
    )


def verify(session: Session, stream: Stream) -> list[str]:
    """Check every segment row of the stream against what it holds: its count and sums,
    its first and last bucket, and that it stays within one period; list the mismatches."""
    problems = []
    size, per = stream.bucket_seconds * 1000, period_buckets(stream)
    query = (
        select(Segment)
        .where(Segment.stream_id == stream.id)
        .order_by(*_KEY)
        .execution_options(yield_per=256)
    )
    for row in session.scalars(query):
        where = f"stream {stream.name} segment ({row.first_bucket}, {row.last_bucket}, {row.tag})"
        try:
            columns = decode(row.data, row.encoding, stream.payload_bits)
        except ValueError as exc:
            problems.append(f"{where}: cannot be decoded ({exc})")
            continue
        found = limb_sums(columns.codes, np.zeros(1, dtype=np.int64), stream.payload_bits)[0]
        stored = [int(getattr(row, c)) for c in VALUE_COLUMNS]
        if found.tolist() != stored:
            problems.append(f"{where}: sums {stored} != its readings' {found.tolist()}")
        buckets = columns.timestamps // size
        span = (int(buckets.min()), int(buckets.max())) if len(columns) else None
        if span != (row.first_bucket, row.last_bucket):
            problems.append(f"{where}: its readings span buckets {span}")
        if row.first_bucket // per != row.last_bucket // per:
            problems.append(f"{where}: crosses a period boundary")
    return problems
