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

from typing import Any

from paho.mqtt.subscribeoptions import SubscribeOptions

from zeal.mqtt.brokerurl import BrokerSettings
from zeal_server.broker.chirpstack.uplinks import Uplinks
from zeal_server.broker.door import RejectBudget
from zeal_server.broker.mqttsession import PersistentSubscription

__all__ = ["MAX_EVENT", "ChirpStackSource", "event_subscription"]

#: An uplink event larger than this is shed at the door (``too_large``): ChirpStack's carry
#: at most 242 bytes of payload and their radio metadata, a few KB in JSON.
MAX_EVENT = 64 * 1024


def event_subscription(topic: str, share_group: str) -> str:
    """The uplink events' filter, shared among collectors when a group is set."""
    return f"$share/{share_group}/{topic}" if share_group else topic


class ChirpStackSource(PersistentSubscription):
    """The collector's subscription to ChirpStack's uplink events (a ``sources.Source``).

    Its events are not devices' batches: the writer has its ``translator`` (``Uplinks``)
    turn each into the batch its device would have sent. Its senders are LoRaWAN devices,
    which Zeal's broker does not reach (no notices, no caps told, no reject budget), and
    who sent an event is its DevEUI, not a login on ChirpStack's broker.
    """

    reaches_devices = False

    def __init__(
        self,
        broker: BrokerSettings,
        *,
        client_id: str,
        topic: str,
        share_group: str,
        inflight: int,
        client: Any = None,
    ) -> None:
        super().__init__(
            "chirpstack",
            broker,
            what="ChirpStack's broker",
            client_id=client_id,
            inflight=inflight,
            client=client,
        )
        self.topic = event_subscription(topic, share_group)
        self.uplinks = Uplinks()
        self.translator = self.uplinks

    def subscriptions(self, *, v311: bool) -> list[tuple[str, Any]]:
        if v311:
            return [(self.topic, 1)]
        # A retained event would be replayed at every resubscribe.
        return [(self.topic, SubscribeOptions(qos=1, retainHandling=2))]

    def skipped(self) -> dict[str, int]:
        return dict(self.uplinks.skipped)

    def refusal(self, topic: str, *, retained: bool, size: int, budget: RejectBudget) -> str | None:
        """A retained event, or one over the wire's size limit, is shed (the topic is
        ChirpStack's: the devices' reject budget does not apply)."""
        del topic, budget
        return "retained" if retained else ("too_large" if size > MAX_EVENT else None)
