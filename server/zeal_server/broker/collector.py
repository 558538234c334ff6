"""The collector: its sources, the door, and one writer that stores and acknowledges.

Messages come from sources (``sources``): Zeal's broker (``mqttsource``, the data unless
JetStream carries them, and always the stream configurations), NATS JetStream
(``jetstream``, with ``ZEAL_NATS_URL``) and ChirpStack's uplink events
(``chirpstack.source``, with ``ZEAL_CHIRPSTACK_URL``). Each hands its messages to the door
(``door``), which sheds what must not be decoded and queues the rest (``inbox``). One writer
thread takes up to ``batch_max`` messages at a time, stores them in one transaction, and
only then has their source acknowledge each (rejected ones too, so they do not loop). If
the database fails, the transaction is rolled back, nothing is acknowledged, and the same
messages are retried with backoff until it answers again.

The writer also keeps the broker's retained stream configurations true to the database
(``configsync``), tells devices what needs their attention (``notices``), and housekeeps
(compaction, retention, pruning) between transactions. ``status()`` is what the HTTP layer
reads of it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import compress
from operator import attrgetter
from typing import Any, Literal

from prometheus_client.metrics_core import Metric
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal_server import store
from zeal_server.broker import door, identity
from zeal_server.broker.chirpstack.source import ChirpStackSource
from zeal_server.broker.chirpstack.uplinks import Translated, Uplinks
from zeal_server.broker.configsync import ConfigSync
from zeal_server.broker.devicecaps import CapsTeller
from zeal_server.broker.inbox import CHIRPSTACK, DATA, Inbox, Received, Shed
from zeal_server.broker.jetstream import JetStreamSource
from zeal_server.broker.lags import CommitLags
from zeal_server.broker.mqttsource import MqttSource
from zeal_server.broker.notices import Notifier
from zeal_server.broker.sources import Source
from zeal_server.ingest import Ingest, Original, Outcome
from zeal_server.settings import ServerSettings
from zeal_server.status import CollectorStatus, SourceStatus
from zeal_server.store.db import error_text as db_error_text

__all__ = ["Collector", "tally", "transaction_max"]

log = logging.getLogger(__name__)

#: An uplink event larger than this is shed at the door (``too_large``): ChirpStack's carry
#: at most 242 bytes of payload and their radio metadata, a few KB in JSON.
MAX_EVENT = 64 * 1024
#: What ``tally`` reads of each message and outcome (C-level getters).
_RECEIVED_MS = attrgetter("received_ms")
_STATUS, _READINGS, _RESET = attrgetter("status"), attrgetter("readings"), attrgetter("reset")
_STREAM, _DEVICE = attrgetter("stream"), attrgetter("device")


class Collector:
    """Takes from its sources, stores and acknowledges; ``start()``/``stop()`` from the app
    lifespan."""

    def __init__(
        self,
        settings: ServerSettings,
        sessions: sessionmaker[Session],
        *,
        batch_max: int | None = None,
        compact_every: float = 30.0,
        sync_every: float = 2.0,
        mqtt_client: Any = None,
    ) -> None:
        broker = settings.broker
        assert broker is not None
        self.settings = settings
        self.sessions = sessions
        self.sync_every = sync_every
        self.queue = Inbox(2 * settings.collector_inflight)
        #: Data messages queued (network thread) and acknowledged (writer thread): their
        #: difference is what the collector holds unacknowledged.
        self.received = 0
        self.acknowledged = 0
        #: When the oldest message the writer holds arrived (ms), None when it holds none.
        self.oldest_ms: int | None = None
        #: Messages stored in one transaction at most (Inbox.take gathers that many only
        #: under a heavy inflow): by default half of what the source may hold
        #: unacknowledged, so that it goes on receiving the other half while a transaction
        #: stores; all of it on SQLite over MQTT (deploy/SCALING.md, "Fetching and storing in
        #: turn").
        self.batch_max = batch_max or transaction_max(settings)
        self.compact_every = compact_every
        self.ingest = Ingest(
            max_future_ms=settings.max_future_seconds * 1000,
            max_age_ms=settings.max_age_seconds * 1000,
            backfill_ms=settings.backfill_seconds * 1000,
            max_buckets=settings.max_buckets_per_batch,
            device_max_epsilon_per_day=settings.device_max_epsilon_per_day,
            device_rolling_caps=settings.device_rolling_caps,
        )
        self.counts: Counter[str] = Counter()
        #: Rejected messages by reason (door and store); sums to counts["rejected"].
        self.rejected_by: Counter[str] = Counter()
        self.lags = CommitLags()
        self._forget_devices = threading.Event()
        self._caps_read = time.monotonic()
        #: The counter of cap changes the cached caps were read under (None: unknown).
        self._caps_version: int | None = None
        self.budget = door.RejectBudget()
        self.shed = Shed()
        self.database_ok = True
        #: The database's last error (the sources keep their own).
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._log_rejects = door.LogThrottle()
        self._identity, self.client_id = identity.collector_client_id(settings)
        #: Zeal's broker: the data unless JetStream carries them, the configurations always.
        self.mqtt = MqttSource(
            broker,
            client_id=self.client_id,
            share_group=settings.share_group,
            inflight=settings.collector_inflight,
            data=not settings.nats_servers,
            on_config=lambda stream, payload: self.configs.seen(stream, payload),
            on_connect=lambda: self.configs.forget_broker(),
            client=mqtt_client,
            login_property=settings.mqtt_login_property,
        )
        self.configs = ConfigSync(functools.partial(self.mqtt.publish, retain=True), sessions)
        self.notices = Notifier(self.mqtt.publish)
        self.caps_teller = CapsTeller(
            self.notices, settings.device_max_epsilon_per_day, settings.device_rolling_caps
        )
        self.jetstream = self._jetstream_source()
        #: Where devices' batches come from (DATA), and ChirpStack's events (CHIRPSTACK).
        self.data: Source = self.jetstream or self.mqtt
        self.data.offer = self._offer
        #: LoRaWAN uplinks from ChirpStack's MQTT integration (ZEAL_CHIRPSTACK_URL).
        self.uplinks = Uplinks()
        self._reload_bindings = threading.Event()
        self.chirpstack = self._chirpstack_source()
        self.sources: list[Source] = [self.mqtt]
        self.sources += [s for s in (self.jetstream, self.chirpstack) if s is not None]
        # The writer thread's own state.
        self.writer_error: str | None = None
        self._synced_connects = 0
        self._last_sync = self._last_compact = time.monotonic()
        self._backoff = 0.5
        self._retried = False
        self._reload_streams = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="zeal-writer", daemon=True)

    def _jetstream_source(self) -> JetStreamSource | None:
        broker, settings = self.settings.broker, self.settings
        if not settings.nats_servers or broker is None:
            return None
        source = JetStreamSource(
            list(settings.nats_servers),
            consumer=settings.nats_consumer,
            inflight=settings.collector_inflight,
            ack_wait=settings.nats_ack_wait,
            name=self.client_id,
            login=(broker.username, broker.password) if broker.username else None,
        )
        source.room = lambda: settings.collector_inflight - self.holding
        return source

    def _chirpstack_source(self) -> ChirpStackSource | None:
        if self.settings.chirpstack is None:
            return None
        source = ChirpStackSource(
            self.settings.chirpstack,
            client_id=f"{self.client_id}-chirpstack",
            topic=self.settings.chirpstack_topic,
            share_group=self.settings.share_group,
            inflight=self.settings.collector_inflight,
        )
        source.offer = self._offer_event
        self._reload_bindings.set()  # read before the first event is stored
        return source

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for source in self.sources:
            source.start()
        self._writer.start()

    def stop(self) -> None:
        self._stop.set()
        self._writer.join(timeout=30)
        for source in reversed(self.sources):  # Zeal's broker last: it carries the notices
            source.stop()
        if self._identity is not None:
            self._identity.release()

    def streams_changed(self) -> None:
        """A stream was created or deleted through this process: sync the configurations now
        (the API publishes or withdraws the one concerned first, through ``configs``)."""
        self.configs.changed.set()
        self._reload_streams.set()
        self._reload_bindings.set()  # a deleted stream takes its bindings with it

    def bindings_changed(self) -> None:
        """A LoRaWAN binding was made or removed through this process: the writer reads
        them again before its next write (other processes' changes within sync_every)."""
        self._reload_bindings.set()

    def caps_changed(self) -> None:
        """A device or tag cap was set through this process: the writer reads the caps
        again before its next write (other processes' changes within sync_every, when
        the counter of cap changes moves: store.versions)."""
        self._caps_read = 0.0
        self._caps_version = None

    def devices_changed(self) -> None:
        """A device's data was deleted through this process: the writer drops the ids it
        caches before its next write (another process's writer finds out from the failed
        write, rolls back, drops its caches and retries)."""
        self._forget_devices.set()

    # -- what the HTTP layer reads ----------------------------------------------------------

    @property
    def broker_connected(self) -> bool:
        """Connected to Zeal's broker."""
        return self.mqtt.connected

    @property
    def subscribed(self) -> threading.Event:
        """Set by the SUBACK of Zeal's broker after each connection."""
        return self.mqtt.subscribed

    @property
    def holding(self) -> int:
        """Data messages received and not yet acknowledged."""
        return self.received - self.acknowledged

    def status(self) -> CollectorStatus:
        """The figures and state of this collector now (``zeal_server.status``)."""
        counts = Counter(self.counts)
        counts["connects"] = self.mqtt.connects
        counts["session_taken_over"] = self.mqtt.takeovers
        sources = tuple(
            SourceStatus(s.name, s.connected, s.ready, s.last_error, self._skipped(s))
            for s in self.sources
        )
        return CollectorStatus(
            client_id=self.client_id,
            counts=dict(+counts),
            rejected_by=dict(self.rejected_by),
            broker_connected=self.mqtt.connected,
            subscribed=self.mqtt.subscribed.is_set(),
            database_ok=self.database_ok,
            last_error=self.last_error if not self.database_ok else self.mqtt.last_error,
            writer_error=self.writer_error,
            oldest_ms=self.oldest_ms,
            holding=self.holding,
            queued=self.queue.qsize(),
            sources=sources,
        )

    def _skipped(self, source: Source) -> dict[str, int]:
        if source is self.jetstream:
            return {"other_topic": self.jetstream.skipped}
        if source is self.chirpstack:
            return dict(self.uplinks.skipped)
        return {}

    def lag_summary(self) -> dict[str, float] | None:
        """The commit lag over the last minute (p50, p99, max, how many), sorted on demand:
        only /healthz asks for it, not every probe or scrape that reads ``status()``."""
        return self.lags.summary()

    def lag_metrics(self) -> Iterator[Metric]:
        """The commit lag's histogram (``zeal_collector_commit_lag_seconds``)."""
        return self.lags.collect()

    # -- the door (the sources' network threads) -----------------------------------------

    def _offer(
        self,
        topic: str,
        payload: bytes,
        token: int,
        qos: int = 1,
        *,
        retained: bool = False,
        login: str | None = None,
    ) -> bool:
        """The door (zeal_server.broker.door), for a device's batch from the data source:
        False when it is shed there (the source acknowledges it at once), True when it is
        queued for the writer (`token` and `qos`: how to acknowledge it after the commit)."""
        reason = door.refusal(topic, retained=retained, size=len(payload), budget=self.budget)
        if reason is not None:  # shed without decoding or queueing
            self.budget.spend(topic)
            self.shed.add(topic, reason)
            self._count_shed(reason)
            return False
        self.received += 1
        received = Received(topic, payload, token, qos, int(time.time() * 1000), DATA, login)
        if not self.queue.put(received):
            self.counts["queue_full"] += 1  # more than Receive Maximum came (docs/server.md)
        return True

    def _offer_event(
        self,
        topic: str,
        payload: bytes,
        token: int,
        qos: int,
        *,
        retained: bool,
        login: str | None = None,
    ) -> bool:
        """The door for a ChirpStack uplink event: a retained one, or one over the wire's
        size limit, is shed and counted; the rest are queued for the writer, which
        translates them (zeal_server.broker.chirpstack.uplinks). Who sent it is its DevEUI,
        not a `login` on ChirpStack's broker."""
        del login
        reason = "retained" if retained else ("too_large" if len(payload) > MAX_EVENT else None)
        if reason is not None:
            self.shed.add("", reason)
            self._count_shed(reason)
            return False
        self.received += 1
        received = Received(topic, payload, token, qos, int(time.time() * 1000), CHIRPSTACK)
        if not self.queue.put(received):
            self.counts["queue_full"] += 1
        return True

    def _count_shed(self, reason: str) -> None:
        self.counts["rejected"] += 1
        self.counts[reason] += 1
        self.rejected_by[reason] += 1

    # -- writer thread ----------------------------------------------------------------------

    def _write_loop(self) -> None:
        """The writer thread. Database errors are retried (``_commit``); anything else is a
        bug: it ends the writer loudly (logged with its traceback, ``writer_error`` set,
        /livez 503 so an orchestrator restarts the server) instead of being retried as if
        the database were down. Nothing unacknowledged is lost: the broker keeps it."""
        try:
            self._write_until_stopped()
        except Exception as exc:
            self.writer_error = f"{type(exc).__name__}: {exc}"[:300]
            log.exception(
                "the collector's writer stopped on an unexpected error; nothing more is "
                "stored or acknowledged until the server restarts"
            )

    def _write_until_stopped(self) -> None:
        # Notices name the installation; read it before the first message is stored, not
        # only with the first configuration sync (notices of the first batches were lost).
        try:
            with self.sessions() as session:
                self.configs.server_id = self.configs.server_id or store.installation_id(session)
                self.notices.signer = store.signer(session)
        except SQLAlchemyError as exc:  # the sync loop reads them again once the database answers
            log.error("could not read the installation id and key: %s", db_error_text(exc))
        pending: list[Received] = []
        while not (self._stop.is_set() and not pending and self.queue.empty()):
            self._keep_in_sync()
            if not pending:
                self.oldest_ms = None
                pending = self.queue.take(self.batch_max)
                if not pending:
                    self._idle()
                    continue
                self.oldest_ms = pending[0].received_ms
                if self._reload_streams.is_set():  # changed while it waited: applies to these
                    self._reload_streams.clear()
                    self.ingest.reload_streams()
                if self._reload_bindings.is_set() and self.chirpstack is not None:
                    self._load_bindings()  # likewise
            outcome = self._commit(pending)
            if outcome == "stopped":
                return
            if outcome == "stored":
                pending = []
                self._record_shed()
                self._housekeep_when_due()  # a busy writer is never idle

    def _keep_in_sync(self) -> None:
        """Sync the retained configurations when due (a new connection, a change, or every
        sync_every seconds), and drop cached device ids when asked."""
        connects = self.mqtt.connects
        due = (
            connects > self._synced_connects
            or self.configs.changed.is_set()
            or time.monotonic() - self._last_sync >= self.sync_every
        )
        moved = False
        if time.monotonic() - self._caps_read >= self.sync_every:
            self._caps_read = time.monotonic()  # another process's cap applies within it
            moved = self._check_caps()
        if (moved or self.caps_teller.pending) and self.broker_connected:
            self._tell_caps()
        if due and self.broker_connected:
            self._last_sync = time.monotonic()
            ids = self.configs.sync(force=connects > self._synced_connects)
            self.notices.signer = self.notices.signer or self.configs.signer
            if ids is not None:
                self.ingest.forget_streams(ids)
                self._synced_connects = connects
        if self._forget_devices.is_set():
            self._forget_devices.clear()
            self.ingest.forget()
        stale = time.monotonic() - self.uplinks.read_at >= self.sync_every
        if self.chirpstack is not None and (stale or self._reload_bindings.is_set()):
            self._load_bindings()

    def _check_caps(self) -> bool:
        """Drop the cached device caps when the counter of cap changes moved
        (store.versions), or when it cannot be read: one small query, where reading every
        cached cap again cost the writer a tenth of its speed (bench/writer_cost.py).
        Whether it moved."""
        try:
            with self.sessions() as session:
                version: int | None = store.caps_version(session)
        except SQLAlchemyError:
            version = None
        moved = version != self._caps_version
        if version is None or moved:
            self.ingest.forget_caps()
        self._caps_version = version
        return moved

    def _tell_caps(self) -> None:
        """Tell devices their caps (broker.devicecaps): those first seen, and those whose
        caps changed. A failure to read them is tried again at the next sync."""
        try:
            with self.sessions() as session:
                self.caps_teller.tell(session, self.configs.server_id, self._caps_version)
        except SQLAlchemyError as exc:
            log.warning("could not read the devices' caps to tell them: %s", exc)

    def _load_bindings(self) -> None:
        """Read the LoRaWAN bindings again (a change here, or every sync_every seconds; a
        failure is logged once a minute, and the write that follows retries as usual)."""
        self._reload_bindings.clear()
        self.uplinks.read_at = now = time.monotonic()
        try:
            with self.sessions() as session:
                self.uplinks.load(session)
        except SQLAlchemyError as exc:
            if now - self.uplinks.failure_logged >= 60:
                self.uplinks.failure_logged = now
                log.error("could not read the LoRaWAN bindings: %s", db_error_text(exc))

    def _idle(self) -> None:
        """Nothing to store: record what was shed at the door, and housekeep when due."""
        self._record_shed()
        self._housekeep_when_due()

    def _housekeep_when_due(self) -> None:
        """Compaction, retention and pruning every compact_every seconds, between
        transactions, whether the writer is idle or busy."""
        if time.monotonic() - self._last_compact > self.compact_every:
            self._last_compact = time.monotonic()
            self.housekeep()

    def housekeep(self) -> None:
        """Compact closed buckets, delete what is past each stream's retention (whole
        buckets), count the gaps behind the import window as missing and prune the privacy
        ledger behind it (``zeal_server.store.retention.housekeep``)."""
        try:
            with self.sessions() as session, session.begin():
                streams = store.list_streams(session)
                self.ingest.refresh(streams)
                store.housekeep(session, streams, store.now_ms(), max_age_ms=self.ingest.max_age_ms)
        except SQLAlchemyError as exc:
            log.error("housekeeping failed (will retry): %s", db_error_text(exc))
        except Exception:
            # Compaction decodes stored segments: a bug or a damaged segment there must not
            # stop ingestion, so it is logged with its traceback and tried again later.
            log.exception("housekeeping failed on an unexpected error (will retry)")

    def _record_shed(self) -> None:
        """Write the counts of messages shed at the door into the rejects table."""
        counts = self.shed.take()
        if not counts:
            return
        try:
            with self.sessions() as session, session.begin():
                for (stream, device, reason), count in counts.items():
                    now = store.now_ms()
                    self.ingest.reject(session, stream, device, reason, when=now, count=count)
                    self._log_rejects.reject(reason, stream, device)
        except SQLAlchemyError as exc:  # counts only; they are retried with the next batch
            self.shed.give_back(counts)
            log.error(
                "could not record %d shed messages: %s", sum(counts.values()), db_error_text(exc)
            )

    def _commit(self, pending: list[Received]) -> Literal["stored", "retry", "stopped"]:
        """Store `pending` in one transaction and acknowledge each message ("stored"), or
        roll back, acknowledge nothing and back off ("retry"; "stopped" when the server
        stops meanwhile)."""
        try:
            outcomes = self._store(pending)
        except IntegrityError as exc:
            self.ingest.forget()
            if not self._retried:
                # Most likely ids cached from a stream deleted meanwhile (by another
                # process): once more at once, with ids read afresh.
                self._retried = True
                log.info("a stream changed under the collector (%s); retrying", exc.orig)
                return "retry"
            return self._failed(pending, exc)
        except SQLAlchemyError as exc:  # the database is unreachable or failing
            return self._failed(pending, exc)
        self._backoff, self._retried = 0.5, False
        self.database_ok = True
        self._acknowledge(pending, outcomes)
        return "stored"

    def _acknowledge(self, pending: list[Received], outcomes: list[Outcome]) -> None:
        """After the commit: acknowledge every message, count it, and tell devices what
        needs their attention."""
        committed = time.time() * 1000
        if self.chirpstack is None:
            self.data.ack([(message.mid, message.qos) for message in pending])
        else:
            self.data.ack([(m.mid, m.qos) for m in pending if m.source == DATA])
            events = [(m.mid, m.qos) for m in pending if m.source == CHIRPSTACK]
            if events:
                self.chirpstack.ack(events)
        self.acknowledged += len(pending)
        statuses, lags, unusual = tally(pending, outcomes)
        self.caps_teller.seen(told(pending, outcomes, mqtt_only=self.chirpstack is not None))
        for message, outcome in unusual:
            # A LoRaWAN device is not reached over MQTT: no notice, no reject budget.
            mqtt_device = message.source != CHIRPSTACK
            server = self.configs.server_id
            if outcome.status == "stored":  # a reset or a jump (only stored batches are)
                statuses["sequence_reset"] += 1
                if mqtt_device:
                    reason = outcome.reason or "sequence_reset"
                    self.notices.notify(server, outcome, reason, message.payload)
            elif outcome.status == "rejected":
                self.rejected_by[outcome.reason or "unknown"] += 1
                self._log_rejects.reject(outcome.reason or "", outcome.stream, outcome.device)
                if mqtt_device:
                    self.budget.spend(message.topic)
                    self.notices.notify(server, outcome, outcome.reason or "", message.payload)
        self.counts.update(statuses)
        self.lags.observe_many(committed, lags)

    def _failed(self, pending: list[Received], exc: SQLAlchemyError) -> Literal["retry", "stopped"]:
        """Note a failed transaction and wait the backoff (0.5 s doubling to 10 s)."""
        self.database_ok = False
        self.last_error = f"database: {db_error_text(exc)}"
        log.error(
            "storing %d messages failed (%s); not acknowledged, retrying in %.1f s",
            len(pending),
            self.last_error,
            self._backoff,
        )
        self.ingest.forget()
        stopped = self._stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, 10.0)
        return "stopped" if stopped else "retry"

    def _store(self, messages: list[Received]) -> list[Outcome]:
        if self.chirpstack is None:
            rows = [(m.topic, m.payload, m.received_ms) for m in messages]
            logins = [m.login for m in messages] if self.mqtt.stamps_logins else None
            with self.sessions() as session, session.begin():
                return self.ingest.add_many(session, rows, logins=logins)
        with self.sessions() as session, session.begin():
            return self._store_with_uplinks(session, messages)

    def _store_with_uplinks(self, session: Session, messages: list[Received]) -> list[Outcome]:
        """Store a round holding ChirpStack uplink events: each translated to the batch its
        device would have sent (zeal_server.broker.uplinks), those that translate stored
        with the MQTT batches in one ``add_many``; the rest keep the outcome they got."""
        outcomes: list[Outcome | None] = [None] * len(messages)
        rows: list[tuple[str, bytes, int]] = []
        originals: list[Original | None] = []
        logins: list[str | None] = []
        places: list[int] = []
        for k, m in enumerate(messages):
            if m.source != CHIRPSTACK:
                rows.append((m.topic, m.payload, m.received_ms))
                originals.append(None)
                logins.append(m.login)
                places.append(k)
                continue
            done = self.uplinks.translate(session, self.ingest, m.topic, m.payload, m.received_ms)
            if isinstance(done, Translated):
                rows.append((done.topic, done.payload, m.received_ms))
                originals.append(done.original)
                logins.append(None)
                places.append(k)
            else:
                outcomes[k] = done
        stored = self.ingest.add_many(session, rows, originals=originals, logins=logins)
        for k, outcome in zip(places, stored, strict=True):
            outcomes[k] = outcome
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]


def transaction_max(settings: ServerSettings) -> int:
    """The most messages one transaction stores by default: half of
    ``ZEAL_COLLECTOR_INFLIGHT`` where the writer waits on something other than the
    interpreter (PostgreSQL's answers) or the source must ask for more (JetStream), all of
    it on SQLite over MQTT, where SQLite works in this process and paho's network thread
    reading beside it slowed the drain by a tenth (bench/message_cost.py)."""
    inflight = settings.collector_inflight
    if settings.database_url.startswith("sqlite") and not settings.nats_servers:
        return inflight
    return max(1, inflight // 2)


def told(
    messages: Sequence[Any], outcomes: list[Outcome], *, mqtt_only: bool
) -> set[tuple[str, str]]:
    """(stream, device) of the batches stored in a committed round: the devices the
    collector tells their caps (broker.devicecaps; with `mqtt_only`, not LoRaWAN devices,
    which MQTT does not reach). Sets built in C: no Python code runs per message."""
    stored = list(map("stored".__eq__, map(_STATUS, outcomes)))
    if mqtt_only:
        stored = [s and m.source != CHIRPSTACK for s, m in zip(stored, messages, strict=True)]
    kept = list(compress(outcomes, stored))
    return set(zip(map(_STREAM, kept), map(_DEVICE, kept), strict=True))


def tally(
    messages: Sequence[Any], outcomes: list[Outcome]
) -> tuple[Counter[str], list[int], list[tuple[Any, Outcome]]]:
    """A committed round's figures: its outcomes counted by status (and "readings", those
    stored), the arrival times (``received_ms``) of the stored messages, and the messages
    that need more than counting, resets and rejects, with their outcomes. A pass per
    figure with C-level getters: no Python code runs per message of a usual round."""
    statuses = Counter(map(_STATUS, outcomes))
    if statuses["stored"] == len(outcomes):  # the usual round
        lags = list(map(_RECEIVED_MS, messages))
        statuses["readings"] = sum(map(_READINGS, outcomes))
        unusual = list(compress(zip(messages, outcomes, strict=True), map(_RESET, outcomes)))
        return statuses, lags, unusual
    stored = [status == "stored" for status in map(_STATUS, outcomes)]
    lags = list(map(_RECEIVED_MS, compress(messages, stored)))
    statuses["readings"] = sum(map(_READINGS, compress(outcomes, stored)))
    unusual = [
        (message, outcome)
        for message, outcome in zip(messages, outcomes, strict=True)
        if (outcome.reset and outcome.status == "stored") or outcome.status == "rejected"
    ]
    return statuses, lags, unusual
