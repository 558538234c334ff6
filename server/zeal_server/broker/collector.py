"""The MQTT collector: shared subscription, manual acknowledgement after commit.

Back-pressure is the broker's (MQTT v5 Receive Maximum = ``ZEAL_COLLECTOR_INFLIGHT``;
docs/server.md says what happens when a broker sends more). With ``ZEAL_NATS_URL`` the data
come from JetStream instead (``jetstream``), under the same limit. One writer thread takes
up to ``batch_max`` messages at a time, stores them in one transaction, and only then
acknowledges each (rejected ones too, so they do not loop). If the database fails, the
transaction is rolled back, nothing is acknowledged, and the same messages are retried
with backoff until it answers again.

The writer also keeps the broker's retained stream configurations true to the database
(``configsync``) and tells devices what needs their attention (``notices``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal.brokerurl import Flapping, why_unreachable
from zeal.mqttclient import acknowledge, connect_persistent, flush, make_client
from zeal.topics import (
    CONFIG_FILTER,
    DATA_FILTER,
    FLUSH_FILTER,
    MAX_TOPIC_LENGTH,
    parse_config_topic,
)
from zeal_server import store
from zeal_server.broker import door, identity
from zeal_server.broker.chirpstacksource import ChirpStackSource
from zeal_server.broker.configsync import ConfigSync
from zeal_server.broker.inbox import CHIRPSTACK, Inbox, Received, Shed
from zeal_server.broker.jetstream import JetStreamSource
from zeal_server.broker.lags import CommitLags
from zeal_server.broker.notices import Notifier
from zeal_server.broker.uplinks import Translated, Uplinks
from zeal_server.ingest import Ingest, Original, Outcome
from zeal_server.settings import ServerSettings
from zeal_server.store.db import error_text as db_error_text

__all__ = ["Collector", "data_subscription", "subscriptions", "tally"]

log = logging.getLogger(__name__)

#: An uplink event larger than this is shed at the door (``too_large``): ChirpStack's carry
#: at most 242 bytes of payload and their radio metadata, a few KB in JSON.
MAX_EVENT = 64 * 1024
#: What ``tally`` reads of each message and outcome (C-level getters).
_RECEIVED_MS = attrgetter("received_ms")
_STATUS, _READINGS, _RESET = attrgetter("status"), attrgetter("readings"), attrgetter("reset")


class Collector:
    """Subscribes, stores and acknowledges; ``start()``/``stop()`` from the app lifespan."""

    def __init__(
        self,
        settings: ServerSettings,
        sessions: sessionmaker[Session],
        *,
        batch_max: int | None = None,
        compact_every: float = 30.0,
        sync_every: float = 2.0,
    ) -> None:
        assert settings.broker is not None
        self.settings, self.sessions = settings, sessions
        self.sync_every, self.queue = sync_every, Inbox(2 * settings.collector_inflight)
        #: Data messages queued (network thread) and acknowledged (writer thread): their
        #: difference is what the collector holds unacknowledged.
        self.received = self.acknowledged = 0
        #: When the oldest message the writer holds arrived (ms), None when it holds none.
        self.oldest_ms: int | None = None
        #: Messages stored in one transaction at most: by default all the broker may have
        #: in flight (Inbox.take gathers that many only under a heavy inflow).
        self.batch_max, self.compact_every = batch_max or settings.collector_inflight, compact_every
        self.ingest = Ingest(
            max_future_ms=settings.max_future_seconds * 1000,
            max_age_ms=settings.max_age_seconds * 1000,
            backfill_ms=settings.backfill_seconds * 1000,
            max_buckets=settings.max_buckets_per_batch,
        )
        self.counts: Counter[str] = Counter()
        #: Rejected messages by reason (door and store); sums to counts["rejected"].
        self.rejected_by: Counter[str] = Counter()
        self.lags = CommitLags()
        self._forget_devices = threading.Event()
        self.budget = door.RejectBudget()
        self.shed = Shed()
        self.broker_connected = False
        self.subscribed = threading.Event()
        self.database_ok = True
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._connect_logged = -1e18  # connection errors are logged once a minute
        self._log_rejects = door.LogThrottle()
        self._flapping = Flapping()
        broker = settings.broker
        self._identity, self.client_id = identity.collector_client_id(settings)
        client = make_client(broker, self.client_id, manual_ack=True, persistent=True)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda _c, _u, _mid, _codes, _p: self.subscribed.set()
        self.client = client
        self.configs = ConfigSync(
            lambda topic, payload: client.publish(topic, payload, qos=1, retain=True), sessions
        )
        self.notices = Notifier(lambda topic, payload: client.publish(topic, payload, qos=1))
        self.jetstream: JetStreamSource | None = None
        if settings.nats_servers:
            self.jetstream = JetStreamSource(
                list(settings.nats_servers),
                consumer=settings.nats_consumer,
                inflight=settings.collector_inflight,
                ack_wait=settings.nats_ack_wait,
                name=self.client_id,
                login=(broker.username, broker.password) if broker.username else None,
            )
            self.jetstream.offer = self._offer
            self.jetstream.room = lambda: settings.collector_inflight - self.holding
        #: LoRaWAN uplinks from ChirpStack's MQTT integration (ZEAL_CHIRPSTACK_URL).
        self.uplinks, self._reload_bindings = Uplinks(), threading.Event()
        self.chirpstack = self._chirpstack_source()
        # The writer thread's own state.
        self.writer_error: str | None = None
        self._synced_connects = 0
        self._last_sync = self._last_compact = time.monotonic()
        self._backoff, self._retried = 0.5, False
        self._reload_streams = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="zeal-writer", daemon=True)

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
        broker = self.settings.broker
        assert broker is not None
        connect_persistent(
            self.client,
            broker,
            session_expiry=7 * 24 * 3600,
            receive_maximum=self.settings.collector_inflight,
        )
        self.client.loop_start()
        if self.jetstream is not None:
            self.jetstream.start()
        if self.chirpstack is not None:
            self.chirpstack.start()
        self._writer.start()

    def stop(self) -> None:
        self._stop.set()
        self._writer.join(timeout=30)
        if self.jetstream is not None:
            self.jetstream.stop()
        if self.chirpstack is not None:
            self.chirpstack.stop()
        if self.broker_connected:  # the last acknowledgements first, or they come back
            flush(self.client, FLUSH_FILTER)
        self.client.disconnect()
        self.client.loop_stop()
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

    def devices_changed(self) -> None:
        """A device's data was deleted through this process: the writer drops the ids it
        caches before its next write (another process's writer finds out from the failed
        write, rolls back, drops its caches and retries)."""
        self._forget_devices.set()

    # -- paho callbacks (network thread) --------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        if reason.is_failure:
            log.error("broker refused the collector: %s", reason)
            return
        self.broker_connected = True
        self.counts["connects"] += 1
        self._flapping.connected(time.monotonic())
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.configs.forget_broker()
        topic = data_subscription(self.settings.share_group)
        log.info(
            "collector %s connected to %s; subscribing to %s",
            self.client_id,
            self.settings.broker.url if self.settings.broker else "?",
            topic,
        )
        client.subscribe(
            subscriptions(topic, v311=client.protocol == mqtt.MQTTv311, data=self.jetstream is None)
        )

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        broker = self.settings.broker
        assert broker is not None
        self.last_error = f"broker {broker.url}: {why_unreachable(broker)}"
        now = time.monotonic()
        if now - self._connect_logged >= 60:
            self._connect_logged = now
            log.error("cannot connect to the %s; retrying (logged once a minute)", self.last_error)

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        flapping = self._flapping.lost(time.monotonic())
        if getattr(reason, "value", None) == identity.SESSION_TAKEN_OVER or flapping:
            self.counts["session_taken_over"] += 1
            self.last_error = identity.takeover_text(self.client_id, flapping=flapping)
            log.error(
                "%s. Two collectors must never share ZEAL_COLLECTOR_ID (unset it and each "
                "server claims its own); another connection under this collector's login "
                "and id may hold its password. Taking the session back in %d s.",
                self.last_error,
                identity.TAKEOVER_RETRY,
            )
            retry = identity.TAKEOVER_RETRY
            client.reconnect_delay_set(min_delay=retry, max_delay=retry)
        elif self.broker_connected and not self._stop.is_set():
            log.warning("collector disconnected (%s); reconnecting", reason)
        self.broker_connected = False
        self.subscribed.clear()  # set again by the SUBACK after the next connection

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:  # brokers check UTF-8; never trust that
            topic = ""
        data = topic.endswith("/up") or len(topic) > MAX_TOPIC_LENGTH  # configs end in /config
        stream = None if data else parse_config_topic(topic)
        if stream is not None:
            self.configs.seen(stream, bytes(message.payload))
            client.ack(message.mid, message.qos)
            return
        if not self._offer(  # shed: acknowledged, so that the broker does not resend it
            topic, bytes(message.payload), message.mid, retained=message.retain, qos=message.qos
        ):
            client.ack(message.mid, message.qos)

    @property
    def holding(self) -> int:
        """Data messages received and not yet acknowledged."""
        return self.received - self.acknowledged

    def _offer(
        self, topic: str, payload: bytes, token: int, *, retained: bool = False, qos: int = 1
    ) -> bool:
        """The door (zeal_server.broker.door), for a data message from either source: False when it
        is shed there (the source acknowledges it at once), True when it is queued for the
        writer (`token` and `qos`: how to acknowledge it after the commit)."""
        reason = door.refusal(topic, retained=retained, size=len(payload), budget=self.budget)
        if reason is not None:  # shed without decoding or queueing
            self.budget.spend(topic)
            self.shed.add(topic, reason)
            self.counts["rejected"] += 1
            self.counts[reason] += 1
            self.rejected_by[reason] += 1
            return False
        self.received += 1
        if not self.queue.put(Received(topic, payload, token, qos, int(time.time() * 1000))):
            self.counts["queue_full"] += 1  # more than Receive Maximum came (docs/server.md)
        return True

    def _offer_event(self, topic: str, payload: bytes, mid: int, qos: int, retained: bool) -> bool:
        """The door for a ChirpStack uplink event (the network thread of its source): a
        retained one, or one over the wire's size limit, is shed and counted; the rest are
        queued for the writer, which translates them (zeal_server.broker.uplinks)."""
        reason = "retained" if retained else ("too_large" if len(payload) > MAX_EVENT else None)
        if reason is not None:
            self.shed.add("", reason)
            self.counts["rejected"] += 1
            self.counts[reason] += 1
            self.rejected_by[reason] += 1
            return False
        self.received += 1
        received = Received(topic, payload, mid, qos, int(time.time() * 1000), CHIRPSTACK)
        if not self.queue.put(received):
            self.counts["queue_full"] += 1
        return True

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
        connects = self.counts["connects"]
        due = (
            connects > self._synced_connects
            or self.configs.changed.is_set()
            or time.monotonic() - self._last_sync >= self.sync_every
        )
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
        buckets), and prune the dedup rows and the privacy ledger behind the import window
        (``zeal_server.store.retention.housekeep``)."""
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
        main = pending
        if self.chirpstack is not None:
            main = [message for message in pending if message.source != CHIRPSTACK]
            events = [(m.mid, m.qos) for m in pending if m.source == CHIRPSTACK]
            if events:
                self.chirpstack.ack(events)
        if self.jetstream is not None:
            self.jetstream.ack([message.mid for message in main])
        else:
            acknowledge(self.client, [(message.mid, message.qos) for message in main])
        self.acknowledged += len(pending)
        statuses, lags, unusual = tally(pending, outcomes)
        for message, outcome in unusual:
            # A LoRaWAN device is not reached over MQTT: no notice, no reject budget.
            mqtt_device = message.source != CHIRPSTACK
            if outcome.status == "stored":  # a reset (only stored batches are)
                statuses["sequence_reset"] += 1
                if mqtt_device:
                    self.notices.notify(self.configs.server_id, outcome, "sequence_reset")
            elif outcome.status == "rejected":
                self.rejected_by[outcome.reason or "unknown"] += 1
                self._log_rejects.reject(outcome.reason or "", outcome.stream, outcome.device)
                if mqtt_device:
                    self.budget.spend(message.topic)
                    self.notices.notify(self.configs.server_id, outcome, outcome.reason or "")
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
            with self.sessions() as session, session.begin():
                return self.ingest.add_many(session, rows)
        with self.sessions() as session, session.begin():
            return self._store_with_uplinks(session, messages)

    def _store_with_uplinks(self, session: Session, messages: list[Received]) -> list[Outcome]:
        """Store a round holding ChirpStack uplink events: each translated to the batch its
        device would have sent (zeal_server.broker.uplinks), those that translate stored
        with the MQTT batches in one ``add_many``; the rest keep the outcome they got."""
        outcomes: list[Outcome | None] = [None] * len(messages)
        rows: list[tuple[str, bytes, int]] = []
        originals: list[Original | None] = []
        places: list[int] = []
        for k, m in enumerate(messages):
            if m.source != CHIRPSTACK:
                rows.append((m.topic, m.payload, m.received_ms))
                originals.append(None)
                places.append(k)
                continue
            done = self.uplinks.translate(session, self.ingest, m.topic, m.payload, m.received_ms)
            if isinstance(done, Translated):
                rows.append((done.topic, done.payload, m.received_ms))
                originals.append(done.original)
                places.append(k)
            else:
                outcomes[k] = done
        stored = self.ingest.add_many(session, rows, originals=originals)
        for k, outcome in zip(places, stored, strict=True):
            outcomes[k] = outcome
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]


def data_subscription(share_group: str) -> str:
    """What the collector subscribes to: every device's data, shared when a group is set.

    One collector (the default) uses a plain subscription: Mosquitto drops what it queued
    for a shared subscription while the collector was away (deploy/SCALING.md). Several
    collectors need a group (ZEAL_SHARE_GROUP), on a broker whose shared subscriptions
    survive restarts.
    """
    return f"$share/{share_group}/{DATA_FILTER}" if share_group else DATA_FILTER


def subscriptions(data_topic: str, *, v311: bool, data: bool = True) -> list[tuple[str, Any]]:
    """What the collector subscribes to: the data topic (unless the data come from
    JetStream) and the stream configurations.

    Under MQTT v5 our own configuration messages are not echoed back (no_local); the
    retained ones of every stream arrive once, and other servers' changes as they happen.
    Retained data messages are never sent at subscription (retainHandling 2): a batch
    retained on a data topic would otherwise be replayed at every resubscribe. MQTT 3.1.1
    has neither option: our own configurations come back (the sync finds them equal to
    the database's and does nothing), and retained data messages are refused at the door.
    """
    if v311:
        return [(data_topic, 1), (CONFIG_FILTER, 1)] if data else [(CONFIG_FILTER, 1)]
    configs = (CONFIG_FILTER, SubscribeOptions(qos=1, noLocal=True))
    if not data:
        return [configs]
    return [(data_topic, SubscribeOptions(qos=1, retainHandling=2)), configs]


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
