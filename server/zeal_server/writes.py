"""The write path's parts below ``Ingest``: the cached stream entry, what one transaction
writes (``Writes``), how an accepted batch becomes rows (``collect``), the statements and
their execution (``build_statement``, ``write``)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import (
    Table,
    bindparam,
    func,
    insert,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from zeal import (
    Batch,
    Zeal,
    exact_sum,
    exact_sum_squares,
)
from zeal_server.models import (
    SQUARE_LIMBS,
    SUM_LIMBS,
    Aggregate,
    BatchSeen,
    BucketTotal,
    Device,
    DeviceDay,
    DeviceHour,
    Segment,
)
from zeal_server.segments import Columns, encode_columns
from zeal_server.streams import insert_for
from zeal_server.sums import VALUE_COLUMNS, to_limbs


@dataclass
class StreamEntry:
    id: int
    params: Zeal
    bucket_ms: int
    created_ms: int
    enrolled_only: bool = False
    #: Readings before now - this are refused (too_old); None: no retention.
    retention_ms: int | None = None


class Writes:
    """Everything one transaction's accepted batches add, written with one executemany each."""

    def __init__(self) -> None:
        self.aggregates: dict[tuple[int, int, int], list[int]] = {}
        self.totals: dict[tuple[int, int], list[int]] = {}
        #: Raw segment columns per (stream, bucket), with the stream's payload bits: one
        #: segment part per bucket and transaction, however many messages fill it.
        self.parts: dict[tuple[int, int], tuple[int, list[Columns]]] = {}
        # id -> [last_seen, readings, batches, bytes, duplicates, sequence resets]
        self.devices: dict[int, list[int]] = {}

    def device(self, device_id: int, received_ms: int) -> list[int]:
        dev = self.devices.setdefault(device_id, [received_ms, 0, 0, 0, 0, 0])
        dev[0] = max(dev[0], received_ms)
        return dev

    def add(self, key: tuple[int, int, int], values: list[int]) -> None:
        _accumulate(self.aggregates, key, values)
        _accumulate(self.totals, (key[0], key[1]), values)


def _accumulate(table: dict[Any, list[int]], key: Any, values: list[int]) -> None:
    acc = table.get(key)
    if acc is None:
        table[key] = list(values)
    else:
        for i, v in enumerate(values):
            acc[i] += v


def build_statement(session: Session, name: str) -> Any:
    """A core statement of the write path, with bound parameters, for the session's
    dialect (Ingest compiles each once per dialect and keeps it)."""
    dialect = session.get_bind().dialect.name
    insert_ = insert_for(session)
    stmt: Any
    if name == "seen":
        seen = typing.cast(Table, BatchSeen.__table__)
        stmt = insert_(seen).on_conflict_do_nothing().returning(seen.c.sequence)
    elif name in ("aggregates", "totals"):
        table = typing.cast(Table, (Aggregate if name == "aggregates" else BucketTotal).__table__)
        keys = ["stream_id", "bucket", "device_id"][: 3 if name == "aggregates" else 2]
        base = insert_(table)
        excluded = base.excluded
        stmt = base.on_conflict_do_update(
            index_elements=keys,
            set_={c: table.c[c] + excluded[c] for c in VALUE_COLUMNS},
        )
    elif name == "device":
        devices = typing.cast(Table, Device.__table__)
        greatest = func.max if dialect == "sqlite" else func.greatest
        stmt = (
            update(devices)
            .where(devices.c.id == bindparam("did"))
            .values(
                last_seen_ms=greatest(devices.c.last_seen_ms, bindparam("seen")),
                readings=devices.c.readings + bindparam("n"),
                batches=devices.c.batches + bindparam("b"),
                bytes=devices.c.bytes + bindparam("size"),
                duplicates=devices.c.duplicates + bindparam("dup"),
                sequence_resets=devices.c.sequence_resets + bindparam("rst"),
            )
        )
    elif name.startswith(("charge", "uncharge")):  # charge_day, uncharge_hour, ...
        ledger = typing.cast(Table, (DeviceHour if name.endswith("hour") else DeviceDay).__table__)
        period = ledger.c.hour if name.endswith("hour") else ledger.c.day
        if name.startswith("uncharge"):
            return (
                update(ledger)
                .where(ledger.c.device_id == bindparam("did"), period == bindparam("period"))
                .values(readings=ledger.c.readings - bindparam("n"))
            )
        base = insert_(ledger).values(
            {
                "device_id": bindparam("did"),
                period.name: bindparam("period"),
                "readings": bindparam("n"),
            }
        )
        stmt = base.on_conflict_do_update(
            index_elements=["device_id", period.name],
            set_={"readings": ledger.c.readings + base.excluded.readings},
            where=ledger.c.readings + base.excluded.readings <= bindparam("allowed"),
        ).returning(ledger.c.readings)
    elif name == "segments":
        stmt = insert(typing.cast(Table, Segment.__table__))
    else:
        raise KeyError(name)
    return stmt


def collect(entry: StreamEntry, device_id: int, batch: Batch, writes: Writes) -> None:
    """Add an accepted batch's aggregate increments, device counters and raw segment parts
    (one per bucket it touches) to `writes`."""
    k = entry.params.payload_bits
    stamps = batch.timestamps
    first, last = int(stamps[0]) // entry.bucket_ms, int(stamps[-1]) // entry.bucket_ms
    buckets = None if first == last else stamps // entry.bucket_ms  # stamps never decrease
    for bucket in [first] if buckets is None else np.unique(buckets).tolist():
        mask = slice(None) if buckets is None else buckets == bucket
        codes = batch.codes[mask]
        values = [
            int(codes.size),
            *to_limbs(exact_sum(codes, k), SUM_LIMBS),
            *to_limbs(exact_sum_squares(codes, k), SQUARE_LIMBS),
        ]
        writes.add((entry.id, bucket, device_id), values)
        columns = Columns(codes, stamps[mask], np.full(codes.size, device_id, dtype=np.int64))
        writes.parts.setdefault((entry.id, bucket), (k, []))[1].append(columns)


def _segments(writes: Writes) -> list[dict[str, Any]]:
    """One raw segment part per (stream, bucket) of the transaction (compaction merges the
    parts of a closed bucket later)."""
    rows = []
    for (stream_id, bucket), (k, parts) in writes.parts.items():
        columns = parts[0] if len(parts) == 1 else Columns.concat(parts)
        blobs = encode_columns(columns, k, compress=False)
        rows.append(
            {
                "stream_id": stream_id,
                "bucket": bucket,
                "n": len(columns),
                "compacted": False,
                "codes": blobs[0],
                "timestamps": blobs[1],
                "devices": blobs[2],
            }
        )
    return rows


def write(session: Session, writes: Writes, statement: Callable[[Session, str], Any]) -> None:
    """Everything `writes` holds, one executemany per table.

    Rows are updated in key order, table after table in one order, so that transactions of
    collectors sharing a database take their row locks in one global order and never
    deadlock. The bucket totals, which every device of a bucket updates, come last: their
    locks are held only from there to the commit.
    """
    if writes.aggregates:
        session.execute(
            statement(session, "aggregates"),
            [
                {
                    "stream_id": s,
                    "bucket": b,
                    "device_id": d,
                    **dict(zip(VALUE_COLUMNS, v, strict=True)),
                }
                for (s, b, d), v in sorted(writes.aggregates.items())
            ],
        )
        session.execute(statement(session, "segments"), _segments(writes))
    if writes.devices:
        session.execute(
            statement(session, "device"),
            [
                {"did": d, "seen": v[0], "n": v[1], "b": v[2], "size": v[3]}
                | {"dup": v[4], "rst": v[5]}
                for d, v in sorted(writes.devices.items())
            ],
        )
    if writes.totals:
        session.execute(
            statement(session, "totals"),
            [
                {"stream_id": s, "bucket": b, **dict(zip(VALUE_COLUMNS, v, strict=True))}
                for (s, b), v in sorted(writes.totals.items())
            ],
        )


class Raw:
    """The per-message statements of the write path (``seen``, the policy's ``charge_*``
    and ``uncharge_*``) run on the session's own DBAPI cursor, in its transaction: compiled
    once per dialect to SQL text with its parameter order. SQLAlchemy's execution pipeline
    costs about 100 microseconds a statement, several times the database's own work for a
    one-reading message. ``open`` gives a cursor for one batch of messages."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str, tuple[str, ...]], tuple[str, list[str] | None]] = {}
        self._session: Session | None = None
        self._cursor: Any = None

    def open(self, session: Session) -> None:
        self.close()
        self._session, self._cursor = session, session.connection().connection.cursor()

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
        self._session = self._cursor = None

    def first(self, session: Session, name: str, params: dict[str, Any]) -> Any:
        """The statement's first row (None if it returns none)."""
        if self._session is not session:
            self.open(session)
        dialect = session.get_bind().dialect
        key = (dialect.name, name, tuple(params))
        found = self._compiled.get(key)
        if found is None:
            compiled = build_statement(session, name).compile(
                dialect=dialect, column_keys=list(params)
            )
            order = list(compiled.positiontup or []) if dialect.positional else None
            found = self._compiled[key] = (str(compiled), order)
        sql, order = found
        cursor = self._cursor
        values = [params[k] for k in order] if order is not None else params
        try:
            cursor.execute(sql, values)
            return cursor.fetchone() if cursor.description is not None else None
        except dialect.loaded_dbapi.Error as exc:
            # As SQLAlchemy would raise it (IntegrityError, OperationalError, ...): the
            # collector's retry and rollback paths catch those, not the driver's own.
            raise DBAPIError.instance(
                sql, values, exc, dialect.loaded_dbapi.Error, dialect=dialect
            ) from exc
