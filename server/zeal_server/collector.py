"""The MQTT collector: shared subscription, manual acknowledgement after commit.

paho's network thread only puts messages on a bounded queue (``put`` blocks when it is full,
so a slow database slows reading from the broker instead of dropping anything; the broker
holds the rest for our persistent session). One writer thread takes up to ``batch_max``
messages at a time, validates and stores them in one transaction, commits, and only then
acknowledges each (rejected ones too, so they do not loop). If the database fails, the
transaction is rolled back, nothing is acknowledged, and the same messages are retried
with backoff until it answers again.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from sqlalchemy.orm import Session, sessionmaker

from zeal.streamconfig import config_document
from zeal.wire import MAX_PAYLOAD_BYTES
from zeal_server import store
from zeal_server.models import Stream
from zeal_server.settings import ServerSettings

__all__ = ["Collector", "config_topic", "data_subscription"]

log = logging.getLogger("zeal_server.collector")


def data_subscription(share_group: str) -> str:
    """What the collector subscribes to: every device's data, shared when a group is set.

    One collector (the default) uses a plain subscription. Mosquitto (2.0.11 here) loses
    messages of a *shared* subscription across a broker restart: those queued for the
    collector's session while it was away are dropped when it subscribes again, and without
    subscribing again it receives nothing new (tests/server/test_crash.py,
    test_broker_restart_while_100_devices_publish, found it; deploy/SCALING.md). Several
    collectors need a group (ZEAL_SHARE_GROUP), on a broker whose shared subscriptions
    survive restarts.
    """
    data = "zeal/v1/+/+/up"
    return f"$share/{share_group}/{data}" if share_group else data


def config_topic(stream: str) -> str:
    return f"zeal/v1/{stream}/config"


#: A topic may cause this many rejects in a burst, then REJECT_RATE per second; beyond that
#: its messages are dropped at the door (acknowledged, counted as ``rate_limited``) without
#: being decoded or written, so a device flooding garbage cannot crowd out the others.
REJECT_BURST = 100
REJECT_RATE = 10.0


class RejectBudget:
    """A token bucket per topic, spent by rejected messages only."""

    def __init__(self, burst: int = REJECT_BURST, rate: float = REJECT_RATE) -> None:
        self.burst, self.rate = float(burst), rate
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _level(self, topic: str, now: float) -> float:
        tokens, since = self._buckets.get(topic, (self.burst, now))
        return min(self.burst, tokens + (now - since) * self.rate)

    def allows(self, topic: str) -> bool:
        with self._lock:
            return topic not in self._buckets or self._level(topic, time.monotonic()) >= 1

    def spend(self, topic: str) -> None:
        with self._lock:
            now = time.monotonic()
            # Never below -burst: a device that stops misbehaving is heard again within
            # (burst + 1) / rate seconds (about 10 s), however long it flooded.
            self._buckets[topic] = (max(-self.burst, self._level(topic, now) - 1), now)
            if len(self._buckets) > 100_000:  # forget the fullest buckets (well-behaved topics)
                for key in [k for k, (t, _) in self._buckets.items() if t >= self.burst - 1]:
                    del self._buckets[key]


@dataclass(frozen=True)
class _Message:
    topic: str
    payload: bytes
    mid: int
    qos: int
    received_ms: int


class Collector:
    """Subscribes, stores and acknowledges; ``start()``/``stop()`` from the app lifespan."""

    def __init__(
        self,
        settings: ServerSettings,
        sessions: sessionmaker[Session],
        *,
        queue_size: int = 20_000,
        batch_max: int = 2000,
        compact_every: float = 30.0,
    ) -> None:
        assert settings.broker is not None
        self.settings, self.sessions = settings, sessions
        self.queue: queue.Queue[_Message] = queue.Queue(maxsize=queue_size)
        self.batch_max, self.compact_every = batch_max, compact_every
        self.ingest = store.Ingest(
            max_future_ms=settings.max_future_seconds * 1000,
            backfill_ms=settings.backfill_seconds * 1000,
        )
        self.counts: Counter[str] = Counter()
        self.budget = RejectBudget()
        self.dropped: Counter[tuple[str, str]] = Counter()  # (topic, reason) shed at the door
        # The commit lag of the last 20,000 stored messages (bounded: memory stays flat).
        self._lags: deque[tuple[float, int]] = deque(maxlen=20_000)
        self.broker_connected = False
        self.subscribed = threading.Event()
        self.database_ok = True
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._logged: dict[tuple[str, str], float] = {}
        broker = settings.broker
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=settings.collector_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            manual_ack=True,
        )
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        if broker.username is not None:
            client.username_pw_set(broker.username, broker.password)
        if broker.tls:
            client.tls_set(
                ca_certs=broker.ca_file, certfile=broker.cert_file, keyfile=broker.key_file
            )
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda c, u, mid, codes, p: self.subscribed.set()
        self.client = client
        self._writer = threading.Thread(target=self._write_loop, name="zeal-writer", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        broker = self.settings.broker
        assert broker is not None
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 7 * 24 * 3600
        self.client.connect_async(
            broker.host, broker.port, keepalive=30, clean_start=False, properties=properties
        )
        self.client.loop_start()
        self._writer.start()

    def stop(self) -> None:
        self._stop.set()
        self._writer.join(timeout=30)
        self.client.disconnect()
        self.client.loop_stop()

    def publish_config(self, stream: Stream) -> None:
        """Retain a stream's configuration for agents (also done for all streams on connect)."""
        document = config_document(stream.name, store.params_of(stream))
        self.client.publish(
            config_topic(stream.name), json.dumps(document).encode(), qos=1, retain=True
        )

    # -- paho callbacks (network thread) --------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if reason.is_failure:
            log.error("broker refused the collector: %s", reason)
            return
        self.broker_connected = True
        self.counts["connects"] += 1
        topic = data_subscription(self.settings.share_group)
        log.info("collector connected; subscribing to %s", topic)
        client.subscribe(topic, qos=1)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if self.broker_connected and not self._stop.is_set():
            log.warning("collector disconnected (%s); reconnecting", reason)
        self.broker_connected = False

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        reason = None
        if len(message.payload) > MAX_PAYLOAD_BYTES:
            reason = "too_large"
        elif not self.budget.allows(message.topic):
            reason = "rate_limited"
        if reason is not None:
            # Shed without decoding or queueing; acknowledged so the broker does not resend.
            self.budget.spend(message.topic)
            self.dropped[(message.topic, reason)] += 1
            self.counts["rejected"] += 1
            self.counts[reason] += 1
            client.ack(message.mid, message.qos)
            return
        self.queue.put(
            _Message(
                message.topic,
                bytes(message.payload),
                message.mid,
                message.qos,
                int(time.time() * 1000),
            )
        )

    # -- writer thread ----------------------------------------------------------------------

    def _take(self) -> list[_Message]:
        try:
            messages = [self.queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + 0.05
        while len(messages) < self.batch_max and time.monotonic() < deadline:
            try:
                messages.append(self.queue.get_nowait())
            except queue.Empty:
                time.sleep(0.002)
        return messages

    def _write_loop(self) -> None:
        published_configs = 0
        last_compact = time.monotonic()
        backoff = 0.5
        pending: list[_Message] = []
        while not (self._stop.is_set() and not pending and self.queue.empty()):
            if self.counts["connects"] > published_configs:
                published_configs = self.counts["connects"]
                self._publish_all_configs()
            if not pending:
                pending = self._take()
                if not pending:
                    if time.monotonic() - last_compact > self.compact_every:
                        last_compact = time.monotonic()
                        self._compact()
                    continue
            try:
                outcomes = self._store(pending)
            except Exception as exc:  # the database is unreachable or failing: retry later
                self.database_ok = False
                self.last_error = f"database: {type(exc).__name__}: {exc}"[:500]
                log.error(
                    "storing %d messages failed (%s); not acknowledged, retrying in %.1f s",
                    len(pending),
                    self.last_error,
                    backoff,
                )
                self.ingest.forget()
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            self.database_ok = True
            committed = time.time() * 1000
            for message, outcome in zip(pending, outcomes, strict=True):
                self.client.ack(message.mid, message.qos)
                self.counts[outcome.status] += 1
                if outcome.status == "stored":
                    self.counts["readings"] += outcome.readings
                    self._lags.append((committed, int(committed - message.received_ms)))
                elif outcome.status == "rejected":
                    self.budget.spend(message.topic)
                    self._log_reject(outcome)
            pending = []
            self._record_dropped()

    def _record_dropped(self) -> None:
        """Write the counts of messages shed at the door into the rejects table."""
        if not self.dropped:
            return
        shed, self.dropped = self.dropped, Counter()
        try:
            with self.sessions() as session, session.begin():
                for (topic, reason), count in shed.items():
                    parts = topic.split("/")
                    stream, device = (parts[2], parts[3]) if len(parts) == 5 else ("", "")
                    self.ingest.reject(
                        session, stream, device, reason, int(time.time() * 1000), count=count
                    )
                    self._log_reject(store.Outcome("rejected", reason, stream, device))
        except Exception as exc:  # counts only; they are retried with the next batch
            self.dropped.update(shed)
            log.error("could not record %d shed messages: %s", sum(shed.values()), exc)

    def lag_ms(self, window_s: float = 60.0) -> dict[str, float] | None:
        """Receive-to-commit lag of the messages stored in the last `window_s` (at most the
        last 20,000): p50, p99, max and how many."""
        since = time.time() * 1000 - window_s * 1000
        lags = sorted(lag for when, lag in list(self._lags) if when >= since)
        if not lags:
            return None

        def pick(q: float) -> float:
            return float(lags[min(len(lags) - 1, int(q * len(lags)))])

        return {"p50": pick(0.5), "p99": pick(0.99), "max": float(lags[-1]), "n": len(lags)}

    def _store(self, messages: list[_Message]) -> list[store.Outcome]:
        with self.sessions() as session, session.begin():
            return self.ingest.add_many(
                session, [(m.topic, m.payload, m.received_ms) for m in messages]
            )

    def _log_reject(self, outcome: store.Outcome) -> None:
        key = (outcome.reason or "", f"{outcome.stream}/{outcome.device}")
        now = time.monotonic()
        if now - self._logged.get(key, -1e18) >= 60:
            self._logged[key] = now
            log.warning(
                "rejected a message from %s: %s (logged once a minute per reason and device)",
                key[1],
                key[0],
            )

    def _publish_all_configs(self) -> None:
        try:
            with self.sessions() as session:
                for stream in store.list_streams(session):
                    self.publish_config(stream)
        except Exception as exc:
            log.error("could not publish stream configurations: %s", exc)

    def _compact(self) -> None:
        try:
            with self.sessions() as session, session.begin():
                for stream in store.list_streams(session):
                    closed = int(time.time() * 1000) // (stream.bucket_seconds * 1000) - 1
                    store.compact(session, stream, before_bucket=closed)
        except Exception as exc:
            log.error("compaction failed (will retry): %s", exc)
