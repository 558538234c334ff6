"""A persistent MQTT subscription: what both of the collector's MQTT sources are made of.

Zeal's broker (``mqttsource``) and ChirpStack's (``chirpstack.source``) are read the same
way: a persistent session (what is published while the collector is away waits for it,
``SESSION_EXPIRY``), MQTT v5 Receive Maximum ``ZEAL_COLLECTOR_INFLIGHT`` (the most
unacknowledged messages the broker may send), and manual acknowledgement: a message is
acknowledged only after the transaction that stored (or refused) it committed, and the
last acknowledgements are flushed before a stop. ``subscribed`` has one meaning for both:
the broker granted every subscription of this connection (a SUBACK that refuses one says
why in ``last_error``, and the source is not ready).

A subclass says what it subscribes to (``subscriptions``) and what it does with a message
(``received``); it may watch connections and disconnections (``connected_hook``,
``disconnected_hook``). Tests drive it with a fake client (``client=``), as httpx's
``MockTransport`` drives an HTTP client.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from zeal.mqtt.brokerurl import BrokerSettings, Flapping, why_unreachable
from zeal.mqtt.client import acknowledge, connect_persistent, flush, make_client
from zeal.mqtt.topics import FLUSH_FILTER
from zeal_server.broker import door
from zeal_server.broker.sources import Offer, Translator

__all__ = ["SESSION_EXPIRY", "PersistentSubscription"]

log = logging.getLogger(__name__)

#: The session's expiry: what is published while the collector is away waits this long.
SESSION_EXPIRY = 7 * 24 * 3600


class PersistentSubscription:
    """One persistent MQTT session a source reads (a ``sources.Source`` once a subclass
    says what it subscribes to). `what` names the broker in errors ("broker URL" for Zeal's,
    "ChirpStack's broker URL")."""

    #: Whether the senders are Zeal devices on Zeal's broker (notices, caps, reject budget).
    reaches_devices = True
    #: Whether data messages say which login published them.
    stamps_logins = False
    #: What turns a message into a batch to store (None: it is one already).
    translator: Translator | None = None

    def __init__(
        self,
        name: str,
        broker: BrokerSettings,
        *,
        what: str,
        client_id: str,
        inflight: int,
        client: Any = None,
    ) -> None:
        self.name, self.what = name, what
        self.broker, self.client_id, self.inflight = broker, client_id, inflight
        self.connected = False
        #: Set by a SUBACK granting every subscription of this connection, cleared on
        #: disconnect and by a SUBACK refusing one.
        self.subscribed = threading.Event()
        self.last_error: str | None = None
        #: Connections made (since start).
        self.connects = 0
        self.offer: Offer = lambda *_, **__: False
        self._stopping = False
        self._connect_logged = -1e18  # connection errors are logged once a minute
        self._flapping = Flapping()
        if client is None:  # tests hand in a fake one
            client = make_client(broker, client_id, manual_ack=True, persistent=True)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        self.client = client

    # -- what a subclass says --------------------------------------------------------------

    def subscriptions(self, *, v311: bool) -> list[tuple[str, Any]]:
        """What to subscribe to after each connection."""
        raise NotImplementedError

    def received(self, client: mqtt.Client, message: mqtt.MQTTMessage, topic: str) -> None:
        """A message arrived (network thread): by default offered to the door with its
        payload, acknowledged at once when shed there."""
        payload = bytes(message.payload)
        if not self.offer(topic, payload, message.mid, message.qos, retained=message.retain):
            client.ack(message.mid, message.qos)  # shed: acknowledged, or the broker resends it

    def connected_hook(self, client: mqtt.Client) -> None:
        """A connection was made, before its subscriptions."""

    def disconnected_hook(self, client: mqtt.Client, reason: ReasonCode, flapping: bool) -> bool:
        """The connection was lost; True when the subclass logged it itself."""
        del client, reason, flapping
        return False

    def skipped(self) -> dict[str, int]:
        """Messages acknowledged and left alone, by reason."""
        return {}

    def refusal(
        self, topic: str, *, retained: bool, size: int, budget: door.RejectBudget
    ) -> str | None:
        """Why the door sheds a message (None: it is queued): a device's batch by default."""
        return door.refusal(topic, retained=retained, size=size, budget=budget)

    # -- the Source interface --------------------------------------------------------------

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

    # -- paho callbacks (network thread) --------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self.last_error = f"{self.what} {self.broker.url} refused the collector: {reason}"
            log.error("%s", self.last_error)
            return
        self.connected = True
        self.connects += 1
        self._flapping.connected(time.monotonic())
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.connected_hook(client)
        wanted = self.subscriptions(v311=client.protocol == mqtt.MQTTv311)
        log.info(
            "collector %s connected to %s %s; subscribing to %s",
            self.client_id,
            self.what,
            self.broker.url,
            ", ".join(topic for topic, _options in wanted),
        )
        client.subscribe(wanted)

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: Any, _mid: int, codes: list[Any], _p: Any
    ) -> None:
        refused = [code for code in codes if getattr(code, "is_failure", False)]
        if not refused:
            self.last_error = None
            self.subscribed.set()
            return
        self.subscribed.clear()
        self.last_error = (
            f"{self.what} {self.broker.url} refused the collector's subscription: "
            f"{refused[0]} (its ACL must let the collector's login read what it subscribes to)"
        )
        log.error("%s", self.last_error)

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        self.last_error = f"{self.what} {self.broker.url}: {why_unreachable(self.broker)}"
        now = time.monotonic()
        if now - self._connect_logged >= 60:
            self._connect_logged = now
            log.error("cannot connect to the %s; retrying (logged once a minute)", self.last_error)

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        flapping = self._flapping.lost(time.monotonic())
        logged = self.disconnected_hook(client, reason, flapping)
        if not logged and self.connected and not self._stopping:
            log.warning("disconnected from %s (%s); reconnecting", self.what, reason)
        self.connected = False
        self.subscribed.clear()  # set again by the SUBACK after the next connection

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:  # brokers check UTF-8; never trust that
            topic = ""
        self.received(client, message, topic)
