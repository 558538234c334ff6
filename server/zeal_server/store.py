"""Repository functions over the tables: the caller owns the session and the transaction.

Ingest validates a message completely before it writes anything; a rejected message leaves
only its reject count. A batch is stored once: its dedup row, its aggregate increments and
its raw segment part go in together, so a redelivery changes nothing. A redelivery is the
same device, sequence number *and content* (a digest of the payload); the same sequence
with other content comes from an outbox that started again (a reinstalled device) and is
stored, counted as a sequence reset, never dropped.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Table,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from zeal import (
    Batch,
    Estimate,
    ParameterError,
    WireError,
    Zeal,
    ZealWarning,
    decode_batch,
    exact_sum,
    exact_sum_squares,
)
from zeal.streamconfig import check_name, config_document
from zeal.topics import parse_data_topic
from zeal_server.errors import ServerError
from zeal_server.models import (
    LIMB_BITS,
    SQUARE_LIMBS,
    SUM_LIMBS,
    Aggregate,
    BatchSeen,
    BucketTotal,
    Device,
    DeviceTag,
    Installation,
    Reject,
    Segment,
    Stream,
)
from zeal_server.segments import Columns, decode_columns, encode_columns

__all__ = [
    "MAX_REJECT_ROWS",
    "MAX_SERVER_BITS",
    "MAX_TAGS",
    "Ingest",
    "Outcome",
    "StoreError",
    "config_of",
    "create_stream",
    "delete_stream",
    "installation_id",
    "params_of",
]

#: Widest codes the store accepts (the limb layout's no-overflow guarantee).
MAX_SERVER_BITS = 28
#: The rejects table keeps at most about this many (stream, device, reason) rows.
MAX_REJECT_ROWS = 10_000
_LIMB_MASK = (1 << LIMB_BITS) - 1
_SUM_COLUMNS = [f"s{i}" for i in range(SUM_LIMBS)]
_SQUARE_COLUMNS = [f"q{i}" for i in range(SQUARE_LIMBS)]


class StoreError(ServerError, ValueError):
    """A request the store cannot satisfy (unknown or duplicate stream, bad parameters)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def to_limbs(value: int, count: int) -> list[int]:
    limbs = [(value >> (LIMB_BITS * i)) & _LIMB_MASK for i in range(count)]
    if value >> (LIMB_BITS * count):
        raise OverflowError(f"{value} needs more than {count} limbs")
    return limbs


def from_limbs(limbs: list[int]) -> int:
    return sum(int(v or 0) << (LIMB_BITS * i) for i, v in enumerate(limbs))


def params_of(stream: Stream) -> Zeal:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        return Zeal(
            lower=stream.lower,
            upper=stream.upper,
            epsilon=stream.epsilon,
            exponent=stream.exponent,
            sampler=stream.sampler,
        )


def _insert(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


# -- streams ----------------------------------------------------------------------------------


def derive_params(
    lower: float,
    upper: float,
    epsilon: float,
    payload_bits: int | None = None,
    exponent: int | None = None,
) -> Zeal:
    """The mechanism a stream with these parameters gets; StoreError names what is wrong."""
    try:
        params = Zeal(
            lower=lower, upper=upper, epsilon=epsilon, payload_bits=payload_bits, exponent=exponent
        )
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    if params.payload_bits > MAX_SERVER_BITS:
        raise StoreError(
            f"payload_bits={params.payload_bits} exceeds the store's limit of {MAX_SERVER_BITS}"
        )
    return params


def create_stream(
    session: Session,
    *,
    name: str,
    lower: float,
    upper: float,
    epsilon: float,
    payload_bits: int | None = None,
    exponent: int | None = None,
    bucket_seconds: int = 60,
    description: str = "",
    unit: str = "",
    enrolled_only: bool = False,
    retention_days: int | None = None,
) -> Stream:
    """Create a stream; its parameters are fixed for good (a change is a new stream). Its
    retention (not a privacy parameter) may change later (set_retention)."""
    try:
        check_name("stream", name)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    params = derive_params(lower, upper, epsilon, payload_bits, exponent)
    if isinstance(bucket_seconds, bool) or not 1 <= bucket_seconds <= 86400:
        raise StoreError(f"bucket_seconds must be in [1, 86400], got {bucket_seconds!r}")
    check_unit(unit)
    check_retention(retention_days)
    if session.scalar(select(Stream.id).where(Stream.name == name)) is not None:
        raise StoreError(
            f"stream {name!r} already exists; its parameters cannot change "
            "(create a new stream for new parameters)"
        )
    stream = Stream(
        name=name,
        lower=params.lower,
        upper=params.upper,
        epsilon=params.epsilon,
        exponent=params.exponent,
        payload_bits=params.payload_bits,
        sampler=params.sampler,
        fingerprint=params.fingerprint.hex(),
        bucket_seconds=bucket_seconds,
        description=description,
        unit=unit,
        created_ms=now_ms(),
        enrolled_only=bool(enrolled_only),
        retention_days=retention_days,
    )
    session.add(stream)
    session.flush()
    return stream


def check_retention(days: object) -> int | None:
    """Validate a retention: None (keep everything) or whole days, 1 to 36,500."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 36_500:
        raise StoreError(f"retention_days must be 1 to 36500 whole days or none, got {days!r}")
    return days


def set_retention(session: Session, stream: Stream, days: int | None) -> None:
    """Change how long the stream's buckets are kept (the collector applies it within a
    minute; what is older is then deleted for good)."""
    stream.retention_days = check_retention(days)
    session.flush()


def check_unit(unit: object) -> str:
    """A unit is short printable text without markup characters, e.g. degF, kWh, mg/dL."""
    if not isinstance(unit, str) or len(unit) > 32 or not all(c.isprintable() for c in unit):
        raise StoreError(f"unit must be at most 32 printable characters (e.g. degF), got {unit!r}")
    if any(c in unit for c in "<>&\"'"):
        raise StoreError(f"unit must not contain < > & or quotes, got {unit!r}")
    return unit


def delete_stream(session: Session, stream: Stream) -> int:
    """Delete a stream with everything stored for it; returns how many readings it held."""
    readings = int(
        session.scalar(
            select(func.coalesce(func.sum(BucketTotal.n), 0)).where(
                BucketTotal.stream_id == stream.id
            )
        )
        or 0
    )
    devices = select(Device.id).where(Device.stream_id == stream.id).scalar_subquery()
    session.execute(delete(BatchSeen).where(BatchSeen.device_id.in_(devices)))
    session.execute(delete(DeviceTag).where(DeviceTag.device_id.in_(devices)))
    for table in (Aggregate, BucketTotal, Segment):
        session.execute(delete(table).where(table.stream_id == stream.id))
    session.execute(delete(Device).where(Device.stream_id == stream.id))
    session.execute(delete(Reject).where(Reject.stream == stream.name))
    session.execute(delete(Stream).where(Stream.id == stream.id))
    return readings


def installation_id(session: Session) -> str:
    """This database's id (see models.Installation)."""
    value = session.scalar(select(Installation.id))
    if value is None:
        raise StoreError("the database has no installation id: run `zeal-server migrate`")
    return str(value)


def config_of(session: Session, stream: Stream, server: str | None = None) -> dict[str, Any]:
    """The stream's configuration document, naming this server and the creation time."""
    return config_document(
        stream.name,
        params_of(stream),
        server=server or installation_id(session),
        created_ms=stream.created_ms,
        unit=stream.unit,
    )


def stream_by_name(session: Session, name: str) -> Stream | None:
    return session.scalar(select(Stream).where(Stream.name == name))


def list_streams(session: Session) -> list[Stream]:
    return list(session.scalars(select(Stream).order_by(Stream.name)))


# -- ingest -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What happened to one message: stored, duplicate, or rejected with a reason.

    ``reset`` marks a stored batch whose sequence number the device had used before for
    other content; ``last_sequence`` is then the highest sequence stored from the device.
    """

    status: str  # "stored" | "duplicate" | "rejected"
    reason: str | None = None
    stream: str = ""
    device: str = ""
    readings: int = 0
    sequence: int | None = None
    reset: bool = False
    last_sequence: int | None = None


def payload_digest(payload: bytes) -> int:
    """BLAKE2b-64 of a payload as a signed 64-bit integer (the dedup content key)."""
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big", signed=True)


@dataclass
class _StreamEntry:
    id: int
    params: Zeal
    bucket_ms: int
    created_ms: int
    enrolled_only: bool = False
    #: Readings before now - this are refused (too_old); None: no retention.
    retention_ms: int | None = None


class _Writes:
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


_VALUE_COLUMNS = ["n", *_SUM_COLUMNS, *_SQUARE_COLUMNS]


def _new_device(stream_id: int, name: str, when: int) -> dict[str, Any]:
    """The columns of a device row that has sent nothing yet."""
    counters = dict.fromkeys(("readings", "batches", "bytes", "duplicates", "sequence_resets"), 0)
    return {
        "stream_id": stream_id,
        "name": name,
        "tags": "{}",
        "first_seen_ms": when,
        "last_seen_ms": when,
        **counters,
    }


class Ingest:
    """Validates and stores messages; caches streams, devices and compiled statements.

    With ``max_future_ms`` set, a batch holding a reading timestamped more than that after
    its arrival is rejected (``future_timestamp``); with ``max_age_ms`` set, one holding a
    reading more than that before its arrival (``too_old``): a device can neither pre-fill
    the future nor rewrite history beyond the import window. With ``backfill_ms`` set, one
    holding a reading timestamped more than that before its stream was created is rejected
    (``before_stream``): its codes cannot have been made with the stream's parameters unless
    the device's clock is wrong. With ``max_buckets`` set, a batch whose readings fall into
    more time buckets than that is rejected (``too_many_buckets``): each bucket costs an
    aggregate row and a segment part, so one small batch could otherwise make the writer
    write tens of thousands of rows. The collector sets all four from the server settings.
    """

    def __init__(
        self,
        *,
        max_future_ms: int | None = None,
        max_age_ms: int | None = None,
        backfill_ms: int | None = None,
        max_buckets: int | None = None,
    ) -> None:
        self.max_future_ms, self.max_age_ms = max_future_ms, max_age_ms
        self.backfill_ms, self.max_buckets = backfill_ms, max_buckets
        self._streams: dict[str, _StreamEntry | None] = {}
        self._devices: dict[tuple[int, str], int] = {}
        self._reject_keys: dict[tuple[str, str], None] = {}
        self._reject_rows: tuple[int, float] = (0, -1e18)  # (rows, when counted)
        self._statements: dict[tuple[str, str], Any] = {}

    def forget(self) -> None:
        """Drop caches (after a rollback, ids created in it are gone)."""
        self._streams.clear()
        self._devices.clear()

    def refresh(self, streams: list[Stream]) -> None:
        """Take up changed retentions of cached streams (the collector's housekeeping)."""
        for stream in streams:
            entry = self._streams.get(stream.name)
            if entry is not None and entry.id == stream.id:
                days = stream.retention_days
                entry.retention_ms = None if days is None else days * 86_400_000

    def forget_streams(self, current: dict[str, int]) -> None:
        """Drop what is cached of streams deleted (or created anew) since: `current` maps
        the streams that exist now to their ids."""
        gone = [n for n, e in self._streams.items() if e is not None and current.get(n) != e.id]
        if gone:
            for name in gone:
                del self._streams[name]
            self._devices.clear()

    def _statement(self, session: Session, name: str) -> Any:
        """Core statements built once per dialect, with bound parameters (compiled once)."""
        dialect = session.get_bind().dialect.name
        key = (dialect, name)
        if key not in self._statements:
            insert_ = _insert(session)
            if name == "seen":
                seen = typing.cast(Table, BatchSeen.__table__)
                stmt = insert_(seen).on_conflict_do_nothing().returning(seen.c.sequence)
            elif name in ("aggregates", "totals"):
                table = typing.cast(
                    Table, (Aggregate if name == "aggregates" else BucketTotal).__table__
                )
                keys = ["stream_id", "bucket", "device_id"][: 3 if name == "aggregates" else 2]
                base = insert_(table)
                excluded = base.excluded
                stmt = base.on_conflict_do_update(
                    index_elements=keys,
                    set_={c: table.c[c] + excluded[c] for c in _VALUE_COLUMNS},
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
            elif name == "segments":
                stmt = insert(typing.cast(Table, Segment.__table__))
            else:
                raise KeyError(name)
            self._statements[key] = stmt
        return self._statements[key]

    def _stream(self, session: Session, name: str) -> _StreamEntry | None:
        entry = self._streams.get(name)
        if entry is None:
            row = stream_by_name(session, name)
            if row is None:
                return None
            entry = _StreamEntry(
                row.id,
                params_of(row),
                row.bucket_seconds * 1000,
                row.created_ms,
                row.enrolled_only,
                None if row.retention_days is None else row.retention_days * 86_400_000,
            )
            self._streams[name] = entry
        return entry

    def _device(self, session: Session, stream_id: int, name: str, when: int) -> int:
        key = (stream_id, name)
        device_id = self._devices.get(key)
        if device_id is None:
            session.execute(
                _insert(session)(Device)
                .values(**_new_device(stream_id, name, when))
                .on_conflict_do_nothing()
            )
            device_id = session.scalar(
                select(Device.id).where(Device.stream_id == stream_id, Device.name == name)
            )
            assert device_id is not None
            self._devices[key] = device_id
        return device_id

    def reject(
        self, session: Session, stream: str, device: str, reason: str, when: int, count: int = 1
    ) -> Outcome:
        """Count a reject under (stream, device, reason). Once the table holds
        MAX_REJECT_ROWS rows, rejects of names it does not know yet are counted under
        ("*", "*", reason): clients cannot grow it without bound."""
        key = (stream[:64], device[:64])
        if key not in self._reject_keys:
            now = time.monotonic()
            if now - self._reject_rows[1] > 10:
                self._reject_rows = (
                    session.scalar(select(func.count()).select_from(Reject)) or 0,
                    now,
                )
            if self._reject_rows[0] >= MAX_REJECT_ROWS:
                key = ("*", "*")
            else:
                self._reject_rows = (self._reject_rows[0] + 1, self._reject_rows[1])
                self._reject_keys[key] = None
                if len(self._reject_keys) > MAX_REJECT_ROWS:
                    self._reject_keys.clear()
        stmt = _insert(session)(Reject).values(
            stream=key[0], device=key[1], reason=reason, count=count, last_ms=when
        )
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["stream", "device", "reason"],
                set_={
                    "count": Reject.count + stmt.excluded.count,
                    "last_ms": stmt.excluded.last_ms,
                },
            )
        )
        return Outcome("rejected", reason, stream, device)

    def add(self, session: Session, topic: str, payload: bytes, received_ms: int) -> Outcome:
        """Validate and store one message (see add_many)."""
        return self.add_many(session, [(topic, payload, received_ms)])[0]

    def add_many(self, session: Session, messages: list[tuple[str, bytes, int]]) -> list[Outcome]:
        """Validate messages and store the accepted ones, in the caller's transaction.

        Each message is checked and deduplicated on its own; what the accepted ones add to
        the aggregates, bucket totals, segments and device counters is then written with one
        executemany per table.
        """
        writes = _Writes()
        outcomes = [self._one(session, t, p, ms, writes) for t, p, ms in messages]
        self._write(session, writes)
        return outcomes

    def _one(
        self, session: Session, topic: str, payload: bytes, received_ms: int, writes: _Writes
    ) -> Outcome:
        names = parse_data_topic(topic)
        if names is None:
            return self.reject(session, "", "", "bad_topic", received_ms)
        stream_name, device_name = names
        try:
            check_name("stream", stream_name)
            check_name("device", device_name)
        except ParameterError:  # names a client chose are kept only when valid
            return self.reject(session, "", "", "bad_topic", received_ms)
        entry = self._stream(session, stream_name)
        if entry is None:
            return self.reject(session, stream_name, device_name, "unknown_stream", received_ms)
        try:
            batch = decode_batch(payload, entry.params, stream=stream_name, device=device_name)
        except WireError as exc:
            return self.reject(session, stream_name, device_name, exc.reason, received_ms)
        reason = self._implausible(entry, batch, received_ms)
        if (
            reason is None
            and entry.enrolled_only
            and not self._enrolled(session, entry, device_name)
        ):
            reason = "not_enrolled"
        if reason is not None:
            return replace(
                self.reject(session, stream_name, device_name, reason, received_ms),
                sequence=batch.sequence,
            )
        device_id = self._device(session, entry.id, device_name, received_ms)
        row = {
            "device_id": device_id,
            "sequence": batch.sequence - (1 << 64) if batch.sequence >= 1 << 63 else batch.sequence,
            "generation": 0,
            "digest": payload_digest(payload),
            "received_ms": received_ms,
            "readings": len(batch),
            "bytes": len(payload),
        }
        # RETURNING tells whether the row went in; rowcount is not reliable for
        # ON CONFLICT DO NOTHING across drivers (psycopg reported 1 for a duplicate).
        inserted = session.execute(self._statement(session, "seen"), row).first()
        dev = writes.device(device_id, received_ms)
        last_sequence = None
        if inserted is None:
            if not self._next_generation(session, row):
                dev[4] += 1
                return Outcome("duplicate", None, stream_name, device_name, 0, batch.sequence)
            dev[5] += 1
            last_sequence = session.scalar(
                select(func.max(BatchSeen.sequence)).where(BatchSeen.device_id == device_id)
            )
        self._collect(entry, device_id, batch, writes)
        dev[1] += len(batch)
        dev[2] += 1
        dev[3] += len(payload)
        return Outcome(
            "stored",
            None,
            stream_name,
            device_name,
            len(batch),
            batch.sequence,
            reset=last_sequence is not None,
            last_sequence=last_sequence,
        )

    def _enrolled(self, session: Session, entry: _StreamEntry, name: str) -> bool:
        """Whether the device exists already (enrolled, or heard from before the stream
        was closed); looked up, never created."""
        key = (entry.id, name)
        if key in self._devices:
            return True
        found = session.scalar(
            select(Device.id).where(Device.stream_id == entry.id, Device.name == name)
        )
        if found is not None:
            self._devices[key] = found
        return found is not None

    def _implausible(self, entry: _StreamEntry, batch: Batch, received_ms: int) -> str | None:
        """Why a well-formed batch is still refused (its times), or None."""
        first, last = int(batch.timestamps[0]), int(batch.timestamps[-1])  # never decreasing
        if self.max_buckets is not None and last // entry.bucket_ms - first // entry.bucket_ms >= (
            self.max_buckets
        ):
            buckets = batch.timestamps // entry.bucket_ms
            if 1 + int(np.count_nonzero(np.diff(buckets))) > self.max_buckets:
                return "too_many_buckets"
        if self.max_future_ms is not None and last > received_ms + self.max_future_ms:
            return "future_timestamp"
        if self.max_age_ms is not None and first < received_ms - self.max_age_ms:
            return "too_old"
        if entry.retention_ms is not None and first < received_ms - entry.retention_ms:
            return "too_old"  # it would be deleted at once; and a replay must not return
        if self.backfill_ms is not None and first < entry.created_ms - self.backfill_ms:
            return "before_stream"
        return None

    def _next_generation(self, session: Session, row: dict[str, Any]) -> bool:
        """The (device, sequence) is taken: store this batch as the next generation of it
        (True), unless one of them has its content, or predates digests (False: a
        duplicate)."""
        for _ in range(10):  # another collector may take the same generation meanwhile
            taken = session.execute(
                select(BatchSeen.generation, BatchSeen.digest).where(
                    BatchSeen.device_id == row["device_id"], BatchSeen.sequence == row["sequence"]
                )
            ).all()
            if any(digest is None or digest == row["digest"] for _, digest in taken):
                return False
            row["generation"] = max((g for g, _ in taken), default=-1) + 1
            if session.execute(self._statement(session, "seen"), row).first() is not None:
                return True
        raise StoreError(f"could not store a generation of sequence {row['sequence']}")

    def _collect(self, entry: _StreamEntry, device_id: int, batch: Batch, writes: _Writes) -> None:
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

    def _write(self, session: Session, writes: _Writes) -> None:
        if writes.aggregates:
            session.execute(
                self._statement(session, "aggregates"),
                [
                    {
                        "stream_id": s,
                        "bucket": b,
                        "device_id": d,
                        **dict(zip(_VALUE_COLUMNS, v, strict=True)),
                    }
                    for (s, b, d), v in writes.aggregates.items()
                ],
            )
            session.execute(
                self._statement(session, "totals"),
                [
                    {"stream_id": s, "bucket": b, **dict(zip(_VALUE_COLUMNS, v, strict=True))}
                    for (s, b), v in writes.totals.items()
                ],
            )
            session.execute(self._statement(session, "segments"), writes.segments)
        if writes.devices:
            session.execute(
                self._statement(session, "device"),
                [
                    {"did": d, "seen": v[0], "n": v[1], "b": v[2], "size": v[3]}
                    | {"dup": v[4], "rst": v[5]}
                    for d, v in writes.devices.items()
                ],
            )


# -- reading back -----------------------------------------------------------------------------


#: Which devices a sum covers: all (None), a subquery of ids (group_devices), or ids.
Devices = Select[Any] | list[int] | None


@dataclass(frozen=True)
class Sums:
    n: int
    sum_codes: int
    sum_squares: int


def _table(device_ids: Devices) -> type[Aggregate] | type[BucketTotal]:
    """Ungrouped sums read the per-bucket rollup; grouped ones the per-device rows."""
    return BucketTotal if device_ids is None else Aggregate


def _sum_columns(table: type[Aggregate] | type[BucketTotal]) -> list[ColumnElement[Any]]:
    return [
        func.coalesce(func.sum(getattr(table, c)), 0)
        for c in ["n", *_SUM_COLUMNS, *_SQUARE_COLUMNS]
    ]


def _to_sums(row: Any, offset: int = 0) -> Sums:
    values = [int(v or 0) for v in row[offset:]]
    return Sums(
        values[0], from_limbs(values[1 : 1 + SUM_LIMBS]), from_limbs(values[1 + SUM_LIMBS :])
    )


def _window(
    query: Select[Any],
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices,
) -> Select[Any]:
    table = _table(device_ids)
    query = query.where(
        table.stream_id == stream.id,
        table.bucket >= first_bucket,
        table.bucket < stop_bucket,
    )
    if device_ids is not None:
        query = query.where(Aggregate.device_id.in_(device_ids))
    return query


def window_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    device_ids: Devices = None,
) -> Sums:
    """Exact sums over buckets [first, stop) and (optionally) some devices."""
    row = session.execute(
        _window(
            select(*_sum_columns(_table(device_ids))), stream, first_bucket, stop_bucket, device_ids
        )
    ).one()
    return _to_sums(row)


def series_sums(
    session: Session,
    stream: Stream,
    first_bucket: int,
    stop_bucket: int,
    buckets_per_point: int,
    device_ids: Devices = None,
) -> dict[int, Sums]:
    """Exact sums per point of `buckets_per_point` buckets, keyed by the point's first bucket."""
    table = _table(device_ids)
    key = ((table.bucket - first_bucket) // buckets_per_point).label("point")
    query = _window(
        select(key, *_sum_columns(table)), stream, first_bucket, stop_bucket, device_ids
    )
    rows = session.execute(query.group_by(key).order_by(key)).all()
    return {first_bucket + int(r[0]) * buckets_per_point: _to_sums(r, 1) for r in rows}


def estimate(params: Zeal, sums: Sums, confidence: float) -> Estimate | None:
    if sums.n == 0:
        return None
    return params.estimate_from_sums(
        sums.n, sums.sum_codes, sums.sum_squares, confidence=confidence
    )


def devices_of(session: Session, stream: Stream) -> list[Device]:
    return list(
        session.scalars(select(Device).where(Device.stream_id == stream.id).order_by(Device.name))
    )


#: Tags one device may carry, and their sizes.
MAX_TAGS = 32
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 200


def check_tags(tags: dict[str, str]) -> None:
    """StoreError unless `tags` fits: at most MAX_TAGS, keys 1-64 characters without ':',
    values at most 200 characters."""
    if len(tags) > MAX_TAGS:
        raise StoreError(f"a device carries at most {MAX_TAGS} tags, got {len(tags)}")
    for key, value in tags.items():
        if not (0 < len(key) <= MAX_TAG_KEY and len(value) <= MAX_TAG_VALUE and ":" not in key):
            raise StoreError(
                f"tag {key[:MAX_TAG_KEY]!r}: keys are 1-{MAX_TAG_KEY} characters without ':', "
                f"values at most {MAX_TAG_VALUE}"
            )


def enroll(session: Session, stream: Stream, name: str) -> tuple[Device, bool]:
    """The device `name` of `stream`, created (enrolled) if it is new: (device, created).
    StoreError for an invalid name."""
    try:
        check_name("device", name)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    device = session.scalar(
        select(Device).where(Device.stream_id == stream.id, Device.name == name)
    )
    if device is not None:
        return device, False
    device = Device(**_new_device(stream.id, name, now_ms()))
    session.add(device)
    session.flush()
    return device, True


def set_tags(session: Session, device: Device, tags: dict[str, str]) -> None:
    """Replace a device's tags (both the JSON column and the rows groups are queried by)."""
    check_tags(tags)
    device.tags = json.dumps(tags, sort_keys=True)
    session.execute(delete(DeviceTag).where(DeviceTag.device_id == device.id))
    if tags:
        session.execute(
            insert(DeviceTag),
            [{"device_id": device.id, "key": k, "value": v} for k, v in tags.items()],
        )


def group_devices(session: Session, stream: Stream, group: str) -> Select[Any]:
    """The ids of the devices whose tags match ``key:value``, as a subquery to filter by
    (no list of ids travels to the database, however large the group). StoreError if the
    group is malformed or matches no device."""
    key, sep, value = group.partition(":")
    if not sep or not key:
        raise StoreError(f"group {group!r} must look like key:value (e.g. site:aarhus)")
    tagged = select(DeviceTag.device_id).where(DeviceTag.key == key, DeviceTag.value == value)
    ours = tagged.join(Device, Device.id == DeviceTag.device_id).where(
        Device.stream_id == stream.id
    )
    if session.scalar(ours.limit(1)) is None:
        raise StoreError(f"group {group!r} matches no device of stream {stream.name!r}")
    # A device id belongs to one stream, and every sum also filters on the stream: the
    # members of other streams in `tagged` match nothing, and the join is saved.
    return tagged


def groups(session: Session, stream: Stream) -> dict[str, int]:
    """Every ``key:value`` tag pair of the stream's devices, with how many devices carry it."""
    rows = session.execute(
        select(DeviceTag.key, DeviceTag.value, func.count())
        .join(Device, Device.id == DeviceTag.device_id)
        .where(Device.stream_id == stream.id)
        .group_by(DeviceTag.key, DeviceTag.value)
    )
    return dict(sorted((f"{k}:{v}", int(n)) for k, v, n in rows))


# -- segments ---------------------------------------------------------------------------------


def compact(
    session: Session, stream: Stream, *, before_bucket: int | None = None, min_parts: int = 1
) -> int:
    """Merge the parts of each closed bucket into one compressed segment; returns buckets done."""
    query = (
        select(Segment.bucket)
        .where(Segment.stream_id == stream.id)
        .group_by(Segment.bucket)
        .having((func.count() > min_parts) | (func.min(cast(Segment.compacted, Integer)) == 0))
    )
    if before_bucket is not None:
        query = query.where(Segment.bucket < before_bucket)
    done = 0
    for bucket in list(session.scalars(query)):
        parts = list(
            session.scalars(
                select(Segment).where(Segment.stream_id == stream.id, Segment.bucket == bucket)
            )
        )
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
            from_limbs([getattr(a, c) for c in _SUM_COLUMNS]),
            from_limbs([getattr(a, c) for c in _SQUARE_COLUMNS]),
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
            from_limbs([getattr(t, c) for c in _SUM_COLUMNS]),
            from_limbs([getattr(t, c) for c in _SQUARE_COLUMNS]),
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


def rejects(session: Session, stream: str | None = None) -> dict[str, int]:
    query = select(Reject.reason, func.sum(Reject.count)).group_by(Reject.reason)
    if stream is not None:
        query = query.where(Reject.stream == stream)
    return {str(r): int(c) for r, c in session.execute(query)}


def bucket_bounds(stream: Stream, start_ms: int | None, end_ms: int | None) -> tuple[int, int]:
    """Buckets [first, stop) covering [start, end): whole buckets, start rounded down."""
    size = stream.bucket_seconds * 1000
    first = -(1 << 62) if start_ms is None else math.floor(start_ms / size)
    stop = 1 << 62 if end_ms is None else -(-end_ms // size)
    return first, stop
