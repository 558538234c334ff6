"""The agent's MQTT connection (paho-mqtt 2.x, MQTT v5).

Callbacks run on paho's network thread and only hand events to queues; the agent's own
thread does all database work. paho keeps QoS 1 messages it has not seen acknowledged and
sends them again (DUP) after a reconnect; the agent limits how many it hands over at once.
"""

from __future__ import annotations

import logging
import queue
import ssl
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode

from zeal.brokerurl import BrokerSettings, parse_broker_url

__all__ = ["BrokerSettings", "Connection", "parse_broker_url"]


log = logging.getLogger("zeal_edge.mqtt")


class Connection:
    """A paho client that reconnects with backoff and resubscribes after every reconnect."""

    def __init__(
        self, settings: BrokerSettings, *, client_id: str, subscriptions: list[str]
    ) -> None:
        self.settings = settings
        self.subscriptions = subscriptions
        self.acks: queue.SimpleQueue[tuple[int, bool, str]] = queue.SimpleQueue()
        self.messages: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self.connected = False
        self._stopping = False
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.max_inflight_messages_set(100)
        if settings.username is not None:
            client.username_pw_set(settings.username, settings.password)
        if settings.tls:
            client.tls_set(
                ca_certs=settings.ca_file,
                certfile=settings.cert_file,
                keyfile=settings.key_file,
                tls_version=ssl.PROTOCOL_TLS_CLIENT,
            )
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self.client = client

    def start(self) -> None:
        self.client.connect_async(self.settings.host, self.settings.port, self.settings.keepalive)
        self.client.loop_start()

    def stop(self) -> None:
        self._stopping = True
        self.client.disconnect()
        self.client.loop_stop()

    def publish(self, topic: str, payload: bytes) -> int:
        """Queue a QoS 1 message (sent now or after the next connect); returns its mid."""
        info = self.client.publish(topic, payload, qos=1)
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            raise RuntimeError(f"paho refused to queue a message: {mqtt.error_string(info.rc)}")
        return int(info.mid)

    # -- callbacks (network thread) -----------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if reason.is_failure:
            log.error(
                "broker %s:%d refused the connection: %s",
                self.settings.host,
                self.settings.port,
                reason,
            )
            return
        self.connected = True
        log.info("connected to %s:%d", self.settings.host, self.settings.port)
        for topic in self.subscriptions:
            client.subscribe(topic, qos=1)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if self.connected and not self._stopping:
            log.warning(
                "disconnected from %s:%d (%s); reconnecting with backoff",
                self.settings.host,
                self.settings.port,
                reason,
            )
        self.connected = False

    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        self.acks.put((mid, bool(reason.is_failure), str(reason)))

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put((message.topic, bytes(message.payload)))
