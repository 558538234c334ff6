"""Storing a transaction's messages: each validated completely, then stored once (the caller
owns the transaction).

Ingest validates a message completely before it writes anything; a rejected message leaves
only its reject count. A batch is stored once: its device's sequence state, its device
counters and its raw segment part go in together, so a redelivery changes nothing. A
redelivery is the same device, sequence number *and content*; the same sequence with other
content comes from an outbox that started again (a reinstalled device) and is stored,
counted as a sequence reset, never dropped (``store.sequences``). A batch that would take
its device past the stream's privacy policy (readings per UTC day and per UTC hour) is
refused whole as ``over_budget``.

A transaction's messages are stored side by side: each stream's payloads decoded together
(``zeal.wirebatches``), checked with array operations, and written with a few statements
per table (``sequences``, ``ledger``, ``writes``), in one order of tables and keys so that
collectors sharing a database do not deadlock. The outcome is, message for message, that
of storing them one at a time in topic order (tests/server/ingest/test_ingest_many.py checks it).
A device that sends one sequence number twice in a transaction has its later messages
stored in a later round of the same transaction, after the earlier ones are settled (such
a round may take rows out of that order: should PostgreSQL then break a deadlock, the
collector rolls back and stores the messages again).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from zeal import ParameterError, Zeal
from zeal.mqtt.topics import MAX_TOPIC_LENGTH, parse_data_topic
from zeal.policy import DeviceCaps
from zeal.protocol import check_name
from zeal.wirebatches import Batches
from zeal_server.ingest.bounded import Bounded
from zeal_server.ingest.groups import (
    Arrived,
    Group,
    Message,
    Outcome,
    implausible,
    rounds,
    select_batches,
)
from zeal_server.ingest.rejectkeys import MAX_REJECT_ROWS, RejectKeys, check_reason
from zeal_server.ingest.settle import Round, Sequences
from zeal_server.ingest.undecodable import decode_contained
from zeal_server.store.budgets import Account, caps_of, identity_of
from zeal_server.store.fleet import LORAWAN, MQTT, add_devices, device_ids, set_transports
from zeal_server.store.models import Stream
from zeal_server.store.rawsql import Raw
from zeal_server.store.sequences import payload_digests
from zeal_server.store.streams import params_of, stream_by_name
from zeal_server.store.writes import StreamEntry, Writes, build_statement, write

__all__ = ["FOREIGN", "MAX_REJECT_ROWS", "Ingest", "Message", "Original", "Outcome"]

#: The wire reason of a payload made with other parameters (or for another topic).
FOREIGN = "fingerprint_mismatch"
#: Device ids the writer keeps in memory at most (least recently used forgotten first):
#: 263 bytes an entry with 21-character names (tracemalloc, 150,000 devices), so at most
#: about 26 MB; a forgotten device costs one indexed lookup when it next sends.
DEVICE_IDS = 100_000
#: Topics whose names were checked, remembered at most (then forgotten all at once).
_TOPICS = 50_000


class Original(NamedTuple):
    """A translated message's own content (``Ingest.add_many``): the bytes that identify it
    for dedup in place of its payload's, the bytes it took on the air, and the DevEUI of the
    LoRaWAN device that sent it (whose cap across streams it spends)."""

    identity: bytes
    size: int
    dev_eui: str | None = None


#: The reject of a message that arrived by another transport than its device's.
TRANSPORT_MISMATCH = "transport_mismatch"


def _transport(originals: Sequence[Original | None] | None, i: int) -> int:
    """How message `i` arrived: translated from a LoRaWAN uplink, or over MQTT."""
    return LORAWAN if originals is not None and originals[i] is not None else MQTT


def _accounts(
    members: list[tuple[int, str]],
    originals: Sequence[Original | None] | None,
    logins: Sequence[str | None] | None,
) -> list[Account] | None:
    """Who sent each member under its device's name (store.budgets.Account): a LoRaWAN
    device by its DevEUI, an MQTT one by the login the broker named (None: not named).
    None when every one is its device itself (the usual round: no tuple per message)."""
    identities = (
        [
            identity_of(
                device,
                None if logins is None else logins[i],
                None if originals is None or originals[i] is None else originals[i].dev_eui,  # type: ignore[union-attr]
            )
            for i, device in members
        ]
        if originals is not None or logins is not None
        else None
    )
    if identities is None or not any(identities):
        return None
    return [(device, who) for (_, device), who in zip(members, identities, strict=True)]


class Decoded(NamedTuple):
    """A stream's messages that decoded (position, device), with their batches."""

    entry: StreamEntry
    name: str
    members: list[tuple[int, str]]
    batches: Batches


class Ingest:
    """Validates and stores messages; caches streams, devices and compiled statements.

    With ``max_future_ms`` set, a batch holding a reading timestamped more than that after
    its arrival is rejected (``future_timestamp``); with ``max_age_ms`` set, one holding a
    reading more than that before its arrival (``too_old``): a device can neither pre-fill
    the future nor rewrite history beyond the import window. With ``backfill_ms`` set, one
    holding a reading timestamped more than that before its stream was created is rejected
    (``before_stream``): its codes cannot have been made with the stream's parameters unless
    the device's clock is wrong. With ``max_buckets`` set, a batch whose readings fall into
    more time buckets than that is rejected (``too_many_buckets``): each bucket costs a
    segment part, so one small batch could otherwise make the writer
    write tens of thousands of rows. The collector sets all four from the server settings.
    """

    def __init__(
        self,
        *,
        max_future_ms: int | None = None,
        max_age_ms: int | None = None,
        backfill_ms: int | None = None,
        max_buckets: int | None = None,
        device_max_epsilon_per_day: float | None = None,
        device_rolling_caps: dict[int, float | None] | None = None,
    ) -> None:
        self.max_future_ms, self.max_age_ms = max_future_ms, max_age_ms
        #: The device cap across streams where no device or tag cap is set (None: none).
        self.device_max_epsilon_per_day = device_max_epsilon_per_day
        #: The default caps over 30 and 365 UTC days (zeal.policy.ROLLING; None: none).
        self.device_rolling_caps = dict(device_rolling_caps or {})
        #: Principal ids and device caps by account (store.budgets.Account), read again
        #: every time the collector syncs (``forget_caps``).
        self._caps: Bounded[Account, tuple[int, DeviceCaps | None]] = Bounded(DEVICE_IDS)
        self.backfill_ms, self.max_buckets = backfill_ms, max_buckets
        self._streams: dict[str, StreamEntry | None] = {}
        #: Device ids and transports (store.fleet) by (stream id, name), the most recently
        #: used DEVICE_IDS of them.
        self._devices: Bounded[tuple[int, str], tuple[int, int | None]] = Bounded(DEVICE_IDS)
        self._topics: dict[str, tuple[str, str] | None] = {}
        self._rejects = RejectKeys()
        self._statements: dict[tuple[str, str], Any] = {}
        self._raw = Raw()

    def forget(self) -> None:
        """Drop caches (after a rollback, ids created in it are gone)."""
        self._streams.clear()
        self._devices.clear()
        self._caps.clear()

    def forget_caps(self) -> None:
        """Read the devices' caps across streams again when next used (one changed)."""
        self._caps.clear()

    def _caps_of(
        self, session: Session, accounts: list[Account]
    ) -> dict[Account, tuple[int, DeviceCaps | None]]:
        """(principal id, caps in micro-epsilon or None) of each account (cached)."""
        found = {a: e for a in accounts if (e := self._caps.find(a)) is not None}
        missing = [a for a in accounts if a not in found]
        if missing:
            default = self.device_max_epsilon_per_day
            rolling = self.device_rolling_caps
            for account, known in caps_of(session, missing, default, rolling).items():
                self._caps[account] = found[account] = known
        return found

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

    def stream_params(self, session: Session, name: str, *, fresh: bool = False) -> Zeal | None:
        """The parameters (a ``zeal.Zeal``) of stream `name`, cached; None when it does not
        exist. With `fresh`, read again should another process have given it a new policy
        since it was cached (a payload made with the new one is refused otherwise)."""
        entry = self._stream(session, name)
        if entry is not None and fresh:
            entry = self._changed(session, name, entry) or entry
        return None if entry is None else entry.params

    def _changed(self, session: Session, name: str, entry: StreamEntry) -> StreamEntry | None:
        """The stream's entry read again if another process gave it a new policy (so a new
        fingerprint) since it was cached, else None: devices that took the new
        configuration are not refused until this process syncs."""
        fingerprint = session.scalar(select(Stream.fingerprint).where(Stream.id == entry.id))
        if fingerprint in (None, entry.params.fingerprint.hex()):
            return None
        del self._streams[name]
        return self._stream(session, name)

    def _horizon(self, session: Session, entry: StreamEntry) -> None:
        """Read the stream's dedup horizon into `entry`, the stream row share-locked until
        the commit on PostgreSQL (a prune moving it waits; see sequences.prune)."""
        key = (session.get_bind().dialect.name, "horizon")
        if key not in self._statements:
            query = select(Stream.horizon_ms).where(Stream.id == bindparam("sid"))
            self._statements[key] = query.with_for_update(read=True)
        entry.horizon_ms = session.scalar(self._statements[key], {"sid": entry.id})

    def _look_up(
        self, session: Session, stream_id: int, names: list[str]
    ) -> dict[str, tuple[int, int | None]]:
        """The ids and transports of those of `names` that are devices of the stream
        (cached)."""
        found = {n: e for n in names if (e := self._devices.find((stream_id, n))) is not None}
        missing = [n for n in names if n not in found]
        for name, known in device_ids(session, stream_id, missing).items():
            self._devices[(stream_id, name)] = known
            found[name] = known
        return found

    def _devices_of(
        self,
        session: Session,
        stream_id: int,
        first_seen: dict[str, int],
        transports: dict[str, int],
    ) -> dict[str, tuple[int, int]]:
        """The ids and transports of the devices named in `first_seen`, creating the new ones
        (with the transport of their first message, `transports`); a device whose transport
        is not known yet gets that one."""
        known = self._look_up(session, stream_id, list(first_seen))
        new = {n: t for n, t in first_seen.items() if n not in known}
        if new:
            add_devices(session, stream_id, new, transports)
            known |= self._look_up(session, stream_id, list(new))
        unset = {n: transports[n] for n, (_, way) in known.items() if way is None}
        if unset:
            set_transports(session, {known[n][0]: way for n, way in unset.items()})
            for name, way in unset.items():
                self._devices[(stream_id, name)] = known[name] = (known[name][0], way)
        return {n: (i, way if way is not None else transports[n]) for n, (i, way) in known.items()}

    def _names(self, topic: str) -> tuple[str, str] | None:
        """(stream, device) of a data topic whose names are valid, else None (cached)."""
        if topic in self._topics:
            return self._topics[topic]
        names = parse_data_topic(topic)
        try:
            if names is not None:
                check_name("stream", names[0])
                check_name("device", names[1])
        except ParameterError:  # names a client chose are kept only when valid
            names = None
        if len(topic) <= MAX_TOPIC_LENGTH:  # what the door lets through: short keys only
            if len(self._topics) >= _TOPICS:
                self._topics.clear()
            self._topics[topic] = names
        return names

    def _reject_key(
        self, session: Session, stream: str, device: str, reason: str
    ) -> tuple[str, str, str]:
        """The rejects row a reject of (stream, device, reason) counts under (RejectKeys).
        A stream that exists is in the cache: the reject's caller has looked it up."""
        entry = self._streams.get(stream)
        if entry is not None and (entry.id, device) not in self._devices:
            self._look_up(session, entry.id, [device])
        is_device = entry is not None and (entry.id, device) in self._devices
        return self._rejects.key(
            session,
            stream,
            device,
            reason,
            stream_id=None if entry is None else entry.id,
            is_device=is_device,
        )

    def reject(
        self, session: Session, stream: str, device: str, reason: str, *, when: int, count: int = 1
    ) -> Outcome:
        """Count `count` rejects under (stream, device, reason) at once (see _reject_key)."""
        check_reason(reason)
        if stream not in ("*", ""):
            self._stream(session, stream)  # cached if it exists
        key = self._reject_key(session, stream, device, reason)
        session.execute(
            self._statement(session, "reject"),
            {"stream": key[0], "device": key[1], "reason": reason, "count": count, "last_ms": when},
        )
        return Outcome("rejected", reason, stream, device)

    def _refuse(
        self,
        session: Session,
        writes: Writes,
        names: tuple[str, str],
        reason: str,
        *,
        when: int,
        sequence: int | None = None,
    ) -> Outcome:
        """A reject counted in `writes` (written with the transaction's other rows)."""
        writes.reject(self._reject_key(session, *names, reason), when)
        return Outcome("rejected", reason, *names, sequence=sequence)

    def add(self, session: Session, topic: str, payload: bytes, received_ms: int) -> Outcome:
        """Validate and store one message (see add_many)."""
        return self.add_many(session, [Message(topic, payload, received_ms)])[0]

    def add_many(
        self,
        session: Session,
        messages: Sequence[Arrived] | Sequence[tuple[str, bytes, int]],
        *,
        originals: Sequence[Original | None] | None = None,
        logins: Sequence[str | None] | None = None,
    ) -> list[Outcome]:
        """Validate messages and store the accepted ones, in the caller's transaction: the
        outcome of each, as if they were stored one at a time in topic order.

        A message translated from another format (a LoRaWAN uplink,
        zeal_server.broker.chirpstack.uplinks) has an `originals` entry: what identifies its
        content for dedup, the bytes it took on the air (counted instead of its payload's)
        and its device's DevEUI. `logins`: the broker login that published each message,
        where the broker says (None: not known); with the DevEUI, whose cap across streams
        it spends (store.budgets).

        A message is anything with its ``topic``, ``payload`` and ``received_ms``
        (``Message``, the collector's ``Received``); plain (topic, payload, received_ms)
        tuples are read as Messages."""
        arrived = cast("Sequence[Arrived]", messages)
        if messages and type(messages[0]) is tuple:
            plain = cast("Sequence[tuple[str, bytes, int]]", messages)
            arrived = [Message(topic, payload, ms) for topic, payload, ms in plain]
        outcomes: list[Outcome | None] = [None] * len(arrived)
        writes = Writes()
        refuse = functools.partial(self._refuse, session)
        caps = functools.partial(self._caps_of, session)

        try:  # the statements' cursor lives as long as this batch of messages
            groups = self._validate(
                session, arrived, outcomes, writes, originals=originals, logins=logins
            )
            if groups:
                split = rounds(groups)
                seq = Sequences(session, writes, groups, len(split))
                for round_ in split:
                    while round_:  # a device's batch beyond its sequence waits for a round
                        round_ = Round(
                            session=session,
                            raw=self._raw,
                            sequences=seq,
                            refuse=refuse,
                            outcomes=outcomes,
                            writes=writes,
                            caps=caps,
                        ).store(round_)
        finally:
            self._raw.close()
        write(session, writes, self._statement)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _validate(
        self,
        session: Session,
        messages: Sequence[Arrived],
        outcomes: list[Outcome | None],
        writes: Writes,
        *,
        originals: Sequence[Original | None] | None = None,
        logins: Sequence[str | None] | None = None,
    ) -> list[Group]:
        """Check everything a message can be refused for before the store, stream by
        stream in topic order (docs/server.md lists the checks): the groups that passed."""
        by_topic: dict[str, list[int]] = {}
        for i, message in enumerate(messages):  # a few topics, many messages each
            by_topic.setdefault(message.topic, []).append(i)
        streams: dict[str, list[tuple[int, str]]] = {}
        for topic in sorted(by_topic):
            names = self._names(topic)
            if names is None:
                for i in by_topic[topic]:
                    outcomes[i] = self._refuse(
                        session, writes, ("", ""), "bad_topic", when=messages[i].received_ms
                    )
            else:
                device = names[1]
                streams.setdefault(names[0], []).extend([(i, device) for i in by_topic[topic]])
        groups = []
        for name, members in streams.items():
            entry = self._stream(session, name)
            if entry is None:
                for i, device in members:
                    when = messages[i].received_ms
                    outcomes[i] = self._refuse(
                        session, writes, (name, device), "unknown_stream", when=when
                    )
                continue
            for part in self._decode(
                session, name, entry, messages, members, outcomes=outcomes, writes=writes
            ):
                groups.append(
                    self._plausible(
                        session,
                        part,
                        messages,
                        outcomes=outcomes,
                        writes=writes,
                        originals=originals,
                        logins=logins,
                    )
                )
        return [g for g in groups if g.positions]

    def _decode(
        self,
        session: Session,
        name: str,
        entry: StreamEntry,
        messages: Sequence[Arrived],
        members: list[tuple[int, str]],
        *,
        outcomes: list[Outcome | None],
        writes: Writes,
    ) -> list[Decoded]:
        """Decode a stream's messages: those that decode, with their batches. A payload
        made with a policy another process gave the stream meanwhile reads the stream
        again, and it and the messages after it are decoded anew. A payload whose
        decoding raises an unexpected error is refused as ``undecodable``
        (``ingest.undecodable``), never an error of the writer."""
        parts = []
        while members:
            payloads = [messages[i].payload for i, _ in members]
            devices = [d for _, d in members]
            batches, errors = decode_contained(payloads, entry.params, stream=name, devices=devices)
            foreign = [k for k, e in errors.items() if e.reason == FOREIGN]
            changed = self._changed(session, name, entry) if foreign else None
            cut = min(foreign) if changed is not None else len(members)
            for k in sorted(k for k in errors if k < cut):
                i, device = members[k]
                reason = errors[k].reason
                outcomes[i] = self._refuse(
                    session, writes, (name, device), reason, when=messages[i].received_ms
                )
            keep = batches.index < cut
            decoded = [members[k] for k in batches.index[keep].tolist()]
            parts.append(Decoded(entry, name, decoded, select_batches(batches, keep)))
            if changed is None:
                break
            entry, members = changed, members[cut:]
        return parts

    def _transports(
        self,
        session: Session,
        stream_id: int,
        members: list[tuple[int, str]],
        keep: np.ndarray,
        *,
        messages: Sequence[Arrived],
        originals: Sequence[Original | None] | None,
    ) -> tuple[dict[str, tuple[int, int]], list[str | None]]:
        """The devices of the kept messages (created as needed, each with the transport of
        its first message) and, message for message, ``transport_mismatch`` where one came
        by another transport than its device's: an MQTT device named like a LoRaWAN
        DevEUI, or the other way round, is another device, never merged into it."""
        first_seen: dict[str, int] = {}
        ways: dict[str, int] = {}
        kept = np.flatnonzero(keep).tolist()
        for k in kept:
            i, device = members[k]
            first_seen.setdefault(device, messages[i].received_ms)
            ways.setdefault(device, _transport(originals, i))
        known = self._devices_of(session, stream_id, first_seen, ways)
        mismatch: list[str | None] = [None] * len(members)
        for k in kept:
            i, device = members[k]
            if known[device][1] != _transport(originals, i):
                mismatch[k] = TRANSPORT_MISMATCH
        return known, mismatch

    def _plausible(
        self,
        session: Session,
        part: Decoded,
        messages: Sequence[Arrived],
        *,
        outcomes: list[Outcome | None],
        writes: Writes,
        originals: Sequence[Original | None] | None = None,
        logins: Sequence[str | None] | None = None,
    ) -> Group:
        """The decoded messages whose times are plausible (``_implausible``) and whose
        device may send (enrolment) and sends the way it always did (its transport), with
        their devices' ids."""
        entry, name, members, batches = part
        received = np.array([messages[i].received_ms for i, _ in members], dtype=np.int64)
        self._horizon(session, entry)
        reasons = implausible(self, entry, batches, received)
        keep = np.ones(len(members), dtype=bool)
        if entry.enrolled_only:  # enrolled, or heard from before the stream was closed
            self._look_up(session, entry.id, list(dict.fromkeys(d for _, d in members)))
            for k, (_, device) in enumerate(members):
                if reasons[k] is None and (entry.id, device) not in self._devices:
                    reasons[k] = "not_enrolled"

        def drop(reasons: Sequence[str | None]) -> None:
            """Refuse each message with a reason (counted in `writes`); out of `keep`."""
            for k, reason in enumerate(reasons):
                if reason is None:
                    continue
                i, device = members[k]
                outcomes[i] = self._refuse(
                    session,
                    writes,
                    (name, device),
                    reason,
                    when=messages[i].received_ms,
                    sequence=int(batches.sequences[k]),
                )
                keep[k] = False

        drop(reasons)
        known, mismatch = self._transports(
            session, entry.id, members, keep, messages=messages, originals=originals
        )
        drop(mismatch)
        if not keep.all():
            members = [m for m, ok in zip(members, keep.tolist(), strict=True) if ok]
            received = received[keep]
        ids = {device: device_id for device, (device_id, _) in known.items()}
        payloads = [messages[i].payload for i, _ in members]
        sizes = list(map(len, payloads))
        if originals is not None:  # translated messages: their own content and size
            for k, (i, _) in enumerate(members):
                if (original := originals[i]) is not None:
                    payloads[k], sizes[k] = original.identity, original.size
        return Group(
            entry,
            name,
            [i for i, _ in members],
            [d for _, d in members],
            select_batches(batches, keep),
            np.array([ids[d] for _, d in members], dtype=np.int64),
            received,
            np.array(sizes, dtype=np.int64),
            payload_digests(payloads),
            _accounts(members, originals, logins),
        )
