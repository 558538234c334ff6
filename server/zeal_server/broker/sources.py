"""What the collector's writer takes messages from: one small interface, three sources.

A source connects to where the messages are, hands each to the collector's door
(``offer``), and acknowledges what the writer committed (``ack``). It never stores
anything itself and knows no database:

* ``mqttsource.MqttSource``: Zeal's broker, a persistent MQTT v5 session (the data topics
  unless JetStream carries them, and always the retained stream configurations);
* ``jetstream.JetStreamSource``: NATS's ``$MQTT_msgs`` through a durable pull consumer;
* ``chirpstack.source.ChirpStackSource``: ChirpStack's uplink events on its broker.

The two MQTT sources are one persistent subscription (``mqttsession``) each. Back-pressure
is the source's: an MQTT session's Receive Maximum, a JetStream fetch sized by the room the
collector has left (``ZEAL_COLLECTOR_INFLIGHT`` unacknowledged in all).

What the writer needs to store and acknowledge a message, whichever source it came from,
the message carries (``inbox.Received.source``) and the source says: how to acknowledge it
(``ack``), whether its sender is a device reached over Zeal's broker (``reaches_devices``:
notices, caps, the reject budget), and what turns it into a device's batch when it is not
one yet (``translator``: ChirpStack's uplink events).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from zeal_server.broker.door import RejectBudget
    from zeal_server.ingest import Ingest, Original, Outcome

__all__ = ["Offer", "Source", "Translated", "Translator"]


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


class Translated(NamedTuple):
    """A message translated into the batch its device would have sent (``Ingest.add_many``)."""

    topic: str
    payload: bytes
    #: What identifies its content when the sequence alone does not (a LoRaWAN frame).
    original: Original | None


class Translator(Protocol):
    """Turns a source's messages into devices' batches (writer thread)."""

    def changed(self) -> None:
        """What it reads from the database changed here: read it again before the next
        round."""

    def keep_fresh(self, sessions: sessionmaker[Session]) -> None:
        """Read what it needs from the database again when changed or due (every few
        seconds); a failure is logged, and the round that follows retries as usual."""

    def translate(
        self, session: Session, ingest: Ingest, topic: str, payload: bytes, received_ms: int
    ) -> Translated | Outcome:
        """The message as a batch to store, or its outcome when it goes no further."""


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
    #: Whether its senders are devices on Zeal's broker (notices, caps, the reject budget).
    reaches_devices: bool
    #: Whether its messages say which broker login published them (``Received.login``).
    stamps_logins: bool
    #: What turns its messages into devices' batches (None: they are batches already).
    translator: Translator | None

    @property
    def ready(self) -> bool:
        """Connected, and (for a subscription) subscribed: it can hand messages over."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Flush what was acknowledged, disconnect, and end its thread."""

    def ack(self, messages: list[tuple[int, int]]) -> None:
        """Acknowledge these (token, qos) pairs: called by the writer after its commit."""

    def skipped(self) -> dict[str, int]:
        """Messages it acknowledged and left alone, by reason."""

    def refusal(self, topic: str, *, retained: bool, size: int, budget: RejectBudget) -> str | None:
        """Why the door sheds one of its messages without decoding it (None: it is queued)."""
