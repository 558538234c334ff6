"""Deduplication: a transaction's dedup rows (``batches``) inserted together, and what each
batch whose (device, sequence) is taken turns out to be: a redelivery (the same content:
nothing to store) or a device whose outbox started again (other content: stored under the
next generation of that sequence, never dropped).

``insert`` writes all fresh rows with one multi-row statement per 128, in (device, sequence)
order; RETURNING names the rows that went in. ``resolve`` reads the rows of every taken
(device, sequence) with one query and inserts the next generations together; a generation
another collector takes meanwhile is retried row by row (``next_generation``). ``prune``
deletes the rows of batches behind the stream's dedup horizon, which the ingest refuses
anyway (``too_old``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, or_, select, tuple_, update
from sqlalchemy.orm import Session

from zeal_server.errors import StoreError
from zeal_server.store.models import BatchSeen, Device, Stream
from zeal_server.store.rawsql import MAX_ROWS, Raw
from zeal_server.store.writes import SEEN_COLUMNS

__all__ = [
    "insert",
    "last_sequence",
    "next_generation",
    "payload_digests",
    "prune",
    "resolve",
]

_GENERATION = SEEN_COLUMNS.index("generation")
_DIGEST = SEEN_COLUMNS.index("digest")


def payload_digests(payloads: list[bytes]) -> npt.NDArray[np.int64]:
    """BLAKE2b-64 of each payload as a signed 64-bit integer (the dedup content key), as an
    array (one join of the digests, not a Python integer per message)."""
    blake2b = hashlib.blake2b
    joined = b"".join([blake2b(p, digest_size=8).digest() for p in payloads])
    return np.frombuffer(joined, dtype=">i8").astype(np.int64)


def insert(session: Session, raw: Raw, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Insert dedup rows (one per line, SEEN_COLUMNS; distinct (device, sequence)): which
    went in (the others' (device, sequence, generation) is taken)."""
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    written = raw.many(session, "seen", SEEN_COLUMNS, rows[order])
    if len(written) == len(rows):
        return np.ones(len(rows), dtype=bool)
    went = {(int(d), int(s)) for d, s in written}
    return np.array([(int(d), int(s)) in went for d, s in rows[:, :2].tolist()], dtype=bool)


def resolve(
    session: Session, raw: Raw, rows: npt.NDArray[np.int64], statement: Callable[[], Any]
) -> list[int | None]:
    """For dedup rows whose (device, sequence) is taken (distinct pairs): the generation
    each was stored under, or None for a duplicate (one of the taken rows has its content,
    or predates digests). `statement` gives the compiled single-row insert, for retries."""
    taken: dict[tuple[int, int], list[tuple[int, int | None]]] = {}
    pairs = [(int(d), int(s)) for d, s in rows[:, :2].tolist()]
    for first in range(0, len(pairs), MAX_ROWS):
        found = session.execute(
            select(
                BatchSeen.device_id, BatchSeen.sequence, BatchSeen.generation, BatchSeen.digest
            ).where(
                tuple_(BatchSeen.device_id, BatchSeen.sequence).in_(pairs[first : first + MAX_ROWS])
            )
        )
        for device, sequence, generation, digest in found:
            taken.setdefault((device, sequence), []).append((generation, digest))
    outcome = [
        _generation_for(taken.get(pair, []), digest)
        for pair, digest in zip(pairs, rows[:, _DIGEST].tolist(), strict=True)
    ]
    fresh = [k for k, generation in enumerate(outcome) if generation is not None]
    if fresh:
        again = rows[fresh].copy()
        again[:, _GENERATION] = [g for g in outcome if g is not None]  # those of `fresh`
        went = insert(session, raw, again)
        for k, row, ok in zip(fresh, again, went.tolist(), strict=True):
            if not ok:  # another collector took that generation meanwhile
                outcome[k] = next_generation(
                    session, dict(zip(SEEN_COLUMNS, row.tolist(), strict=True)), statement
                )
    return outcome


def _generation_for(taken: list[tuple[int, int | None]], digest: int) -> int | None:
    """The generation a batch with `digest` is stored under, given the (generation, digest)
    rows its (device, sequence) has: None (a duplicate) if one has its content or predates
    digests, else the next free one."""
    if any(d is None or d == digest for _, d in taken):
        return None
    return max((g for g, _ in taken), default=-1) + 1


def next_generation(
    session: Session, row: dict[str, Any], statement: Callable[[], Any]
) -> int | None:
    """Store `row` as the next free generation of its (device, sequence): that generation,
    or None if one of the taken rows has its content (or predates digests)."""
    for _ in range(10):  # another collector may take the same generation meanwhile
        taken = session.execute(
            select(BatchSeen.generation, BatchSeen.digest).where(
                BatchSeen.device_id == row["device_id"], BatchSeen.sequence == row["sequence"]
            )
        ).all()
        generation = _generation_for([(g, d) for g, d in taken], row["digest"])
        if generation is None:
            return None
        row["generation"] = generation
        if session.execute(statement(), row).first() is not None:
            return int(row["generation"])
    raise StoreError(f"could not store a generation of sequence {row['sequence']}")


def last_sequence(session: Session, device_id: int, later: set[tuple[int, int]]) -> int | None:
    """The highest sequence stored from the device, but for the rows `later` ((sequence,
    generation) stored in this transaction for batches after the one asking): what a
    one-by-one ingest would have found at that batch."""
    if not later:
        return session.scalar(
            select(func.max(BatchSeen.sequence)).where(BatchSeen.device_id == device_id)
        )
    found = session.execute(
        select(BatchSeen.sequence, BatchSeen.generation)
        .where(BatchSeen.device_id == device_id)
        .order_by(BatchSeen.sequence.desc())
        .limit(len(later) + 1)
    )
    for sequence, generation in found:
        if (sequence, generation) not in later:
            return int(sequence)
    return None


def prune(session: Session, stream_id: int, horizon_ms: int) -> None:
    """Move the stream's dedup horizon up to `horizon_ms` (never back) and delete the dedup
    rows of its batches whose first reading lies before it.

    The ingest reads the horizon in its own transaction, the stream row share-locked on
    PostgreSQL, and refuses a batch with a reading before it (``too_old``): a collector
    whose import window is wider, or whose clock is behind, never stores again a batch
    whose row was deleted here."""
    session.execute(
        update(Stream)
        .where(Stream.id == stream_id)
        .where(or_(Stream.horizon_ms.is_(None), Stream.horizon_ms < horizon_ms))
        .values(horizon_ms=horizon_ms)
    )
    devices = select(Device.id).where(Device.stream_id == stream_id).scalar_subquery()
    session.execute(
        delete(BatchSeen).where(BatchSeen.first_ms < horizon_ms, BatchSeen.device_id.in_(devices))
    )
