"""acknowledge: many PUBACKs with one wake-up of paho's network thread, against Mosquitto."""

from __future__ import annotations

import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from tools.testbed.broker import Mosquitto
from zeal.brokerurl import parse_broker_url
from zeal.mqttclient import acknowledge, connect_persistent, make_client

pytestmark = pytest.mark.integration

MESSAGES = 2000


def session(broker: Mosquitto, received: list[mqtt.MQTTMessage]) -> mqtt.Client:
    """A persistent manual-ack subscriber to test/# (the messages it gets go to
    `received`), connected and running its network thread."""
    settings = parse_broker_url(broker.url)
    client = make_client(settings, "acker", manual_ack=True, persistent=True)
    subscribed = threading.Event()
    client.on_message = lambda _c, _u, message: received.append(message)
    client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe("test/#", qos=1)
    client.on_subscribe = lambda *_: subscribed.set()
    connect_persistent(client, settings, session_expiry=3600, receive_maximum=65535)
    client.loop_start()
    assert subscribed.wait(10)
    return client


def test_acknowledging_a_batch_from_another_thread_reaches_the_broker(
    broker: Mosquitto,
) -> None:
    """2,000 QoS 1 messages acknowledged from the test's thread in one call: the broker
    redelivers none of them to the session afterwards, and the wake-up socket paho 2.1
    keeps (what acknowledge sets aside meanwhile) is there, and back."""
    received: list[mqtt.MQTTMessage] = []
    client = session(broker, received)
    assert isinstance(client._sockpairW, socket.socket)  # paho's private wake-up socket
    publisher = make_client(parse_broker_url(broker.url), "publisher")
    publisher.connect("127.0.0.1", broker.port)
    publisher.loop_start()
    for i in range(MESSAGES):
        publisher.publish(f"test/{i % 7}", f"{i}".encode(), qos=1)
    deadline = time.monotonic() + 30
    while len(received) < MESSAGES and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(received) == MESSAGES
    wake = client._sockpairW
    acknowledge(client, [(m.mid, m.qos) for m in received])
    assert client._sockpairW is wake
    time.sleep(1)  # the network thread sends the PUBACKs
    client.disconnect()
    client.loop_stop()
    publisher.disconnect()
    publisher.loop_stop()
    again: list[mqtt.MQTTMessage] = []
    client = session(broker, again)
    time.sleep(2)
    client.disconnect()
    client.loop_stop()
    assert again == []  # every message was acknowledged: nothing comes back
