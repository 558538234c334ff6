"""The collector: its sources, the door, and the writer; what it reports.

Messages come from sources (``sources``; which ones the settings name, ``wiring``). Each
hands its messages to the door (``door``, through ``offer``), which sheds what must not be
decoded and queues the rest (``inbox``) with the source they came from. The writer
(``writer``) stores them in transactions and has each message's source acknowledge it
after the commit. ``status()`` is what the HTTP layer reads of it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from sqlalchemy.orm import Session, sessionmaker

from zeal_server.broker import door, identity
from zeal_server.broker.configsync import ConfigSync
from zeal_server.broker.devicecaps import CapsTeller
from zeal_server.broker.inbox import Inbox, Received, Shed
from zeal_server.broker.notices import Notifier
from zeal_server.broker.sources import Source
from zeal_server.broker.wiring import open_sources, transaction_max
from zeal_server.broker.writer import Writer
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings
from zeal_server.status import CollectorStatus, SourceStatus

__all__ = ["Collector"]

log = logging.getLogger(__name__)


class Collector:
    """Takes from its sources, stores and acknowledges; ``start()``/``stop()`` from the app
    lifespan."""

    def __init__(
        self,
        settings: ServerSettings,
        sessions: sessionmaker[Session],
        *,
        batch_max: int | None = None,
        compact_every: float = 30.0,
        sync_every: float = 2.0,
        mqtt_client: Any = None,
    ) -> None:
        self.settings = settings
        self.queue = Inbox(2 * settings.collector_inflight)
        #: Messages queued (network threads); the writer counts those it acknowledged:
        #: their difference is what the collector holds unacknowledged.
        self.received = 0
        self.counts: Counter[str] = Counter()
        #: Rejected messages by reason (door and store); sums to counts["rejected"].
        self.rejected_by: Counter[str] = Counter()
        self.budget = door.RejectBudget()
        self.shed = Shed()
        self._identity, self.client_id = identity.collector_client_id(settings)
        wired = open_sources(
            settings,
            client_id=self.client_id,
            room=lambda: settings.collector_inflight - self.holding,
            on_config=lambda stream, payload: self.configs.seen(stream, payload),
            on_connect=lambda: self.configs.forget_broker(),
            read_every=sync_every,
            mqtt_client=mqtt_client,
        )
        #: Zeal's broker: the configurations and notices always, the data unless another
        #: source carries them.
        self.mqtt = wired.broker
        self.sources: list[Source] = wired.sources
        for source in self.sources:
            source.offer = functools.partial(self._offer, source)
        self.configs = ConfigSync(functools.partial(self.mqtt.publish, retain=True), sessions)
        self.notices = Notifier(self.mqtt.publish)
        caps_teller = CapsTeller(
            self.notices, settings.device_max_epsilon_per_day, settings.device_rolling_caps
        )
        ingest = Ingest(
            max_future_ms=settings.max_future_seconds * 1000,
            max_age_ms=settings.max_age_seconds * 1000,
            backfill_ms=settings.backfill_seconds * 1000,
            max_buckets=settings.max_buckets_per_batch,
            device_max_epsilon_per_day=settings.device_max_epsilon_per_day,
            device_rolling_caps=settings.device_rolling_caps,
        )
        #: Messages stored in one transaction at most (Inbox.take gathers that many only
        #: under a heavy inflow): ``transaction_max``.
        self.writer = Writer(
            sessions,
            ingest,
            self.queue,
            link=self.mqtt,
            configs=self.configs,
            notices=self.notices,
            caps_teller=caps_teller,
            translators=[s.translator for s in self.sources if s.translator is not None],
            shed=self.shed,
            budget=self.budget,
            counts=self.counts,
            rejected_by=self.rejected_by,
            batch_max=batch_max or transaction_max(settings),
            compact_every=compact_every,
            sync_every=sync_every,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for source in self.sources:
            source.start()
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()
        for source in reversed(self.sources):  # Zeal's broker last: it carries the notices
            source.stop()
        if self._identity is not None:
            self._identity.release()

    def streams_changed(self) -> None:
        """A stream was created or deleted through this process: sync the configurations now
        (the API publishes or withdraws the one concerned first, through ``configs``)."""
        self.writer.streams_changed()

    def bindings_changed(self) -> None:
        """A LoRaWAN binding was made or removed through this process: the translators read
        them again before the writer's next round (other processes' changes within
        sync_every)."""
        for source in self.sources:
            if source.translator is not None:
                source.translator.changed()

    def caps_changed(self) -> None:
        """A device or tag cap was set through this process: the writer reads the caps
        again before its next write (other processes' changes within sync_every, when
        the counter of cap changes moves: store.versions)."""
        self.writer.caps_changed()

    def devices_changed(self) -> None:
        """A device's data was deleted through this process: the writer drops the ids it
        caches before its next write (another process's writer finds out from the failed
        write, rolls back, drops its caches and retries)."""
        self.writer.devices_changed()

    # -- what the HTTP layer reads ----------------------------------------------------------

    @property
    def broker_connected(self) -> bool:
        """Connected to Zeal's broker."""
        return self.mqtt.connected

    @property
    def subscribed(self) -> threading.Event:
        """Set by the SUBACK of Zeal's broker granting every subscription of this
        connection."""
        return self.mqtt.subscribed

    @property
    def holding(self) -> int:
        """Data messages received and not yet acknowledged."""
        return self.received - self.writer.acknowledged

    def source(self, name: str) -> Source:
        """The source of that name (``Source.name``); KeyError if it has none."""
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(name)

    @property
    def writer_error(self) -> str | None:
        """Why the writer stopped (a bug), None while it runs."""
        return self.writer.writer_error

    def housekeep(self) -> None:
        """Compact, apply retention and prune now (``Writer.housekeep``)."""
        self.writer.housekeep()

    def status(self) -> CollectorStatus:
        """The figures and state of this collector now (``zeal_server.status``)."""
        counts = Counter(self.counts)
        counts["connects"] = self.mqtt.connects
        counts["session_taken_over"] = self.mqtt.takeovers
        sources = tuple(
            SourceStatus(s.name, s.connected, s.ready, s.last_error, s.skipped())
            for s in self.sources
        )
        writer = self.writer
        return CollectorStatus(
            client_id=self.client_id,
            counts=dict(+counts),
            rejected_by=dict(self.rejected_by),
            broker_connected=self.mqtt.connected,
            subscribed=self.mqtt.subscribed.is_set(),
            database_ok=writer.database_ok,
            last_error=writer.last_error if not writer.database_ok else self.mqtt.last_error,
            writer_error=writer.writer_error,
            oldest_ms=writer.oldest_ms,
            holding=self.holding,
            queued=self.queue.qsize(),
            sources=sources,
        )

    def lag_summary(self) -> dict[str, float] | None:
        """The commit lag over the last minute (p50, p99, max, how many), sorted on demand:
        only /healthz asks for it, not every probe or scrape that reads ``status()``."""
        return self.writer.lags.summary()

    def lag_metrics(self) -> Iterator[Metric]:
        """The commit lag's histogram (``zeal_collector_commit_lag_seconds``)."""
        return self.writer.lags.collect()

    # -- the door (the sources' network threads) -----------------------------------------

    def _offer(
        self,
        source: Source,
        topic: str,
        payload: bytes,
        token: int,
        qos: int = 1,
        *,
        retained: bool = False,
        login: str | None = None,
    ) -> bool:
        """The door (zeal_server.broker.door) for a message of `source`: False when it is
        shed there (the source acknowledges it at once), True when it is queued for the
        writer (`token` and `qos`: how its source acknowledges it after the commit)."""
        reason = source.refusal(topic, retained=retained, size=len(payload), budget=self.budget)
        if reason is not None:  # shed without decoding or queueing
            if source.reaches_devices:
                self.budget.spend(topic)
            self.shed.add(topic, reason)
            self.counts["rejected"] += 1
            self.counts[reason] += 1
            self.rejected_by[reason] += 1
            return False
        self.received += 1
        now = int(time.time() * 1000)
        if not self.queue.put(Received(topic, payload, token, qos, now, source, login)):
            self.counts["queue_full"] += 1  # more than Receive Maximum came (docs/server.md)
        return True
