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
from collections import Counter
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from sqlalchemy.orm import Session, sessionmaker

from zeal.streamconfig import config_document
from zeal_server import store
from zeal_server.models import Stream
from zeal_server.settings import ServerSettings

__all__ = ["Collector", "config_topic"]

log = logging.getLogger("zeal_server.collector")


def config_topic(stream: str) -> str:
    return f"zeal/v1/{stream}/config"


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
        self.ingest = store.Ingest()
        self.counts: Counter[str] = Counter()
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
        log.info(
            "collector connected; subscribing to $share/%s/zeal/v1/+/+/up",
            self.settings.share_group,
        )
        client.subscribe(f"$share/{self.settings.share_group}/zeal/v1/+/+/up", qos=1)
        self.counts["connects"] += 1

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if self.broker_connected and not self._stop.is_set():
            log.warning("collector disconnected (%s); reconnecting", reason)
        self.broker_connected = False

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
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
            for message, outcome in zip(pending, outcomes, strict=True):
                self.client.ack(message.mid, message.qos)
                self.counts[outcome.status] += 1
                if outcome.status == "stored":
                    self.counts["readings"] += outcome.readings
                elif outcome.status == "rejected":
                    self._log_reject(outcome)
            pending = []

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
