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
        self.segments: list[dict[str, Any]] = []
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
    buckets = batch.timestamps // entry.bucket_ms
    for bucket in np.unique(buckets):
        mask = buckets == bucket
        codes = batch.codes[mask]
        values = [
            int(codes.size),
            *to_limbs(exact_sum(codes, k), SUM_LIMBS),
            *to_limbs(exact_sum_squares(codes, k), SQUARE_LIMBS),
        ]
        writes.add((entry.id, int(bucket), device_id), values)
        columns = Columns(
            codes, batch.timestamps[mask], np.full(codes.size, device_id, dtype=np.int64)
        )
        blobs = encode_columns(columns, k, compress=False)
        writes.segments.append(
            {
                "stream_id": entry.id,
                "bucket": int(bucket),
                "n": int(codes.size),
                "compacted": False,
                "codes": blobs[0],
                "timestamps": blobs[1],
                "devices": blobs[2],
            }
        )


def write(session: Session, writes: Writes, statement: Callable[[Session, str], Any]) -> None:
    """Everything `writes` holds, one executemany per table."""
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
                for (s, b, d), v in writes.aggregates.items()
            ],
        )
        session.execute(
            statement(session, "totals"),
            [
                {"stream_id": s, "bucket": b, **dict(zip(VALUE_COLUMNS, v, strict=True))}
                for (s, b), v in writes.totals.items()
            ],
        )
        session.execute(statement(session, "segments"), writes.segments)
    if writes.devices:
        session.execute(
            statement(session, "device"),
            [
                {"did": d, "seen": v[0], "n": v[1], "b": v[2], "size": v[3]}
                | {"dup": v[4], "rst": v[5]}
                for d, v in writes.devices.items()
            ],
        )
