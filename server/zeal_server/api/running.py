"""What the HTTP layer sees of a running collector and of the broker's login admin: the
Protocols that ``zeal_server.broker`` satisfies. The API never imports the broker package;
``zeal_server.app`` hands it the real ones (docs/architecture.md)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric
from sqlalchemy.orm import Session, sessionmaker

from zeal_server.settings import ServerSettings

__all__ = [
    "Configs",
    "Logins",
    "LoginsFor",
    "Queue",
    "Running",
    "Source",
    "StartCollector",
    "Subscriber",
    "Uplinks",
]


class Queue(Protocol):
    def qsize(self) -> int: ...


class Lags(Protocol):
    def collect(self) -> Iterator[Metric]: ...

    def summary(self, window_s: float = 60.0) -> dict[str, float] | None: ...


class Source(Protocol):
    """The JetStream source, when the data come from NATS."""

    connected: bool
    last_error: str | None


class Uplinks(Protocol):
    """The LoRaWAN uplinks' translation, when the collector takes them from ChirpStack."""

    skipped: Counter[str]


class Subscriber(Protocol):
    """The ChirpStack source, when LoRaWAN uplinks come from ChirpStack's broker."""

    connected: bool
    subscribed: bool
    last_error: str | None


class Configs(Protocol):
    """The stream configurations the collector keeps on the broker."""

    def publish(self, document: dict[str, Any]) -> None: ...

    def withdraw(self, tombstone: dict[str, Any]) -> None: ...


class Running(Protocol):
    """A started collector: its figures for /metrics and /readyz, and what the routes tell
    it (``zeal_server.broker.collector.Collector`` provides it)."""

    client_id: str
    counts: Counter[str]
    rejected_by: Counter[str]
    broker_connected: bool
    subscribed: threading.Event  # set by the SUBACK of the data topics
    database_ok: bool
    last_error: str | None
    writer_error: str | None
    oldest_ms: int | None

    @property
    def queue(self) -> Queue: ...

    @property
    def lags(self) -> Lags: ...

    @property
    def configs(self) -> Configs: ...

    @property
    def holding(self) -> int: ...

    @property
    def jetstream(self) -> Source | None: ...

    @property
    def chirpstack(self) -> Subscriber | None: ...

    @property
    def uplinks(self) -> Uplinks: ...

    def stop(self) -> None: ...

    def streams_changed(self) -> None: ...

    def devices_changed(self) -> None: ...

    def bindings_changed(self) -> None: ...


#: Builds and starts the collector of a server, on sessions of its own engine.
StartCollector = Callable[[ServerSettings, "sessionmaker[Session]"], Running]


class Broker(Protocol):
    @property
    def url(self) -> str: ...


class Logins(Protocol):
    """Device logins in the broker's dynamic security plugin (errors: ProvisioningError)."""

    @property
    def broker(self) -> Broker: ...

    def provisioned(self) -> list[str]: ...

    def provision(self, device: str) -> str: ...

    def revoke(self, device: str) -> None: ...


#: The login admin for these settings (raises ProvisioningError when provisioning is off).
LoginsFor = Callable[[ServerSettings], Logins]
