"""LoRaWAN uplinks from ChirpStack's MQTT integration (``ZEAL_CHIRPSTACK_URL``).

ChirpStack v4 publishes every uplink as an event on the broker its MQTT integration is
configured with (``[integration.mqtt]`` in chirpstack.toml), on
``application/{application_id}/device/{dev_eui}/event/up``. The collector subscribes there
with a client of its own, as it does on Zeal's broker: a persistent session (what ChirpStack
publishes while the collector is away waits for it, at QoS 1), Receive Maximum
``ZEAL_COLLECTOR_INFLIGHT``, and manual acknowledgement: an event is acknowledged only after
the transaction that stored (or refused) its readings committed. The writer translates
and stores them (``zeal_server.broker.chirpstack.uplinks``).

At-least-once delivery needs ChirpStack to publish at QoS 1 (``qos=1`` under
``[integration.mqtt]``; its default 0 loses what the broker cannot deliver). Several
collectors share the events with ``ZEAL_SHARE_GROUP``, as they share Zeal's data topics.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from zeal.mqtt.brokerurl import BrokerSettings, why_unreachable
from zeal.mqtt.client import acknowledge, connect_persistent, flush, make_client
from zeal_server.broker.sources import Offer

__all__ = ["ChirpStackSource", "event_subscription"]

log = logging.getLogger(__name__)

#: A filter the collector never subscribes to on ChirpStack's broker (see zeal.mqtt.client.flush).
_FLUSH_FILTER = "zeal/flush"


def event_subscription(topic: str, share_group: str) -> str:
    """The uplink events' filter, shared among collectors when a group is set."""
    return f"$share/{share_group}/{topic}" if share_group else topic


class ChirpStackSource:
    """The collector's subscription to ChirpStack's uplink events.

    ``offer(topic, payload, mid, qos, retained)`` is the collector's door for them: False
    when it shed the event there (it is then acknowledged at once), True when queued for
    the writer, which acknowledges it after its commit (``ack``).
    """

    def __init__(
        self,
        broker: BrokerSettings,
        *,
        client_id: str,
        topic: str,
        share_group: str,
        inflight: int,
    ) -> None:
        self.name = "chirpstack"
        self.broker, self.inflight = broker, inflight
        self.topic = event_subscription(topic, share_group)
        self.connected = False
        self.subscribed = False
        self.last_error: str | None = None
        self._logged = -1e18  # connection errors are logged once a minute
        self._stopping = False
        self.offer: Offer = lambda *_, **__: False
        client = make_client(broker, client_id, manual_ack=True, persistent=True)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        self.client = client

    def start(self) -> None:
        connect_persistent(
            self.client, self.broker, session_expiry=7 * 24 * 3600, receive_maximum=self.inflight
        )
        self.client.loop_start()

    def stop(self) -> None:
        self._stopping = True
        if self.connected:  # the last acknowledgements first, or they come back
            flush(self.client, _FLUSH_FILTER)
        self.client.disconnect()
        self.client.loop_stop()

    @property
    def ready(self) -> bool:
        return self.subscribed

    def ack(self, messages: list[tuple[int, int]]) -> None:
        """Acknowledge (mid, qos) pairs (writer thread, after the commit)."""
        acknowledge(self.client, messages)

    # -- paho callbacks (its network thread) -----------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self.last_error = f"ChirpStack's broker {self.broker.url} refused us: {reason}"
            log.error("%s", self.last_error)
            return
        self.connected = True
        self.last_error = None
        log.info("subscribing to %s on ChirpStack's broker %s", self.topic, self.broker.url)
        if client.protocol == mqtt.MQTTv311:
            client.subscribe(self.topic, qos=1)
        else:  # a retained event would be replayed at every resubscribe
            client.subscribe(self.topic, options=SubscribeOptions(qos=1, retainHandling=2))

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: Any, _mid: int, codes: list[ReasonCode], _p: Any
    ) -> None:
        refused = [code for code in codes if code.is_failure]
        self.subscribed = not refused
        if refused:
            self.last_error = (
                f"ChirpStack's broker {self.broker.url} refused the subscription to "
                f"{self.topic}: {refused[0]} (its ACL must let the collector read it)"
            )
            log.error("%s", self.last_error)

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        self.last_error = f"ChirpStack's broker {self.broker.url}: {why_unreachable(self.broker)}"
        now = time.monotonic()
        if now - self._logged >= 60:
            self._logged = now
            log.error("cannot connect to %s; retrying (logged once a minute)", self.last_error)

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _p: Any
    ) -> None:
        if self.connected and not self._stopping:
            log.warning("disconnected from ChirpStack's broker (%s); reconnecting", reason)
        self.connected = self.subscribed = False

    def _on_message(self, client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:
            topic = ""
        payload = bytes(message.payload)
        if not self.offer(topic, payload, message.mid, message.qos, retained=message.retain):
            client.ack(message.mid, message.qos)
