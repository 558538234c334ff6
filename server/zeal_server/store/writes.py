"""The write path's parts below ``Ingest``: the cached stream entry, what one transaction
writes (``Writes``), how accepted batches become rows (``collect``, all of a stream's at
once: one raw segment part per bucket, with its exact limb sums), the statements
(``build_statement``, ``build_rows``) and their execution (``write``; the per-message and
multi-row ones run through ``rawsql.Raw``)."""

from __future__ import annotations

import secrets
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    Table,
    bindparam,
    func,
    insert,
    literal_column,
    update,
)
from sqlalchemy.orm import Session

from zeal import Zeal
from zeal.wirebatches import Batches
from zeal_server.store.models import (
    Device,
    DevicePeriod,
    PrincipalDay,
    PrincipalHour,
    Reject,
    Segment,
)
from zeal_server.store.segments import PART, Columns, encode_part, limb_sums
from zeal_server.store.sequences import SequenceState
from zeal_server.store.streams import insert_for
from zeal_server.store.sums import VALUE_COLUMNS


@dataclass
class StreamEntry:
    id: int
    params: Zeal
    bucket_ms: int
    created_ms: int
    enrolled_only: bool = False
    #: Readings before now - this are refused (too_old); None: no retention.
    retention_ms: int | None = None
    #: The stream's dedup horizon as this transaction read it (models.Stream.horizon_ms).
    horizon_ms: int | None = None


class Writes:
    """Everything one transaction's accepted batches add, written with one executemany each."""

    def __init__(self) -> None:
        #: Raw segment columns per (stream, bucket), with the stream's payload bits: one
        #: segment part per bucket and transaction, however many messages fill it.
        self.parts: dict[tuple[int, int], tuple[int, list[Columns]]] = {}
        # id -> [last_seen, readings, batches, bytes, duplicates, sequence resets]
        self.devices: dict[int, list[int]] = {}
        #: The sequence states of the transaction's devices (read, locked, then changed in
        #: place by the store phase; written back with their counters).
        self.states: dict[int, SequenceState] = {}
        #: (stream, device, reason) -> [count, last_ms] of the transaction's rejects.
        self.rejects: dict[tuple[str, str, str], list[int]] = {}

    def device(self, device_id: int, received_ms: int) -> list[int]:
        dev = self.devices.setdefault(device_id, [received_ms, 0, 0, 0, 0, 0])
        dev[0] = max(dev[0], received_ms)
        return dev

    def count_devices(self, device_ids: npt.NDArray[np.int64], columns: list[Any]) -> None:
        """Add per-message counters to the devices': `columns` are the messages' arrival
        times (a maximum), then readings, batches, bytes, duplicates and sequence resets
        (sums), each an array beside `device_ids`."""
        found, inverse = np.unique(device_ids, return_inverse=True)
        latest = np.full(found.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(latest, inverse, np.asarray(columns[0], dtype=np.int64))
        sums = np.zeros((len(columns) - 1, found.size), dtype=np.int64)
        for row, values in enumerate(columns[1:]):
            np.add.at(sums[row], inverse, np.asarray(values, dtype=np.int64))
        for device_id, seen, *counts in zip(
            found.tolist(), latest.tolist(), *sums.tolist(), strict=True
        ):
            dev = self.device(device_id, seen)
            for i, count in enumerate(counts, start=1):
                dev[i] += count

    def reject(self, key: tuple[str, str, str], when: int) -> None:
        counted = self.rejects.setdefault(key, [0, when])
        counted[0] += 1
        counted[1] = when


#: The privacy ledger, keyed by (device, the period's length in hours, the period's number).
_LEDGER = typing.cast(Table, DevicePeriod.__table__)
#: The device cap's ledgers, keyed by (principal, UTC day or hour): micro-epsilon spent,
#: by statement name (``charge_device`` books days, ``charge_device_hour`` hours).
_DEVICE_LEDGERS = {
    "device": typing.cast(Table, PrincipalDay.__table__),
    "device_hour": typing.cast(Table, PrincipalHour.__table__),
}


def _device_ledger(name: str) -> Table:
    """The device ledger a ``charge_device*``/``uncharge_device*`` statement books on."""
    return _DEVICE_LEDGERS[name.removeprefix("un").removeprefix("charge_")]


def _charge_device(insert_: Any, table: Table, values: Any) -> Any:
    """The conditional upsert that books micro-epsilon on device-cap rows `values`: a row
    grows only while it stays within the ``allowed`` parameter."""
    base = insert_(table).values(values)
    return base.on_conflict_do_update(
        index_elements=["principal_id", "period"],
        set_={"micro": table.c.micro + base.excluded.micro},
        where=table.c.micro + base.excluded.micro <= bindparam("allowed"),
    )


def _hours(name: str) -> Any:
    """The period length (hours) a ``charge_*``/``uncharge_*`` statement books on, as SQL
    text: the write path's compiled statements take only their named parameters."""
    return literal_column("1" if name.endswith("hour") else "24")


def _charge(insert_: Any, values: Any) -> Any:
    """The conditional upsert that books ledger rows `values`: a row's readings grow only
    while they stay within the ``allowed`` parameter, else the row is left as it was."""
    base = insert_(_LEDGER).values(values)
    return base.on_conflict_do_update(
        index_elements=["device_id", "hours", "period"],
        set_={"readings": _LEDGER.c.readings + base.excluded.readings},
        where=_LEDGER.c.readings + base.excluded.readings <= bindparam("allowed"),
    )


def build_statement(session: Session, name: str) -> Any:
    """A core statement of the write path, with bound parameters, for the session's
    dialect (Ingest compiles each once per dialect and keeps it)."""
    dialect = session.get_bind().dialect.name
    insert_ = insert_for(session)
    stmt: Any
    if name == "device":
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
                seq_floor=bindparam("floor"),
                seq_head=bindparam("head"),
                seq_bits=bindparam("bits"),
                seq_recent=bindparam("recent"),
                seq_newest_ms=bindparam("newest"),
                missing=bindparam("missing"),
                late=bindparam("late"),
            )
        )
    elif name in ("charge_device", "charge_device_hour"):
        table = _device_ledger(name)
        row: dict[str, Any] = {
            "principal_id": bindparam("did"),
            "period": bindparam("start"),
            "micro": bindparam("n"),
        }
        stmt = _charge_device(insert_, table, row).returning(table.c.micro)
    elif name in ("uncharge_device", "uncharge_device_hour"):
        table = _device_ledger(name)
        stmt = (
            update(table)
            .where(
                table.c.principal_id == bindparam("did"),
                table.c.period == bindparam("start"),
            )
            .values(micro=table.c.micro - bindparam("n"))
        )
    elif name.startswith(("charge", "uncharge")):  # charge_day, uncharge_hour, ...
        if name.startswith("uncharge"):
            return (
                update(_LEDGER)
                .where(
                    _LEDGER.c.device_id == bindparam("did"),
                    _LEDGER.c.hours == _hours(name),
                    _LEDGER.c.period == bindparam("start"),
                )
                .values(readings=_LEDGER.c.readings - bindparam("n"))
            )
        row = {
            "device_id": bindparam("did"),
            "hours": _hours(name),
            "period": bindparam("start"),
            "readings": bindparam("n"),
        }
        stmt = _charge(insert_, row).returning(_LEDGER.c.readings)
    elif name == "segments":
        stmt = insert(typing.cast(Table, Segment.__table__))
    elif name == "reject":
        rejects = typing.cast(Table, Reject.__table__)
        base = insert_(rejects)
        stmt = base.on_conflict_do_update(
            index_elements=["stream", "device", "reason"],
            set_={"count": rejects.c.count + base.excluded.count, "last_ms": base.excluded.last_ms},
        )
    else:
        raise KeyError(name)
    return stmt


def build_rows(session: Session, name: str, rows: int) -> Any:
    """The multi-row form of a per-message statement (``charge_day``, ``charge_hour``) for
    `rows` rows, its parameters named ``r{row}_{column}``: one statement books a
    transaction's devices' days, and RETURNING names the rows it wrote."""
    insert_ = insert_for(session)
    if name in ("charge_day", "charge_hour"):
        values: list[dict[str, Any]] = [
            {
                "device_id": bindparam(f"r{r}_did"),
                "hours": _hours(name),
                "period": bindparam(f"r{r}_start"),
                "readings": bindparam(f"r{r}_n"),
            }
            for r in range(rows)
        ]
        return _charge(insert_, values).returning(_LEDGER.c.device_id, _LEDGER.c.period)
    if name in ("charge_device", "charge_device_hour"):
        table = _device_ledger(name)
        rows_: list[dict[str, Any]] = [
            {
                "principal_id": bindparam(f"r{r}_did"),
                "period": bindparam(f"r{r}_start"),
                "micro": bindparam(f"r{r}_n"),
            }
            for r in range(rows)
        ]
        return _charge_device(insert_, table, rows_).returning(table.c.principal_id, table.c.period)
    raise KeyError(name)


def unnest_rows(name: str, columns: tuple[str, ...]) -> str:
    """PostgreSQL's form of a multi-row statement (``build_rows``): its rows passed as one
    array per column (``columns``, bigints) and unnested, so that the statement is one short
    text whatever the rows. psycopg caches the parsing of a statement and PostgreSQL
    prepares it only below 4,096 characters and 50 parameters; a VALUES list of 128 rows
    was parsed again on every call (bench/writer_cost.py, deploy/SCALING.md)."""
    devices = ("charge_device", "charge_device_hour")
    if name not in ("charge_day", "charge_hour", *devices) or columns != (
        "did",
        "start",
        "n",
    ):
        raise KeyError((name, columns))
    if name in devices:
        table = _device_ledger(name).name
        return (
            f"INSERT INTO {table} (principal_id, period, micro) "
            "SELECT r.did, r.start, r.n FROM unnest(%(did)s::bigint[], %(start)s::bigint[], "
            "%(n)s::bigint[]) AS r(did, start, n) "
            "ON CONFLICT (principal_id, period) DO UPDATE "
            f"SET micro = {table}.micro + excluded.micro "
            f"WHERE {table}.micro + excluded.micro <= %(allowed)s "
            f"RETURNING {table}.principal_id, {table}.period"
        )
    table, hours = _LEDGER.name, _hours(name).name
    return (
        f"INSERT INTO {table} (device_id, hours, period, readings) "
        f"SELECT r.did, {hours}, r.start, r.n "
        "FROM unnest(%(did)s::bigint[], %(start)s::bigint[], %(n)s::bigint[]) AS r(did, start, n) "
        "ON CONFLICT (device_id, hours, period) DO UPDATE "
        f"SET readings = {table}.readings + excluded.readings "
        f"WHERE {table}.readings + excluded.readings <= %(allowed)s "
        f"RETURNING {table}.device_id, {table}.period"
    )


def collect(
    entry: StreamEntry, batches: Batches, device_ids: npt.NDArray[np.int64], writes: Writes
) -> None:
    """Add accepted batches' readings to `writes` as raw segment columns per bucket (in
    their order); batch ``i`` came from ``device_ids[i]``."""
    if not len(batches):
        return
    k = entry.params.payload_bits
    codes, stamps = batches.codes, batches.timestamps
    devices = np.repeat(device_ids, batches.counts)
    buckets = stamps // entry.bucket_ms
    by_bucket = np.argsort(buckets, kind="stable")
    found, starts = np.unique(buckets[by_bucket], return_index=True)
    for bucket, part in zip(found.tolist(), np.split(by_bucket, starts[1:]), strict=True):
        columns = Columns(codes[part], stamps[part], devices[part])
        writes.parts.setdefault((entry.id, bucket), (k, []))[1].append(columns)


def _segments(writes: Writes) -> list[dict[str, Any]]:
    """One raw segment part per (stream, bucket) of the transaction, with its limb sums
    (compaction merges the parts of closed buckets into chunks later), in key order."""
    rows = []
    for (stream_id, bucket), (k, parts) in sorted(writes.parts.items(), key=lambda p: p[0]):
        columns = parts[0] if len(parts) == 1 else Columns.concat(parts)
        sums = limb_sums(columns.codes, np.zeros(1, dtype=np.int64), k)[0].tolist()
        rows.append(
            {
                "stream_id": stream_id,
                "first_bucket": bucket,
                "last_bucket": bucket,
                "tag": secrets.randbits(63),
                "encoding": PART,
                "data": encode_part(columns, k),
                **dict(zip(VALUE_COLUMNS, sums, strict=True)),
            }
        )
    return rows


def write(session: Session, writes: Writes, statement: Callable[[Session, str], Any]) -> None:
    """Everything `writes` holds, one executemany per table.

    Segment parts are only inserted (no row is shared with another transaction). Device
    counters and rejects are updated in key order, table after table in one order, so that
    transactions of collectors sharing a database take their row locks in one global order
    and never deadlock.
    """
    if writes.parts:
        session.execute(statement(session, "segments"), _segments(writes))
    if writes.devices:
        session.execute(
            statement(session, "device"),
            [
                {"did": d, "seen": v[0], "n": v[1], "b": v[2], "size": v[3]}
                | {"dup": v[4], "rst": v[5]}
                | writes.states[d].values()
                for d, v in sorted(writes.devices.items())
            ],
        )
    if writes.rejects:
        session.execute(
            statement(session, "reject"),
            [
                {"stream": s, "device": d, "reason": r, "count": n, "last_ms": when}
                for (s, d, r), (n, when) in sorted(writes.rejects.items())
            ],
        )
