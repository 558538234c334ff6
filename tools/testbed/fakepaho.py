"""A stand-in for paho's ``mqtt.Client`` where a unit test needs no broker.

It records what the code under test does with its client (publishes, acknowledgements,
subscriptions) and lets the test play the broker's part by calling the callbacks paho
would call, on the test's thread: :meth:`FakeClient.connected` (CONNACK, then the SUBACK
of what the code subscribed to on it; :meth:`FakeClient.grant` for later ones),
:meth:`FakeClient.deliver` (a PUBLISH), :meth:`FakeClient.drop` (a disconnection).
Nothing is sent anywhere; no thread is started. What a real broker does is tested
against a real broker elsewhere; this is for the layer above the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["FakeClient", "Published"]


@dataclass
class Published:
    """A message the code under test published, and the answer paho gives for it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    mid: int
    rc: int = mqtt.MQTT_ERR_SUCCESS

    def wait_for_publish(self, timeout: float | None = None) -> None:
        """Published at once: there is no network."""

    def is_published(self) -> bool:
        return True


@dataclass
class FakeClient:
    """Records calls; the test plays the broker (module docstring)."""

    protocol: int = mqtt.MQTTv5
    published: list[Published] = field(default_factory=list)
    acked: list[tuple[int, int]] = field(default_factory=list)
    subscribed: list[Any] = field(default_factory=list)
    unsubscribed: list[str] = field(default_factory=list)
    will: tuple[str, bytes, int, bool] | None = None
    running: bool = False
    is_connected_now: bool = False
    _mid: int = 0
    _subacks: list[tuple[int, int]] = field(default_factory=list)
    # The callbacks the code under test sets, as on paho's client.
    on_connect: Any = None
    on_connect_fail: Any = None
    on_disconnect: Any = None
    on_message: Any = None
    on_publish: Any = None
    on_subscribe: Any = None
    on_unsubscribe: Any = None

    def _next_mid(self) -> int:
        self._mid += 1
        return self._mid

    # -- what code calls on paho's client ---------------------------------------------------

    def publish(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False) -> Any:
        message = Published(topic, bytes(payload), qos, retain, self._next_mid())
        if not self.is_connected_now:
            message.rc = mqtt.MQTT_ERR_NO_CONN  # paho queues it for the next connection
        self.published.append(message)
        return message

    def ack(self, mid: int, qos: int) -> int:
        self.acked.append((mid, qos))
        return mqtt.MQTT_ERR_SUCCESS

    def subscribe(self, topic: Any, qos: int = 0, options: Any = None) -> tuple[int, int]:
        mid = self._next_mid()
        topics = topic if isinstance(topic, list) else [(topic, options or qos)]
        self.subscribed.append(topics)
        self._subacks.append((mid, len(topics)))  # answered by grant(), as a broker later
        return mqtt.MQTT_ERR_SUCCESS, mid

    def unsubscribe(self, topic: str) -> tuple[int, int]:
        mid = self._next_mid()
        self.unsubscribed.append(topic)
        if self.on_unsubscribe is not None:
            self.on_unsubscribe(self, None, mid, [], None)
        return mqtt.MQTT_ERR_SUCCESS, mid

    def will_set(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.will = (topic, payload, qos, retain)

    def reconnect_delay_set(self, min_delay: int = 1, max_delay: int = 120) -> None:
        self.reconnect_delay = (min_delay, max_delay)

    def max_inflight_messages_set(self, inflight: int) -> None:
        self.max_inflight = inflight

    def connect_async(self, *_args: Any, **_kwargs: Any) -> None:
        """Nothing happens until the test calls :meth:`connected`."""

    def loop_start(self) -> int:
        self.running = True
        return mqtt.MQTT_ERR_SUCCESS

    def loop_stop(self) -> int:
        self.running = False
        return mqtt.MQTT_ERR_SUCCESS

    def disconnect(self, *_args: Any, **_kwargs: Any) -> int:
        if self.is_connected_now:
            self.drop("Normal disconnection")
        return mqtt.MQTT_ERR_SUCCESS

    def is_connected(self) -> bool:
        return self.is_connected_now

    # -- what the test does as the broker ---------------------------------------------------

    def connected(self, reason: str = "Success", *, refuse: int | None = None) -> None:
        """The broker answers the connection (CONNACK with `reason`), then the
        subscriptions made on it (``grant``, refusing the one at index `refuse`)."""
        code = ReasonCode(PacketTypes.CONNACK, reason)
        self.is_connected_now = not code.is_failure
        self.on_connect(self, None, mqtt.ConnectFlags(session_present=False), code, None)
        self.grant(refuse=refuse)

    def grant(self, *, refuse: int | None = None) -> None:
        """The broker answers the subscriptions asked for so far (SUBACK): each granted,
        but the one at index `refuse` of each request ("Not authorized", as a broker whose
        ACL does not let the client read it answers under MQTT v5)."""
        subacks, self._subacks = self._subacks, []
        for mid, count in subacks:
            if self.on_subscribe is not None:
                codes = [
                    ReasonCode(
                        PacketTypes.SUBACK, "Not authorized" if k == refuse else "Granted QoS 1"
                    )
                    for k in range(count)
                ]
                self.on_subscribe(self, None, mid, codes, None)

    def deliver(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        user: list[tuple[str, str]] | None = None,
    ) -> int:
        """The broker delivers a message (with MQTT v5 user properties `user`); returns its
        mid (what an acknowledgement names)."""
        message = mqtt.MQTTMessage(mid=self._next_mid(), topic=topic.encode())
        message.payload, message.qos, message.retain = payload, qos, retain
        if user is not None:
            message.properties = Properties(PacketTypes.PUBLISH)
            message.properties.UserProperty = user
        self.on_message(self, None, message)
        return message.mid

    def drop(self, reason: str = "Unspecified error") -> None:
        """The connection ends (DISCONNECT from the broker with `reason`, or a lost socket)."""
        self.is_connected_now = False
        code = ReasonCode(PacketTypes.DISCONNECT, reason)
        flags = mqtt.DisconnectFlags(is_disconnect_packet_from_server=True)
        self.on_disconnect(self, None, flags, code, None)
