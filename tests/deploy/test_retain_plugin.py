"""deploy/mosquitto/plugin/zeal_retain.so in a real mosquitto 2.0 with the deployment's
config (its plugin line enabled): what a device may leave retained."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.server import DeployBroker, wait_until
from zeal.brokerurl import parse_broker_url
from zeal_server.broker.provisioning import BrokerAdmin

pytestmark = pytest.mark.integration
PRESENCE = json.dumps({"format": "zeal-presence/1", "instance": "a1", "online": True}).encode()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[DeployBroker]:
    started = DeployBroker(tmp_path / "broker", retain_plugin=True).start()
    yield started
    started.stop()


def connect(port: int, user: str, password: str, **will: object) -> tuple[mqtt.Client, str]:
    """A client of `user` (MQTT 5), and how its CONNECT was answered."""
    answered: list[str] = []
    done = threading.Event()
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=user, protocol=MQTTProtocolVersion.MQTTv5
    )
    c.username_pw_set(user, password)
    if will:
        c.will_set(**will)  # type: ignore[arg-type]

    def on_connect(cl: object, u: object, f: object, reason: object, p: object) -> None:
        answered.append(str(reason))
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", port)
    c.loop_start()
    assert done.wait(10), f"{user}: no CONNACK"
    return c, answered[0]


def broker_log(broker: DeployBroker) -> str:
    return (broker.directory / "mosquitto.log").read_text()


def retained(port: int, topic: str) -> list[bytes]:
    """What a new subscriber (the dynamic security admin: it may read everything) gets
    retained on `topic`: the messages up to the broker's answer to a marker."""
    got: list[tuple[str, bytes]] = []
    c, _ = connect(port, "zeal-admin", "pw-zeal-admin")
    c.on_message = lambda cl, u, m: got.append((m.topic, bytes(m.payload)))
    c.subscribe([(topic, 1), ("$SYS/broker/version", 1)])
    wait_until(lambda: any(t == "$SYS/broker/version" for t, _ in got), 10, "the marker")
    c.disconnect()
    c.loop_stop()
    return [p for t, p in got if t != "$SYS/broker/version"]


def test_a_device_leaves_retained_only_a_small_presence_of_a_configured_stream(
    broker: DeployBroker,
) -> None:
    """With the collector's configuration of stream temps retained: a provisioned device's
    retained presence on temps is kept; retained on its data topic, on the presence of a
    stream that has no configuration, or a presence of 2 KB, it is not (the message is
    refused: nothing is retained); nor is a retained Last Will under an invented stream,
    set off by a dropped connection; a password-file device is held to the same."""
    admin = BrokerAdmin(parse_broker_url(broker.url), "zeal-admin", "pw-zeal-admin")
    password = admin.provision("mallory")
    collector, _ = connect(broker.port, "zeal-collector", "pw-zeal-collector")
    collector.publish(
        "zeal/v1/temps/config", b'{"stream": "temps"}', qos=1, retain=True
    ).wait_for_publish(5)
    for user, secret in (("mallory", password), ("evil", "pw-evil")):
        device, answer = connect(broker.port, user, secret)
        assert answer == "Success"
        for topic, payload in (
            (f"zeal/v1/temps/{user}/presence", PRESENCE),
            (f"zeal/v1/temps/{user}/up", b"\x20" * 60),
            (f"zeal/v1/invented-1/{user}/presence", PRESENCE),
            (f"zeal/v1/temps/{user}/presence", b"p" * 2048),
        ):
            device.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
        device.disconnect()
        device.loop_stop()
        assert retained(broker.port, f"zeal/v1/temps/{user}/presence") == [PRESENCE]
        assert retained(broker.port, f"zeal/v1/temps/{user}/up") == []
        assert retained(broker.port, f"zeal/v1/invented-1/{user}/presence") == []
        # A retained Last Will under an invented stream, set off by a dropped connection.
        willing, _ = connect(
            broker.port,
            user,
            secret,
            topic=f"zeal/v1/invented-2/{user}/presence",
            payload=PRESENCE,
            qos=1,
            retain=True,
        )
        willing.loop_stop()
        sock = willing.socket()
        assert sock is not None
        sock.close()
        wait_until(
            lambda u=user: (
                f"{u} closed its connection" in broker_log(broker)
                or f"Client {u} disconnected" in broker_log(broker)
            ),
            10,
            "the drop",
        )
        assert retained(broker.port, f"zeal/v1/invented-2/{user}/presence") == []
    log = broker_log(broker)
    assert "zeal_retain: refused a retained message on zeal/v1/temps/mallory/up" in log
    collector.disconnect()
    collector.loop_stop()
