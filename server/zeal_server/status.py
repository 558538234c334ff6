"""What a running collector reports: one snapshot the HTTP layer reads for ``/readyz``,
``/healthz`` and ``/metrics`` (``zeal_server.broker.collector.Collector.status``). Plain
values, taken at once; the API never reads the collector's own state."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CollectorStatus", "SourceStatus"]


@dataclass(frozen=True)
class SourceStatus:
    """One of the collector's sources (``zeal_server.broker.sources``)."""

    #: "mqtt" (Zeal's broker), "jetstream" or "chirpstack".
    name: str
    connected: bool
    #: Connected and subscribed: it can hand messages over.
    ready: bool
    last_error: str | None
    #: Messages it acknowledged and left alone, by reason (JetStream's ``other_topic``,
    #: ChirpStack's ``no_data`` and ``unbound``).
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorStatus:
    """A collector's figures since its process started, and its state now."""

    client_id: str
    #: Messages by outcome and the other counters (``connects``, ``session_taken_over``...).
    counts: dict[str, int]
    #: Rejected messages by reason (door and store); sums to ``counts["rejected"]``.
    rejected_by: dict[str, int]
    #: Connected to Zeal's broker, and subscribed there (SUBACK of this connection).
    broker_connected: bool
    subscribed: bool
    #: The last database write succeeded.
    database_ok: bool
    #: The database's error while it fails, else the broker connection's last one.
    last_error: str | None
    #: Why the writer stopped (a bug: /livez answers 503), None while it runs.
    writer_error: str | None
    #: When the oldest message the writer holds arrived (ms), None when it holds none.
    oldest_ms: int | None
    #: Messages received and not yet acknowledged; of them, those queued for the writer.
    holding: int
    queued: int
    #: Each source the collector takes messages from, Zeal's broker first.
    sources: tuple[SourceStatus, ...]

    def source(self, name: str) -> SourceStatus | None:
        """The source of that name, None when the collector has none."""
        return next((s for s in self.sources if s.name == name), None)
