"""Ingest: validate a message completely, then store it once (the caller owns the
transaction).

Ingest validates a message completely before it writes anything; a rejected message leaves
only its reject count. A batch is stored once: its dedup row, its aggregate increments and
its raw segment part go in together, so a redelivery changes nothing. A redelivery is the
same device, sequence number *and content* (a digest of the payload); the same sequence
with other content comes from an outbox that started again (a reinstalled device) and is
stored, counted as a sequence reset, never dropped. A batch that would take its device past
the stream's privacy policy (readings per UTC day and per UTC hour) is refused whole as
``over_budget``.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import (
    delete,
    func,
    select,
)
from sqlalchemy.orm import Session

from zeal import (
    Batch,
    ParameterError,
    WireError,
    decode_batch,
)
from zeal.policy import DAY_MS, HOUR_MS
from zeal.protocol import REJECT_REASONS, check_name
from zeal.topics import parse_data_topic
from zeal_server.fleet import charge_days, new_device_row
from zeal_server.models import (
    BatchSeen,
    Device,
    DeviceDay,
    DeviceHour,
    Reject,
    Stream,
)
from zeal_server.streams import StoreError, insert_for, params_of, stream_by_name
from zeal_server.writes import Raw, StreamEntry, Writes, build_statement, collect, write

#: The wire reason of a payload made with other parameters (or for another topic).
FOREIGN = "fingerprint_mismatch"
#: The rejects table keeps at most about this many (stream, device, reason) rows.
MAX_REJECT_ROWS = 10_000


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
        self._streams: dict[str, StreamEntry | None] = {}
        self._devices: dict[tuple[int, str], int] = {}
        self._reject_keys: dict[tuple[str, str], None] = {}
        self._reject_rows: tuple[int, float] = (0, -1e18)  # (rows, when counted)
        self._statements: dict[tuple[str, str], Any] = {}
        self._raw = Raw()

    def forget(self) -> None:
        """Drop caches (after a rollback, ids created in it are gone)."""
        self._streams.clear()
        self._devices.clear()

    def prune_ledger(self, session: Session, now_ms: int) -> None:
        """Delete the privacy ledger's days and hours that no batch can be charged to any
        more (all before the import window, ``max_age_ms``)."""
        if self.max_age_ms is not None:
            before = (now_ms - self.max_age_ms) // DAY_MS
            session.execute(delete(DeviceDay).where(DeviceDay.day < before))
            hours = before * (DAY_MS // HOUR_MS)
            session.execute(delete(DeviceHour).where(DeviceHour.hour < hours))

    def reload_streams(self) -> None:
        """Read every stream's parameters again when next used (one changed here)."""
        self._streams.clear()

    def refresh(self, streams: list[Stream]) -> None:
        """Take up changed retentions of cached streams, and drop those whose policy changed
        (the collector's housekeeping)."""
        for stream in streams:
            entry = self._streams.get(stream.name)
            if entry is not None and entry.params.fingerprint.hex() != stream.fingerprint:
                del self._streams[stream.name]
            elif entry is not None and entry.id == stream.id:
                days = stream.retention_days
                entry.retention_ms = None if days is None else days * 86_400_000

    def forget_streams(self, current: dict[str, tuple[int, str]]) -> None:
        """Drop what is cached of streams deleted, created anew or given a new policy since:
        `current` maps the streams that exist now to their ids and fingerprints."""
        gone = [
            n
            for n, e in self._streams.items()
            if e is not None and current.get(n) != (e.id, e.params.fingerprint.hex())
        ]
        if gone:
            for name in gone:
                del self._streams[name]
            self._devices.clear()

    def _statement(self, session: Session, name: str) -> Any:
        """Core statements built once per dialect, with bound parameters (compiled once)."""
        key = (session.get_bind().dialect.name, name)
        if key not in self._statements:
            self._statements[key] = build_statement(session, name)
        return self._statements[key]

    def _stream(self, session: Session, name: str) -> StreamEntry | None:
        entry = self._streams.get(name)
        if entry is None:
            row = stream_by_name(session, name)
            if row is None:
                return None
            entry = StreamEntry(
                row.id,
                params_of(row),
                row.bucket_seconds * 1000,
                row.created_ms,
                row.enrolled_only,
                None if row.retention_days is None else row.retention_days * 86_400_000,
            )
            self._streams[name] = entry
        return entry

    def _changed(self, session: Session, name: str, entry: StreamEntry) -> StreamEntry | None:
        """The stream's entry read again if another process gave it a new policy (so a new
        fingerprint) since it was cached, else None: devices that took the new
        configuration are not refused until this process syncs."""
        fingerprint = session.scalar(select(Stream.fingerprint).where(Stream.id == entry.id))
        if fingerprint in (None, entry.params.fingerprint.hex()):
            return None
        del self._streams[name]
        return self._stream(session, name)

    def _device(self, session: Session, stream_id: int, name: str, when: int) -> int:
        key = (stream_id, name)
        device_id = self._devices.get(key)
        if device_id is None:
            session.execute(
                insert_for(session)(Device)
                .values(**new_device_row(stream_id, name, when))
                .on_conflict_do_nothing()
            )
            device_id = session.scalar(
                select(Device.id).where(Device.stream_id == stream_id, Device.name == name)
            )
            assert device_id is not None
            self._devices[key] = device_id
        return device_id

    def reject(
        self, session: Session, stream: str, device: str, reason: str, *, when: int, count: int = 1
    ) -> Outcome:
        """Count a reject under (stream, device, reason). Once the table holds
        MAX_REJECT_ROWS rows, rejects of names it does not know yet are counted under
        ("*", "*", reason): clients cannot grow it without bound. `reason` is one of
        zeal.protocol.REJECT_REASONS (anything else is a bug, refused loudly)."""
        if reason not in REJECT_REASONS:
            raise AssertionError(f"{reason!r} is not in the reject catalogue")
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
        stmt = insert_for(session)(Reject).values(
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

        Each message is checked and deduplicated on its own, in a stable topic order (all
        collectors lock rows in one order: no deadlock); what the accepted ones add to the
        aggregates, totals, segments and devices is then written by ``write``.
        """
        writes, order = Writes(), sorted(range(len(messages)), key=lambda i: messages[i][0])
        try:  # the per-message statements' cursor lives as long as this batch of messages
            outcomes = {i: self._one(session, *messages[i], writes) for i in order}
        finally:
            self._raw.close()
        write(session, writes, self._statement)
        return [outcomes[i] for i in range(len(messages))]

    def _one(  # noqa: PLR0911 (one return per check, in the order docs/server.md lists them)
        self, session: Session, topic: str, payload: bytes, received_ms: int, writes: Writes
    ) -> Outcome:
        names = parse_data_topic(topic)
        if names is None:
            return self.reject(session, "", "", "bad_topic", when=received_ms)
        stream_name, device_name = names
        try:
            check_name("stream", stream_name)
            check_name("device", device_name)
        except ParameterError:  # names a client chose are kept only when valid
            return self.reject(session, "", "", "bad_topic", when=received_ms)
        entry = self._stream(session, stream_name)
        if entry is None:
            return self.reject(
                session, stream_name, device_name, "unknown_stream", when=received_ms
            )
        try:
            batch = decode_batch(payload, entry.params, stream=stream_name, device=device_name)
        except WireError as exc:
            entry = self._changed(session, stream_name, entry) if exc.reason == FOREIGN else None
            if entry is None:
                return self.reject(session, stream_name, device_name, exc.reason, when=received_ms)
            return self._one(session, topic, payload, received_ms, writes)
        reason = self._implausible(entry, batch, received_ms)
        if (
            reason is None
            and entry.enrolled_only
            and not self._enrolled(session, entry, device_name)
        ):
            reason = "not_enrolled"
        if reason is not None:
            return replace(
                self.reject(session, stream_name, device_name, reason, when=received_ms),
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
        inserted = self._raw.first(session, "seen", row)
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
        daily, hourly = entry.params.readings_per_day, entry.params.readings_per_hour
        run = functools.partial(self._raw.first, session)
        if (
            daily is not None
            and hourly is not None
            and not charge_days((daily, hourly), device_id, batch.timestamps, run)
        ):
            session.execute(
                delete(BatchSeen).where(
                    BatchSeen.device_id == device_id,
                    BatchSeen.sequence == row["sequence"],
                    BatchSeen.generation == row["generation"],
                )
            )
            return replace(
                self.reject(session, stream_name, device_name, "over_budget", when=received_ms),
                sequence=batch.sequence,
            )
        collect(entry, device_id, batch, writes)
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

    def _enrolled(self, session: Session, entry: StreamEntry, name: str) -> bool:
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

    def _implausible(self, entry: StreamEntry, batch: Batch, received_ms: int) -> str | None:
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
