"""Zeal's broker as a source: the collector's persistent MQTT session.

One connection carries what the collector exchanges with Zeal's broker: the devices' data
(unless JetStream carries them, ``ZEAL_NATS_URL``), the retained stream configurations it
reads back (``configsync``) and publishes, and the notices it sends devices. A persistent
subscription (``mqttsession``: session expiry, Receive Maximum ``ZEAL_COLLECTOR_INFLIGHT``,
docs/server.md says what happens when a broker sends more, acknowledgement after the
commit); a configuration message is acknowledged at once.

The client id is ``LOGIN:ID`` (``identity``); another connection taking the session over is
logged and counted, and the session taken back after ``identity.TAKEOVER_RETRY`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from zeal.mqtt.brokerurl import BrokerSettings
from zeal.mqtt.topics import CONFIG_FILTER, DATA_FILTER, MAX_TOPIC_LENGTH, parse_config_topic
from zeal_server.broker import identity
from zeal_server.broker.mqttsession import SESSION_EXPIRY, PersistentSubscription

__all__ = ["SESSION_EXPIRY", "MqttSource", "data_subscription", "subscriptions"]

log = logging.getLogger(__name__)


class MqttSource(PersistentSubscription):
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
        super().__init__(
            "mqtt", broker, what="broker", client_id=client_id, inflight=inflight, client=client
        )
        #: Whether the data topics are subscribed here (not when JetStream carries them).
        self.data = data
        self.topic = data_subscription(share_group)
        #: Sessions another client took over (since start).
        self.takeovers = 0
        self._on_config, self._on_connect_hook = on_config, on_connect
        self._login_property = login_property
        #: Whether the data messages say who published them (``Received.login``).
        self.stamps_logins = bool(login_property) and data

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> Any:
        """Publish at QoS 1 (a configuration retained, a notice not)."""
        return self.client.publish(topic, payload, qos=1, retain=retain)

    def subscriptions(self, *, v311: bool) -> list[tuple[str, Any]]:
        return subscriptions(self.topic, v311=v311, data=self.data)

    def connected_hook(self, client: mqtt.Client) -> None:
        del client
        self._on_connect_hook()

    def disconnected_hook(self, client: mqtt.Client, reason: ReasonCode, flapping: bool) -> bool:
        if getattr(reason, "value", None) != identity.SESSION_TAKEN_OVER and not flapping:
            return False
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
        return True

    def received(self, client: mqtt.Client, message: mqtt.MQTTMessage, topic: str) -> None:
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
