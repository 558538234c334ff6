"""The agent's MQTT connection (paho-mqtt 2.x, MQTT v5 or 3.1.1).

Callbacks run on paho's network thread and only hand events to queues; the agent's own
thread does all database work. paho keeps QoS 1 messages it has not seen acknowledged and
sends them again (DUP) after a reconnect; the agent limits how many it hands over at once.

A failed connection attempt is logged with the broker's address and the cause (once a
minute while it lasts); a session taken over by another client with the same id sets
``taken_over`` instead of reconnecting into a loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Literal, NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from zeal.mqtt.brokerurl import BrokerSettings, Flapping, parse_broker_url, why_unreachable
from zeal.mqtt.client import make_client, owned_client_id
from zeal_edge.errors import PublishError

__all__ = ["Ack", "BrokerSettings", "Connection", "Message", "parse_broker_url"]


log = logging.getLogger(__name__)
#: MQTT v5 reason code of a DISCONNECT sent because another client took the session.
SESSION_TAKEN_OVER = 142
#: MQTT v5 reason code of a PUBACK for a message no subscription matched: the broker kept
#: nothing of it (the collector's session is gone), so it is not delivered.
NO_MATCHING_SUBSCRIBERS = 16


class Ack(NamedTuple):
    """The broker's answer to a publish: ``confirmed`` (the broker has it for the
    collector), ``refused`` (a failure reason code, e.g. not authorized) or ``unheard``
    (no subscriber: the broker dropped it)."""

    mid: int
    outcome: Literal["confirmed", "refused", "unheard"]
    reason: str


class Message(NamedTuple):
    topic: str
    payload: bytes
    retain: bool


class Connection:
    """A paho client that reconnects with backoff and resubscribes after every reconnect."""

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        client_id: str,
        subscriptions: list[str],
        will: tuple[str, bytes] | None = None,
        client: Any = None,
    ) -> None:
        self.settings, self.client_id = settings, owned_client_id(settings.username, client_id)
        self.subscriptions = subscriptions
        self.acks: queue.SimpleQueue[Ack] = queue.SimpleQueue()
        self.messages: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.connected = False
        #: Incremented once the subscriptions of a connection are acknowledged (SUBACK).
        self.subscribed = 0
        self.failed_attempts = 0
        self.taken_over = threading.Event()
        self._flapping = Flapping()
        self._stopping = False
        self._last_failure_log = -1e18
        self._suback_mid: int | None = None
        if settings.protocol == "3.1.1":
            log.warning(
                "MQTT 3.1.1: a broker acknowledges a publish its ACL denies like a delivered "
                "one (3.1.1 has no reason codes), so such a batch leaves the outbox unseen "
                "by the collector; check that %s may write its data topic (docs/edge-agent.md)",
                client_id,
            )
        if client is None:  # unit tests hand in a fake one (tools/testbed/fakepaho.py)
            client = make_client(settings, client_id)
        if will is not None:  # published (retained) by the broker if we vanish
            client.will_set(will[0], will[1], qos=1, retain=True)
        client.max_inflight_messages_set(100)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        self.client = client

    def start(self) -> None:
        self.client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive)
        self.client.loop_start()

    def stop(self) -> None:
        self._stopping = True
        self.client.disconnect()
        self.client.loop_stop()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Queue a QoS 1 message (sent now or after the next connect); returns its mid."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            raise PublishError(f"paho refused to queue a message: {mqtt.error_string(info.rc)}")
        return int(info.mid)

    # -- callbacks (network thread) -----------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        if reason.is_failure:
            log.error("broker %s refused the connection: %s", self.settings.url, reason)
            return
        self.connected = True
        self._flapping.connected(time.monotonic())
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        after = f" after {self.failed_attempts} failed attempts" if self.failed_attempts else ""
        log.info("connected to %s%s", self.settings.url, after)
        self.failed_attempts = 0
        if self.subscriptions:
            _, self._suback_mid = client.subscribe([(topic, 1) for topic in self.subscriptions])

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        self.failed_attempts += 1
        now = time.monotonic()
        if now - self._last_failure_log >= 60:
            self._last_failure_log = now
            log.warning(
                "cannot connect to the broker at %s: %s; retrying (logged once a minute), "
                "batches wait in the outbox meanwhile",
                self.settings.url,
                why_unreachable(self.settings),
            )

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: Any, mid: int, _codes: Any, _properties: Any
    ) -> None:
        if mid == self._suback_mid:
            self.subscribed += 1

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        if getattr(reason, "value", None) == SESSION_TAKEN_OVER:
            self.taken_over.set()
            client.disconnect()  # do not take it back: that would knock the other one off
        elif self._flapping.lost(time.monotonic()) and not self._stopping:
            # A copy of this agent's data directory runs elsewhere (same client id), or the
            # network is that bad: either way, reconnecting at once would not help.
            log.error(
                "the broker at %s closed this agent's connection 3 times within a minute, "
                "each time soon after it was made: is a copy of this data directory running "
                "elsewhere with client id %s? Trying again in 60 s.",
                self.settings.url,
                self.client_id,
            )
            client.reconnect_delay_set(min_delay=60, max_delay=60)
        elif self.connected and not self._stopping:
            log.warning(
                "disconnected from %s (%s); reconnecting with backoff", self.settings.url, reason
            )
        self.connected = False

    def _on_publish(
        self, _client: mqtt.Client, _userdata: Any, mid: int, reason: ReasonCode, _properties: Any
    ) -> None:
        if reason.is_failure:
            self.acks.put(Ack(mid, "refused", str(reason)))
        elif getattr(reason, "value", 0) == NO_MATCHING_SUBSCRIBERS:
            self.acks.put(Ack(mid, "unheard", str(reason)))
        else:
            self.acks.put(Ack(mid, "confirmed", str(reason)))

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put(Message(message.topic, bytes(message.payload), bool(message.retain)))
