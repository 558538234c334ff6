"""Which sources a collector reads, as its settings say.

Zeal's broker always (``mqttsource``: the stream configurations, the notices, and the
devices' data unless JetStream carries them); NATS JetStream with ``ZEAL_NATS_URL``
(``jetstream``: then the data come from there); ChirpStack's uplink events with
``ZEAL_CHIRPSTACK_URL`` (``chirpstack.source``). The collector hands every source the same
door and the writer the same inbox; this is the one place that knows which kinds exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from zeal_server.broker.chirpstack.source import ChirpStackSource
from zeal_server.broker.jetstream import JetStreamSource
from zeal_server.broker.mqttsource import MqttSource
from zeal_server.broker.sources import Source
from zeal_server.settings import ServerSettings

__all__ = ["Wired", "open_sources", "transaction_max"]


class Wired(NamedTuple):
    """A collector's sources: Zeal's broker, and every source in start order (it first)."""

    broker: MqttSource
    sources: list[Source]


def open_sources(
    settings: ServerSettings,
    *,
    client_id: str,
    room: Callable[[], int],
    on_config: Callable[[str, bytes], None],
    on_connect: Callable[[], None],
    read_every: float,
    mqtt_client: Any = None,
) -> Wired:
    """The sources `settings` name, not yet started. `room()`: how many more messages the
    collector can hold (a pulling source sizes its fetches by it); `on_config` and
    `on_connect`: what Zeal's broker reports of the stream configurations and of each new
    connection; `read_every`: how often a translator reads its bindings again at most."""
    broker = settings.broker
    assert broker is not None
    zeal = MqttSource(
        broker,
        client_id=client_id,
        share_group=settings.share_group,
        inflight=settings.collector_inflight,
        data=not settings.nats_servers,
        on_config=on_config,
        on_connect=on_connect,
        client=mqtt_client,
        login_property=settings.mqtt_login_property,
    )
    sources: list[Source] = [zeal]
    if settings.nats_servers:
        jetstream = JetStreamSource(
            list(settings.nats_servers),
            consumer=settings.nats_consumer,
            inflight=settings.collector_inflight,
            ack_wait=settings.nats_ack_wait,
            name=client_id,
            login=(broker.username, broker.password) if broker.username else None,
        )
        jetstream.room = room
        sources.append(jetstream)
    if settings.chirpstack is not None:
        chirpstack = ChirpStackSource(
            settings.chirpstack,
            client_id=f"{client_id}-chirpstack",
            topic=settings.chirpstack_topic,
            share_group=settings.share_group,
            inflight=settings.collector_inflight,
        )
        chirpstack.uplinks.read_every = read_every
        sources.append(chirpstack)
    return Wired(zeal, sources)


def transaction_max(settings: ServerSettings) -> int:
    """The most messages one transaction stores by default: half of
    ``ZEAL_COLLECTOR_INFLIGHT`` where the writer waits on something other than the
    interpreter (PostgreSQL's answers) or the source must ask for more (JetStream), all of
    it on SQLite over MQTT, where SQLite works in this process and paho's network thread
    reading beside it slowed the drain by a tenth (bench/message_cost.py)."""
    inflight = settings.collector_inflight
    if settings.database_url.startswith("sqlite") and not settings.nats_servers:
        return inflight
    return max(1, inflight // 2)
