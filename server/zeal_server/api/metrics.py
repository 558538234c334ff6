"""``/metrics`` in the Prometheus text format, written by ``prometheus_client``.

Two kinds of figures, said in every HELP text:

* **this process** (``zeal_collector_*``): what this server's collector did since it
  started; they restart at zero with the process, as Prometheus counters may. With several
  collectors, ``sum()`` over the scraped instances gives the fleet's figure.
* **from the database** (``zeal_store_*``, ``zeal_stream_*``): shared by every collector
  and API replica on one database, read at scrape time; scrape one instance, or use
  ``max()`` across instances, never ``sum()``.

No family's ``sum()`` double counts: ``zeal_collector_messages_total`` has one sample per
disjoint outcome (stored, duplicate, rejected), and why messages were rejected is a family
of its own (``zeal_collector_rejected_messages_total{reason}``, summing to the rejected
outcome). The commit lag (receive to commit of a stored message) is a histogram.

``zeal_stream_average_last_hour`` and its bands are the served average AVG* of each
stream over the buckets of the last hour, with the normal and the guaranteed interval at
95 %: what the dashboard shows, over time in Prometheus (post-processing of privatized
codes, like every answer of the API).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector as PrometheusCollector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from zeal_server import store
from zeal_server.api.costs import REFUSED
from zeal_server.api.guard import CLOSED
from zeal_server.api.running import Running

__all__ = [
    "OUTCOMES",
    "build_registry",
    "exposition",
]

log = logging.getLogger(__name__)

#: The disjoint outcomes of a message the collector received.
OUTCOMES = ("stored", "duplicate", "rejected", "skipped")
#: Confidence of the average's bands.
CONFIDENCE = 0.95


class _ProcessFigures(PrometheusCollector):
    def __init__(self, collector: Running | None) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        coll = self.collector
        now = coll.status() if coll is not None else None
        counts = now.counts if now else {}
        messages = CounterMetricFamily(
            "zeal_collector_messages",
            "Messages the collector received, by outcome (this process; each message counts "
            "once; skipped: LoRaWAN uplinks that are not Zeal's, see "
            "zeal_collector_lorawan_uplinks_skipped).",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            messages.add_metric([outcome], counts.get(outcome, 0))
        yield messages
        rejected = CounterMetricFamily(
            "zeal_collector_rejected_messages",
            "Rejected messages by reason (this process; sums to "
            'zeal_collector_messages_total{outcome="rejected"}).',
            labels=["reason"],
        )
        for reason, count in sorted((now.rejected_by if now else {}).items()):
            rejected.add_metric([reason], count)
        yield rejected
        for name, key, text in (
            ("zeal_collector_readings", "readings", "Readings stored (this process)."),
            (
                "zeal_collector_sequence_resets",
                "sequence_reset",
                "Batches stored whose sequence number the server had seen with other "
                "content: the device's outbox is new (this process).",
            ),
            ("zeal_collector_connects", "connects", "Connections to the broker (this process)."),
            (
                "zeal_collector_queue_full",
                "queue_full",
                "Messages that found the queue full, so paho's network thread waited: the "
                "broker sent more than Receive Maximum (this process).",
            ),
            (
                "zeal_collector_session_takeovers",
                "session_taken_over",
                "Times another client took the collector's session over (this process).",
            ),
        ):
            yield CounterMetricFamily(name, text, value=counts.get(key, 0))
        yield GaugeMetricFamily(
            "zeal_collector_queue_messages",
            "Messages received and waiting to be stored (this process).",
            value=now.queued if now else 0,
        )
        yield GaugeMetricFamily(
            "zeal_collector_unacknowledged_messages",
            "Data messages received and not yet acknowledged to the broker (this process; "
            "at most ZEAL_COLLECTOR_INFLIGHT while the broker honours Receive Maximum).",
            value=now.holding if now else 0,
        )
        oldest = now.oldest_ms if now else None
        yield GaugeMetricFamily(
            "zeal_collector_oldest_unacknowledged_seconds",
            "Age of the oldest message the writer is storing (0 when idle): grows through a "
            "database stall, while the commit lag is only observed after the commit.",
            value=max(0.0, time.time() - oldest / 1000) if oldest is not None else 0.0,
        )
        yield GaugeMetricFamily(
            "zeal_collector_broker_connected",
            "1 while the collector is connected to the broker (this process).",
            value=int(bool(now and now.broker_connected)),
        )
        source = now.source("jetstream") if now else None
        yield GaugeMetricFamily(
            "zeal_collector_jetstream_connected",
            "1 while the collector pulls from NATS JetStream; 0 while it cannot (and when "
            "the data come over MQTT instead: ZEAL_NATS_URL unset) (this process).",
            value=int(bool(source is not None and source.connected)),
        )
        yield CounterMetricFamily(
            "zeal_collector_jetstream_skipped",
            "Messages of NATS's $MQTT_msgs on other topics than the data topics (notices, "
            "presence), acknowledged and left alone (this process).",
            value=source.skipped.get("other_topic", 0) if source is not None else 0,
        )
        chirpstack = now.source("chirpstack") if now else None
        yield GaugeMetricFamily(
            "zeal_collector_chirpstack_connected",
            "1 while the collector is connected to ChirpStack's broker for LoRaWAN uplinks; "
            "0 while it cannot (and without ZEAL_CHIRPSTACK_URL) (this process).",
            value=int(bool(chirpstack is not None and chirpstack.connected)),
        )
        skipped = CounterMetricFamily(
            "zeal_collector_lorawan_uplinks_skipped",
            "ChirpStack uplink events acknowledged and not stored, not rejects either: "
            "no_data (FPort 0, an empty frame), unbound (no binding names the application "
            "and port) (this process).",
            labels=["reason"],
        )
        counted = chirpstack.skipped if chirpstack is not None else {}
        for reason in ("no_data", "unbound"):
            skipped.add_metric([reason], counted.get(reason, 0))
        yield skipped
        yield GaugeMetricFamily(
            "zeal_collector_database_ok",
            "1 while the collector's last database write succeeded (this process).",
            value=int(bool(now is None or now.database_ok)),
        )
        closed = CounterMetricFamily(
            "zeal_http_connections_closed",
            "HTTP connections closed by a limit (zeal_server.api.guard): per_peer, total, "
            "slow_request (this process; zeal-server serve only).",
            labels=["reason"],
        )
        for reason in ("per_peer", "total", "slow_request"):
            closed.add_metric([reason], CLOSED[reason])
        yield closed
        refused = CounterMetricFamily(
            "zeal_http_heavy_reads_refused",
            "Heavy reads answered 429 because their slots were taken, by kind "
            "(zeal_server.api.costs; this process).",
            labels=["kind"],
        )
        for kind, count in sorted(REFUSED.items()):
            refused.add_metric([kind], count)
        yield refused
        if coll is not None:
            yield from coll.lag_metrics()


class _DatabaseFigures(PrometheusCollector):
    def __init__(self, sessions: Callable[[], Session]) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "zeal_store_up", "1 when the database answered this scrape (from the database)."
        )
        try:
            families = list(self._read())
        except SQLAlchemyError as exc:
            log.warning("metrics: cannot read the database: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self) -> Iterator[Metric]:
        rejects = CounterMetricFamily(
            "zeal_store_rejects",
            "Rejected messages by reason since the database was made, from every "
            "collector (from the database).",
            labels=["reason"],
        )
        readings = CounterMetricFamily(
            "zeal_stream_readings",
            "Readings stored per stream, from every collector (from the database).",
            labels=["stream"],
        )
        devices = GaugeMetricFamily(
            "zeal_stream_devices",
            "Devices known per stream (from the database).",
            labels=["stream"],
        )
        seen = GaugeMetricFamily(
            "zeal_device_last_seen_timestamp_seconds",
            "When each device's last message arrived, Unix seconds (from the database; "
            "one series per device and stream: the alert ZealDeviceSilent).",
            labels=["stream", "device"],
        )
        average = GaugeMetricFamily(
            "zeal_stream_average_last_hour",
            "The debiased average AVG* of the stream's buckets of the last hour (from the "
            "database; absent without readings).",
            labels=["stream"],
        )
        count = GaugeMetricFamily(
            "zeal_stream_average_last_hour_readings",
            "Readings in that average (from the database).",
            labels=["stream"],
        )
        bands = GaugeMetricFamily(
            "zeal_stream_average_last_hour_bound",
            f"Ends of that average's {CONFIDENCE:.0%} intervals, cut to the stream's range: "
            "band normal (normal approximation) or guaranteed (Bernstein, valid at any n) "
            "(from the database).",
            labels=["stream", "band", "side"],
        )
        missing = CounterMetricFamily(
            "zeal_stream_missing_batches",
            "Batches whose sequence numbers never arrived, counted once the import window "
            "can no longer bring them, per stream (from the database; LoRaWAN: frame "
            "counters, docs/lorawan.md).",
            labels=["stream"],
        )
        late = CounterMetricFamily(
            "zeal_stream_late_batches",
            "Batches stored after a higher sequence of their device (out of order), per "
            "stream (from the database).",
            labels=["stream"],
        )
        with self.sessions() as db:
            for reason, total in sorted(store.rejects(db).items()):
                rejects.add_metric([reason], total)
            for glance in store.streams_at_a_glance(db):
                readings.add_metric([glance.name], glance.readings)
                devices.add_metric([glance.name], glance.devices)
                missing.add_metric([glance.name], glance.missing)
                late.add_metric([glance.name], glance.late)
            for stream_name, device, last_ms in store.last_seen_per_device(db):
                seen.add_metric([stream_name, device], last_ms / 1000)
            for stream in store.list_streams(db):
                first, stop = store.bucket_bounds(stream, store.now_ms() - 3_600_000, None)
                params = store.params_of(stream)
                n, estimate = store.window_estimate(
                    db, stream, params, (first, stop), device_ids=None, confidence=CONFIDENCE
                )
                count.add_metric([stream.name], n)
                if estimate is None:
                    continue
                average.add_metric([stream.name], estimate.mean)
                for band, (low, high) in (
                    ("normal", estimate.ci),
                    ("guaranteed", estimate.guaranteed),
                ):
                    bands.add_metric([stream.name, band, "lower"], low)
                    bands.add_metric([stream.name, band, "upper"], high)
        yield from (rejects, readings, devices, missing, late, seen, average, count, bands)


def build_registry(collector: Running | None, sessions: Callable[[], Session]) -> CollectorRegistry:
    """A registry of one application (not the global one: tests build many apps)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessFigures(collector))
    registry.register(_DatabaseFigures(sessions))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format of every figure, read now."""
    return generate_latest(registry)
