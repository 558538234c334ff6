"""The collector against a real Mosquitto broker, on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import csv
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.server.helpers import create_stream, publish_all, server_app, simulate, stats, wait_until
from tests.server.metrics_check import assert_metrics_are_prometheus, metric_samples
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto
from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.broker.identity import TAKEOVER_RETRY

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[3] / "data" / "seattle-temps.csv"


def next_minute() -> int:
    """The next whole minute (ms), read when a test runs, not when this module is imported
    (a run collects every module first): after the streams the test creates (the collector
    rejects readings stamped before their stream existed, less 5 minutes) and within its
    future tolerance (10 minutes)."""
    return (int(time.time() * 1000) // 60_000 + 1) * 60_000


def publisher(port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def stored_columns(client: TestClient) -> tuple[np.ndarray, np.ndarray, list[str]]:
    app: Any = client.app
    with app.state.sessions() as session:
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        names = {d.id: d.name for d in store.devices_of(session, stream)}
        parts = [cols for _, cols in store.segment_columns(session, stream)]
    codes = np.concatenate([p.codes for p in parts])
    stamps = np.concatenate([p.timestamps for p in parts])
    devices = [names[int(d)] for p in parts for d in p.devices]
    return codes, stamps, devices


def test_fleet_of_200_devices_end_to_end(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """200 simulated devices replay Seattle data: the API's average is the exact estimate of
    every stored code and lies within 5 standard errors of the true average; per interval
    likewise."""
    with DATA.open() as handle:
        data = np.array([float(r["temp"]) for r in csv.DictReader(handle)])
    with TestClient(server_app(database_url, broker)) as client:
        params = create_stream(client, bucket_seconds=1)
        result = simulate(broker, tmp_path, "--devices", "200", "--rate", "20", "--readings", "60")
        assert result.returncode == 0, result.stderr
        wait_until(lambda: stats(client)["readings"] == 12_000, what="12,000 readings stored")
        codes, stamps, devices = stored_columns(client)
        average = client.get("/api/v1/streams/temps/average").json()
        assert average["n"] == 12_000
        assert average["estimate"]["mean"] == params.estimate_mean(codes).mean
        # The simulator's replay: device d starts at row d * (L // 200 + 7), 20 readings/s.
        index = np.array([int(name.split("-")[1]) for name in devices])
        step = (stamps - stamps.min()) // 50
        truth = data[(index * (data.size // 200 + 7) + step) % data.size]
        # The simulator draws from the OS's secure RNG (it cannot be seeded): the
        # tolerance is 5 standard errors of the estimate (a miss once in ~3.5 million
        # runs), not the 95 % Bernstein interval (seen missed once).
        error = average["estimate"]["mean"] - truth.mean()
        assert abs(error) <= 5 * average["estimate"]["std_error"], error
        points = client.get("/api/v1/streams/temps/series", params={"interval": 1}).json()["points"]
        assert sum(p["n"] for p in points) == 12_000
        assert len(points) >= 3
        for point in points:
            first = int(np.datetime64(point["start"].replace("Z", ""), "ms").astype(np.int64))
            mask = (stamps >= first) & (stamps < first + 1000)
            assert point["estimate"]["mean"] == params.estimate_mean(codes[mask]).mean
            error = point["estimate"]["mean"] - truth[mask].mean()
            assert abs(error) <= 5 * point["estimate"]["std_error"], (point, error)
        assert stats(client)["devices"] == 200


def test_batches_published_three_times_out_of_order_are_stored_once(
    database_url: str, broker: Mosquitto
) -> None:
    """Each batch sent 3 times, shuffled: stored once; /stats and /average agree."""
    with TestClient(server_app(database_url, broker)) as client:
        params = create_stream(client, bucket_seconds=60)
        wait_until(lambda: state(client).collector.broker_connected, what="collector")
        rng, t0 = np.random.default_rng(3), next_minute()
        batches = [
            encode_batch(
                params,
                stream="temps",
                device="dev1",
                sequence=s,
                codes=params.perturb(rng.uniform(30, 70, 60), rng=rng),
                timestamps=t0 + 60_000 * s + 1000 * np.arange(60),
            )
            for s in range(8)
        ]
        messages = [("zeal/v1/temps/dev1/up", b) for b in batches] * 3
        random.Random(7).shuffle(messages)
        publish_all(broker.port, messages)
        wait_until(lambda: state(client).collector.counts["duplicate"] == 16, what="16 duplicates")  # type: ignore[attr-defined]
        s = stats(client)
        assert (s["messages"], s["readings"]) == (8, 480)
        assert client.get("/api/v1/streams/temps/average").json()["n"] == 480


def test_rejects_are_counted_and_good_data_is_intact(database_url: str, broker: Mosquitto) -> None:
    """Corrupt payload, another device's payload, unknown stream, stale fingerprint: each is
    rejected and counted by reason; good batches before and after are all stored."""
    with TestClient(server_app(database_url, broker)) as client:
        params = create_stream(client)
        stale = Zeal(lower=0, upper=100, epsilon=1, payload_bits=params.payload_bits)
        wait_until(lambda: state(client).collector.broker_connected, what="collector")

        def batch(p: Zeal, device: str, seq: int) -> bytes:
            return encode_batch(
                p,
                stream="temps",
                device=device,
                sequence=seq,
                codes=np.full(10, p.code_min),
                timestamps=next_minute() + np.arange(10),
            )

        publish_all(
            broker.port,
            [
                ("zeal/v1/temps/dev1/up", batch(params, "dev1", 0)),
                ("zeal/v1/temps/dev1/up", batch(params, "dev1", 1)[:-3]),
                ("zeal/v1/temps/dev2/up", batch(params, "dev1", 2)),
                ("zeal/v1/other/dev1/up", batch(params, "dev1", 3)),
                ("zeal/v1/temps/dev1/up", batch(stale, "dev1", 4)),
                ("zeal/v1/temps/dev1/up", batch(params, "dev1", 5)),
            ],
        )
        wait_until(lambda: sum(stats(client)["rejects"].values()) == 3, what="rejects")
        s = stats(client)
        assert s["rejects"] == {"truncated": 1, "fingerprint_mismatch": 2}
        assert (s["messages"], s["readings"], s["devices"]) == (2, 20, 1)
        assert_metrics_are_prometheus(client.get("/metrics"))
        samples = metric_samples(client.get("/metrics").text)
        assert samples[("zeal_store_rejects_total", (("reason", "fingerprint_mismatch"),))] == 2
        assert samples[("zeal_store_rejects_total", (("reason", "unknown_stream"),))] == 1
        rejected = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "zeal_collector_rejected_messages_total"
        }
        assert rejected == {
            (("reason", "truncated"),): 1,
            (("reason", "fingerprint_mismatch"),): 2,
            (("reason", "unknown_stream"),): 1,
        }
        outcome = {
            labels[0][1]: value
            for (name, labels), value in samples.items()
            if name == "zeal_collector_messages_total"
        }
        # Disjoint outcomes: their sum is the messages received, once each (skipped: LoRaWAN
        # uplinks that are not Zeal's, none here).
        assert outcome == {
            "stored": 2,
            "duplicate": 0,
            "rejected": sum(rejected.values()),
            "skipped": 0,
        }
        assert samples[("zeal_collector_commit_lag_seconds_count", ())] == 2
        assert samples[("zeal_collector_commit_lag_seconds_bucket", (("le", "+Inf"),))] == 2
        assert samples[("zeal_stream_readings_total", (("stream", "temps"),))] == 20


def test_two_collectors_share_the_load_and_store_everything_once(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """Two collectors on one shared subscription: both store some, together all, once."""
    with (
        TestClient(server_app(database_url, broker, "c1", "zeal")) as one,
        TestClient(server_app(database_url, broker, "c2", "zeal")) as two,
    ):
        create_stream(one, bucket_seconds=60)
        wait_until(lambda: state(two).collector.broker_connected, what="second collector")
        result = simulate(broker, tmp_path, "--devices", "50", "--rate", "0", "--readings", "120")
        assert result.returncode == 0, result.stderr
        wait_until(lambda: stats(one)["readings"] == 6000, what="6,000 readings")
        counts = [state(c).collector.counts for c in (one, two)]
        assert counts[0]["stored"] > 0
        assert counts[1]["stored"] > 0
        assert counts[0]["stored"] + counts[1]["stored"] == 100
        assert counts[0]["duplicate"] + counts[1]["duplicate"] == 0
        assert stats(two)["messages"] == 100


def test_stream_creation_publishes_the_retained_config(
    database_url: str, broker: Mosquitto
) -> None:
    """Creating a stream retains its configuration document on the broker for agents."""
    got: list[bytes] = []
    with TestClient(server_app(database_url, broker)) as client:
        wait_until(lambda: state(client).collector.broker_connected, what="collector")
        create_stream(client)
        listener = publisher(broker.port)
        listener.on_message = lambda c, u, m: got.append(bytes(m.payload))
        listener.subscribe("zeal/v1/temps/config", qos=1)
        wait_until(lambda: bool(got), timeout=10, what="retained config")
        listener.disconnect()
        listener.loop_stop()
        assert json.loads(got[0]) == client.get("/api/v1/streams/temps/config").json()


def test_a_session_takeover_is_reported_and_the_session_taken_back_after_a_pause(
    database_url: str, broker: Mosquitto
) -> None:
    """Another client keeps connecting with the collector's client id (as a second collector
    with the same ZEAL_COLLECTOR_ID would): after 3 lost connections the collector says why
    in /healthz and takes its session back after TAKEOVER_RETRY seconds, not at once (no
    fight without pause) and not a minute later (the broker drops the devices' data while
    no session subscribes). Mosquitto 2.0.11 just closes the socket; brokers that send
    reason 0x8E are recognised at the first."""
    with TestClient(server_app(database_url, broker, collector_id="taken")) as client:
        collector = state(client).collector
        wait_until(lambda: collector.broker_connected, what="collector")
        intruder = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="taken", protocol=MQTTProtocolVersion.MQTTv5
        )
        intruder.reconnect_delay_set(min_delay=1, max_delay=1)
        intruder.connect("127.0.0.1", broker.port)
        intruder.loop_start()
        try:
            wait_until(lambda: collector.mqtt.takeovers == 1, 30, "the takeover")
            taken_at, connects = time.monotonic(), collector.mqtt.connects
            health = client.get("/healthz").json()
            assert "probably uses its client id 'taken'" in health["collector"]["last_error"]
            wait_until(lambda: collector.mqtt.connects > connects, 60, "the session back")
            assert time.monotonic() - taken_at >= TAKEOVER_RETRY - 2  # not at once (1 s)
            assert connects <= 4
        finally:
            intruder.disconnect()
            intruder.loop_stop()


def test_a_collector_stopping_right_after_a_commit_has_sent_its_acknowledgements(
    tmp_path: Path, broker: Mosquitto
) -> None:
    """20,000 one-reading batches queued for the collector's session while it is away; it
    drains them and is stopped the moment it has stored the last: its acknowledgements
    reach the broker before it disconnects, so the next collector on the session gets none
    of them again (without zeal.mqtt.client.flush first, in half the runs up to 11,805
    came back as duplicates: one transaction's acknowledgements were still on their way
    at the disconnect)."""
    url = f"sqlite:///{tmp_path / 'z.sqlite'}"
    total, start = 20_000, next_minute() - 60_000
    with TestClient(server_app(url, broker)) as client:
        params = create_stream(client)
        assert state(client).collector.subscribed.wait(10)
    sender = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    sender.max_inflight_messages_set(1000)
    sender.connect("127.0.0.1", broker.port)
    sender.loop_start()
    sent = [
        sender.publish(
            f"zeal/v1/temps/d{k % 100}/up",
            encode_batch(
                params,
                stream="temps",
                device=f"d{k % 100}",
                sequence=k // 100,
                timestamps=[start + k],
                codes=[params.code_min],
            ),
            qos=1,
        )
        for k in range(total)
    ]
    for info in sent:
        info.wait_for_publish(60)
    sender.disconnect()
    sender.loop_stop()
    with TestClient(server_app(url, broker)) as client:
        collector = state(client).collector
        with contextlib.suppress(AssertionError):  # said below
            wait_until(lambda: collector.counts["stored"] >= total, 120, "every batch stored")
        assert collector.counts["stored"] == total
    with TestClient(server_app(url, broker)) as client:
        again = state(client).collector
        assert again.subscribed.wait(30)
        # A redelivery comes when the session reconnects, before anything new: a sentinel
        # batch published now is the first message this collector receives, or follows it.
        sentinel = encode_batch(
            params,
            stream="temps",
            device="sentinel",
            sequence=0,
            timestamps=[start],
            codes=[params.code_min],
        )
        publish_all(broker.port, [("zeal/v1/temps/sentinel/up", sentinel)])
        wait_until(lambda: again.counts["stored"] >= 1, 30, "the sentinel stored")
        assert (again.received, again.counts["duplicate"]) == (1, 0)
