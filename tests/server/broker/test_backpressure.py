"""Back-pressure the MQTT way: through a database stall longer than the keepalive, the
broker holds the backlog (MQTT v5 Receive Maximum), the collector's connection stays up,
and nothing is lost. Real Mosquitto, real server, SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.server.helpers import publish_all, stalled
from tests.server.metrics_check import metric_samples
from tools.testbed.broker import Mosquitto
from tools.testbed.server import Server, batches, create, verify, wait_for, wait_until
from zeal.mqtt.topics import data_topic
from zeal_server.settings import ServerSettings, SettingsError

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

INFLIGHT = 100  # ZEAL_COLLECTOR_INFLIGHT: the broker may send this many unacknowledged
KEEPALIVE = 5  # the broker drops a silent client after 1.5 x this
STALL = 14.0  # seconds the database does not answer: longer than 2 x the keepalive
DEVICES, PER_DEVICE = 10, 100  # 1,000 messages: ten times what the collector may hold


def metrics(server: Server) -> dict[str, float]:
    return {
        name: value
        for (name, labels), value in metric_samples(server.http.get("/metrics").text).items()
        if not labels
    }


@pytest.mark.serial  # the stall is timed against the broker's keepalive
def test_a_database_stall_longer_than_the_keepalive_leaves_the_backlog_at_the_broker(
    database_url: str, tmp_path: Path
) -> None:
    # As deploy/mosquitto: no in-flight limit of the broker's own (Mosquitto's default, 20,
    # would hide what the collector does), so only the collector's Receive Maximum holds.
    broker = Mosquitto(tmp_path / "broker")
    broker.config.write_text(broker.config.read_text() + "max_inflight_messages 0\n")
    broker.start()
    server = Server(database_url, broker, tmp_path / "server.log", collector_id="stall-test")
    server.env.update(ZEAL_MQTT_KEEPALIVE=str(KEEPALIVE), ZEAL_COLLECTOR_INFLIGHT=str(INFLIGHT))
    server.start()
    try:
        params = create(server)
        messages = [
            (data_topic("temps", f"d{d}"), payload)
            for d in range(DEVICES)
            for payload in batches(params, "temps", f"d{d}", PER_DEVICE)
        ]
        wait_until(lambda: metrics(server)["zeal_collector_connects_total"] >= 1, 10, "connect")
        began = time.monotonic()
        with stalled(database_url, STALL):
            publish_all(broker.port, messages)  # the broker accepts all of them at once
            wait_until(
                lambda: metrics(server)["zeal_collector_unacknowledged_messages"] >= INFLIGHT,
                10,
                "the collector to hold its quota",
            )
            # Time is what is tested: late in the stall, the collector still holds no more
            # than its quota (the broker keeps the rest).
            time.sleep(max(0.0, began + STALL - 2 - time.monotonic()))
            during = metrics(server)
        after = wait_for(server, {"messages": len(messages), "readings": 10 * len(messages)})
        assert after == {"messages": len(messages), "readings": 10 * len(messages)}, (
            after,
            server.log.read_text()[-3000:],
        )
        final = metrics(server)
        stored = metric_samples(server.http.get("/metrics").text)[
            ("zeal_collector_messages_total", (("outcome", "stored"),))
        ]
    except httpx.TransportError:
        raise AssertionError(server.log.read_text()[-3000:]) from None
    finally:
        server.stop()
        broker.stop()
    # The connection lasted: one connect, never a keepalive timeout at the broker.
    assert during["zeal_collector_broker_connected"] == 1
    assert final["zeal_collector_connects_total"] == 1, server.log.read_text()[-3000:]
    assert "exceeded timeout" not in broker.log_tail(400)
    # The broker sent what Receive Maximum allows, and held the other 900.
    assert during["zeal_collector_unacknowledged_messages"] == INFLIGHT
    assert during["zeal_collector_queue_messages"] <= INFLIGHT
    assert during["zeal_collector_oldest_unacknowledged_seconds"] >= STALL - 4
    # Each message stored once; the stall shows in the lags.
    assert stored == len(messages)
    assert final["zeal_collector_unacknowledged_messages"] == 0
    assert final["zeal_collector_commit_lag_seconds_count"] == len(messages)
    assert final["zeal_collector_commit_lag_seconds_sum"] >= INFLIGHT * (STALL - 4)
    checked = verify(database_url)
    assert "verify: OK" in checked, checked


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"ZEAL_MQTT_PROTOCOL": "4"}, "ZEAL_MQTT_PROTOCOL: the MQTT protocol must be 5 or 3.1.1"),
        ({"ZEAL_MQTT_KEEPALIVE": "2"}, "ZEAL_MQTT_KEEPALIVE must be 5 to 3600 seconds"),
        ({"ZEAL_COLLECTOR_INFLIGHT": "70000"}, "ZEAL_COLLECTOR_INFLIGHT must be 10 to 65535"),
        ({"ZEAL_NATS_URL": "http://n1:4222"}, "ZEAL_NATS_URL: 'http://n1:4222' must look like"),
        ({"ZEAL_NATS_URL": "nats://n1:4222", "ZEAL_NATS_ACK_WAIT": "2"}, "ZEAL_NATS_ACK_WAIT"),
        ({"ZEAL_NATS_URL": "nats://n1:4222", "ZEAL_NATS_CONSUMER": "a.b"}, "ZEAL_NATS_CONSUMER"),
        ({"ZEAL_NATS_URL": "nats://n1:4222", "ZEAL_MQTT_URL": "off"}, "needs ZEAL_MQTT_URL"),
    ],
)
def test_bad_transport_settings_are_refused_with_the_setting_named(
    variables: dict[str, str], says: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(says)):
        ServerSettings.from_env(variables)


def test_the_transport_settings_are_read() -> None:
    got = ServerSettings.from_env(
        {
            "ZEAL_MQTT_PROTOCOL": "v3.1.1",
            "ZEAL_MQTT_KEEPALIVE": "7",
            "ZEAL_COLLECTOR_INFLIGHT": "500",
            "ZEAL_NATS_URL": "nats://n1:4222, nats://n2:4222",
            "ZEAL_NATS_ACK_WAIT": "9",
        }
    )
    assert got.broker is not None
    assert (got.broker.protocol, got.broker.keepalive, got.collector_inflight) == ("3.1.1", 7, 500)
    assert got.nats_servers == ("nats://n1:4222", "nats://n2:4222")
    assert (got.nats_consumer, got.nats_ack_wait) == ("zeal-collectors", 9)


def test_qos_0_data_are_stored_and_never_acknowledged(broker: Mosquitto, tmp_path: Path) -> None:
    """A device publishing at QoS 0: its batches are stored, and the collector sends no
    PUBACK for them (there is nothing to acknowledge): it stays connected."""
    server = Server(
        f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "server.log", collector_id="q0"
    )
    server.start()
    try:
        params = create(server)
        messages = [(data_topic("temps", "d0"), p) for p in batches(params, "temps", "d0", 20)]
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        for topic, payload in messages:
            client.publish(topic, payload, qos=0).wait_for_publish(10)
        client.disconnect()
        client.loop_stop()
        stored = wait_for(server, {"messages": 20, "readings": 200}, timeout=20)
        # Two QoS 1 sentinels after: had the collector answered a QoS 0 message with a
        # PUBACK, the broker would have closed its connection before it took the second.
        for sequence in (20, 21):
            (payload,) = batches(params, "temps", "d0", 1, first=sequence)
            publish_all(broker.port, [(data_topic("temps", "d0"), payload)])
            wait_for(server, {"messages": sequence + 1, "readings": 10 * (sequence + 1)})
        final = metrics(server)
    finally:
        server.stop()
    assert stored == {"messages": 20, "readings": 200}  # at QoS 0
    assert final["zeal_collector_connects_total"] == 1, server.log.read_text()[-2000:]
    assert final["zeal_collector_unacknowledged_messages"] == 0
