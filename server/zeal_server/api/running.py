"""What the HTTP layer sees of a running collector and of the broker's login admin: the
Protocols that ``zeal_server.broker`` satisfies. The API never imports the broker package;
``zeal_server.app`` hands it the real ones (docs/architecture.md). Of the collector it reads
one status snapshot (``zeal_server.status``) and the commit-lag histogram, publishes through
its configurations, and tells it what changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric
from sqlalchemy.orm import Session, sessionmaker

from zeal_server import store
from zeal_server.logins import Outcome, Wanted
from zeal_server.settings import ServerSettings
from zeal_server.status import CollectorStatus

__all__ = ["Configs", "Logins", "LoginsFor", "Running", "StartCollector"]


class Configs(Protocol):
    """The stream configurations the collector keeps on the broker."""

    def publish(self, document: dict[str, Any]) -> None: ...

    def withdraw(self, tombstone: dict[str, Any]) -> None: ...


class Running(Protocol):
    """A started collector (``zeal_server.broker.collector.Collector`` provides it)."""

    @property
    def configs(self) -> Configs: ...

    def status(self) -> CollectorStatus:
        """Its figures and state now, for /readyz, /healthz and /metrics."""

    def lag_summary(self) -> dict[str, float] | None:
        """The commit lag over the last minute (p50, p99, max, how many)."""

    def lag_metrics(self) -> Iterator[Metric]:
        """The commit lag's histogram family."""

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

    def provision_certificate(
        self, session: Session, device: str, csr: bytes | None = None
    ) -> store.Issued: ...

    def provision_many(
        self, wanted: Sequence[Wanted], session: Session | None = None
    ) -> Iterator[Outcome]: ...

    def revoke(self, device: str, session: Session | None = None) -> Revoked: ...


class Revoked(Protocol):
    """What revoking a device did (``zeal_server.broker.provisioning.Revoked``)."""

    @property
    def certificates(self) -> int: ...

    @property
    def confirmed(self) -> bool: ...


#: The login admin for these settings (raises ProvisioningError when provisioning is off).
LoginsFor = Callable[[ServerSettings], Logins]
