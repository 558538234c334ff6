"""acknowledge: many PUBACKs in one write and one wake-up of paho's network thread, against
Mosquitto, under MQTT v5 and 3.1.1."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tools.testbed.broker import Mosquitto
from tools.testbed.wait import wait_until
from zeal.mqtt.brokerurl import parse_broker_url
from zeal.mqtt.client import acknowledge, connect_persistent, flush, make_client

pytestmark = pytest.mark.integration

MESSAGES = 2000


def session(broker: Mosquitto, received: list[mqtt.MQTTMessage], protocol: str) -> mqtt.Client:
    """A persistent manual-ack subscriber to test/# at QoS 2 (the messages it gets go to
    `received`), connected and running its network thread."""
    settings = parse_broker_url(broker.url, protocol=protocol)
    client = make_client(settings, "acker", manual_ack=True, persistent=True)
    subscribed = threading.Event()
    client.on_message = lambda _c, _u, message: received.append(message)
    client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe("test/#", qos=2)
    client.on_subscribe = lambda *_: subscribed.set()
    connect_persistent(client, settings, session_expiry=3600, receive_maximum=65535)
    client.loop_start()
    assert subscribed.wait(10)
    return client


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private Mosquitto that sends any number of unacknowledged messages: a 3.1.1
    session has no Receive Maximum, and the broker's default would stop at 20."""
    server = Mosquitto(tmp_path / "broker")
    server.config.write_text(server.config.read_text() + "max_inflight_messages 0\n")
    yield server.start()
    server.stop()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_acknowledging_a_batch_from_another_thread_reaches_the_broker(
    broker: Mosquitto, protocol: str
) -> None:
    """2,000 messages at QoS 0, 1 and 2 acknowledged from the test's thread in one call
    (the QoS 1 ones as one write of PUBACKs): the broker redelivers none of them to the
    session afterwards, and the wake-up socket paho 2.1 keeps (what acknowledge sets aside
    meanwhile) is there, and back, beside the packet queue it writes the PUBACKs with."""
    received: list[mqtt.MQTTMessage] = []
    client = session(broker, received, protocol)
    assert isinstance(client._sockpairW, socket.socket)  # paho's private wake-up socket
    assert callable(client._packet_queue)  # and its private packet queue
    publisher = make_client(parse_broker_url(broker.url), "publisher")
    publisher.connect("127.0.0.1", broker.port)
    publisher.loop_start()
    for i in range(MESSAGES):
        publisher.publish(f"test/{i % 7}", f"{i}".encode(), qos=(1, 2, 0)[i % 3])
    with contextlib.suppress(AssertionError):  # said below
        wait_until(lambda: len(received) >= MESSAGES, 30, "every message")
    assert len(received) == MESSAGES
    assert sorted(m.qos for m in received) == sorted((1, 2, 0)[i % 3] for i in range(MESSAGES))
    wake = client._sockpairW
    acknowledge(client, [(m.mid, m.qos) for m in received])
    assert client._sockpairW is wake
    # The broker answers an unsubscription only after the packets before it: once it has,
    # it has read the PUBACKs (zeal.mqtt.client.flush, as the collector does before leaving).
    assert flush(client, "test-unused/#", timeout=30)
    client.disconnect()
    client.loop_stop()
    again: list[mqtt.MQTTMessage] = []
    client = session(broker, again, protocol)
    # The broker resends what a session did not acknowledge when it connects, before any
    # new message: a sentinel published now comes after all that would come back.
    publisher.publish("test/sentinel", b"sentinel", qos=1).wait_for_publish(10)
    wait_until(lambda: any(m.topic == "test/sentinel" for m in again), 30, "the sentinel")
    publisher.disconnect()
    publisher.loop_stop()
    client.disconnect()
    client.loop_stop()
    assert [m.topic for m in again] == ["test/sentinel"]  # every message was acknowledged
