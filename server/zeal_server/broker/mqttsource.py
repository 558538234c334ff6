"""Zeal's broker as a source: the collector's persistent MQTT session.

One connection carries what the collector exchanges with Zeal's broker: the devices' data
(unless JetStream carries them, ``ZEAL_NATS_URL``), the retained stream configurations it
reads back (``configsync``) and publishes, and the notices it sends devices. A persistent
session (expiry 7 days), MQTT v5 Receive Maximum ``ZEAL_COLLECTOR_INFLIGHT`` (docs/server.md
says what happens when a broker sends more), and manual acknowledgement: a data message is
acknowledged only after the transaction that stored (or refused) it committed; a
configuration message at once.

The client id is ``LOGIN:ID`` (``identity``); another connection taking the session over is
logged and counted, and the session taken back after ``identity.TAKEOVER_RETRY`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from zeal.mqtt.brokerurl import BrokerSettings, Flapping, why_unreachable
from zeal.mqtt.client import acknowledge, connect_persistent, flush, make_client
from zeal.mqtt.topics import (
    CONFIG_FILTER,
    DATA_FILTER,
    FLUSH_FILTER,
    MAX_TOPIC_LENGTH,
    parse_config_topic,
)
from zeal_server.broker import identity
from zeal_server.broker.sources import Offer

__all__ = ["MqttSource", "data_subscription", "subscriptions"]

log = logging.getLogger(__name__)

#: The session's expiry: what devices send while the collector is away waits this long.
SESSION_EXPIRY = 7 * 24 * 3600


class MqttSource:
    """The collector's session on Zeal's broker (a ``sources.Source``).

    ``on_config(stream, payload)`` receives each stream configuration message (network
    thread); ``on_connect()`` is told of each new connection, before its subscriptions.
    """

    def __init__(
        self,
        broker: BrokerSettings,
        *,
        client_id: str,
        share_group: str,
        inflight: int,
        data: bool,
        on_config: Callable[[str, bytes], None],
        on_connect: Callable[[], None],
        client: Any = None,
        login_property: str | None = None,
    ) -> None:
        """`login_property`: the MQTT v5 user property in which the broker names who
        published a data message (ZEAL_MQTT_LOGIN_PROPERTY; None: it does not)."""
        self.name = "mqtt"
        self.broker, self.client_id, self.inflight = broker, client_id, inflight
        #: Whether the data topics are subscribed here (not when JetStream carries them).
        self.data = data
        self.topic = data_subscription(share_group)
        self.connected = False
        #: Set by the SUBACK after each connection, cleared on disconnect.
        self.subscribed = threading.Event()
        self.last_error: str | None = None
        #: Connections made, and sessions another client took over (since start).
        self.connects = self.takeovers = 0
        self.offer: Offer = lambda *_, **__: False
        self._on_config, self._on_connect_hook = on_config, on_connect
        self._login_property = login_property
        #: Whether the data messages say who published them (``Received.login``).
        self.stamps_logins = bool(login_property) and data
        self._stopping = False
        self._connect_logged = -1e18  # connection errors are logged once a minute
        self._flapping = Flapping()
        if client is None:  # tests hand in a fake one
            client = make_client(broker, client_id, manual_ack=True, persistent=True)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda _c, _u, _mid, _codes, _p: self.subscribed.set()
        self.client = client

    @property
    def ready(self) -> bool:
        return self.subscribed.is_set()

    def start(self) -> None:
        connect_persistent(
            self.client, self.broker, session_expiry=SESSION_EXPIRY, receive_maximum=self.inflight
        )
        self.client.loop_start()

    def stop(self) -> None:
        self._stopping = True
        if self.connected:  # the last acknowledgements first, or they come back
            flush(self.client, FLUSH_FILTER)
        self.client.disconnect()
        self.client.loop_stop()

    def ack(self, messages: list[tuple[int, int]]) -> None:
        """Acknowledge these (mid, qos) pairs (writer thread, after the commit)."""
        acknowledge(self.client, messages)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> Any:
        """Publish at QoS 1 (a configuration retained, a notice not)."""
        return self.client.publish(topic, payload, qos=1, retain=retain)

    # -- paho callbacks (network thread) --------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self.last_error = f"broker {self.broker.url} refused the collector: {reason}"
            log.error("%s", self.last_error)
            return
        self.connected = True
        self.connects += 1
        self._flapping.connected(time.monotonic())
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        self._on_connect_hook()
        log.info(
            "collector %s connected to %s; subscribing to %s",
            self.client_id,
            self.broker.url,
            self.topic if self.data else CONFIG_FILTER,
        )
        client.subscribe(
            subscriptions(self.topic, v311=client.protocol == mqtt.MQTTv311, data=self.data)
        )

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        self.last_error = f"broker {self.broker.url}: {why_unreachable(self.broker)}"
        now = time.monotonic()
        if now - self._connect_logged >= 60:
            self._connect_logged = now
            log.error("cannot connect to the %s; retrying (logged once a minute)", self.last_error)

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        flapping = self._flapping.lost(time.monotonic())
        if getattr(reason, "value", None) == identity.SESSION_TAKEN_OVER or flapping:
            self.takeovers += 1
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
        elif self.connected and not self._stopping:
            log.warning("collector disconnected (%s); reconnecting", reason)
        self.connected = False
        self.subscribed.clear()  # set again by the SUBACK after the next connection

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:  # brokers check UTF-8; never trust that
            topic = ""
        data = topic.endswith("/up") or len(topic) > MAX_TOPIC_LENGTH  # configs end in /config
        stream = None if data else parse_config_topic(topic)
        if stream is not None:
            self._on_config(stream, bytes(message.payload))
            client.ack(message.mid, message.qos)
            return
        payload = bytes(message.payload)
        login = self._login(message) if self._login_property else None
        qos, retained = message.qos, message.retain
        if not self.offer(topic, payload, message.mid, qos, retained=retained, login=login):
            client.ack(message.mid, message.qos)  # shed: acknowledged, or the broker resends it

    def _login(self, message: mqtt.MQTTMessage) -> str:
        """Who published `message`, as the broker stamped it (a broker that stamps refuses
        a client's own; deploy/mosquitto's zeal_retain plugin); "" when it did not."""
        found = ""
        for key, value in getattr(message.properties, "UserProperty", None) or ():
            if key == self._login_property:
                found = value
        return found


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
