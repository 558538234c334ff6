"""What the collector's writer takes messages from: one small interface, three sources.

A source connects to where the messages are, hands each to the collector's door
(``offer``), and acknowledges what the writer committed (``ack``). It never stores
anything itself and knows no database:

* ``mqttsource.MqttSource``: Zeal's broker, a persistent MQTT v5 session (the data topics
  unless JetStream carries them, and always the retained stream configurations);
* ``jetstream.JetStreamSource``: NATS's ``$MQTT_msgs`` through a durable pull consumer;
* ``chirpstack.source.ChirpStackSource``: ChirpStack's uplink events on its broker.

Back-pressure is the source's: an MQTT session's Receive Maximum, a JetStream fetch sized by
the room the collector has left (``ZEAL_COLLECTOR_INFLIGHT`` unacknowledged in all).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Offer", "Source"]


class Offer(Protocol):
    """The collector's door for one source: True when the message was queued for the writer
    (the source then waits for ``ack``), False when it was shed there (the source
    acknowledges it at once). ``login``: the broker login that published it, where the
    broker says (else None)."""

    def __call__(
        self,
        topic: str,
        payload: bytes,
        token: int,
        qos: int,
        *,
        retained: bool,
        login: str | None = None,
    ) -> bool: ...


class Source(Protocol):
    """Where the writer's messages come from (see the module's docstring)."""

    #: What the status and the logs call it: "mqtt", "jetstream" or "chirpstack".
    name: str
    #: Connected, and (for a subscription) subscribed: it can hand over messages.
    connected: bool
    #: Its last connection error, None once it is connected again (or never failed).
    last_error: str | None
    #: Set by the collector before ``start``.
    offer: Offer

    @property
    def ready(self) -> bool:
        """Connected, and (for a subscription) subscribed: it can hand messages over."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Flush what was acknowledged, disconnect, and end its thread."""

    def ack(self, messages: list[tuple[int, int]]) -> None:
        """Acknowledge these (token, qos) pairs: called by the writer after its commit."""
