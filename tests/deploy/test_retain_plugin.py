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
from zeal.mqtt.brokerurl import parse_broker_url
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
    assert "zeal_retain: refused a retained message on a data topic of 60 bytes on " in log
    collector.disconnect()
    collector.loop_stop()


#: Stream levels the ACL's `+` lets a device write under, which are no Zeal name.
BAD_STREAMS = ("", "x" * 65, "x" * 1000, "a b", "caf\u00e9", "_lead", "-lead", "..", "a:b")


def test_a_retained_message_the_plugin_cannot_place_is_refused_whatever_its_shape(
    broker: DeployBroker,
) -> None:
    """A device login's retained presence (100 KB, or a valid small one) and data under
    each stream level that is no Zeal name (empty, 65 or 1,000 characters, other
    characters) is refused, published or as a Last Will; so is a 65 KB retained Last Will
    under a 65-character stream, and the collector login's configuration under such a name
    or over 4 KB. Before this test the plugin answered "defer" to all of them and the
    ACL's `+` let them through (2,000 such presences: +199 MB)."""
    admin = BrokerAdmin(parse_broker_url(broker.url), "zeal-admin", "pw-zeal-admin")
    password = admin.provision("mallory")
    collector, _ = connect(broker.port, "zeal-collector", "pw-zeal-collector")
    collector.publish("zeal/v1/temps/config", b'{"stream": "temps"}', qos=1, retain=True)
    for name in (BAD_STREAMS[1], "temps"):  # a bad name; an oversized configuration
        body = b"{}" if name != "temps" else b" " * 4097
        collector.publish(f"zeal/v1/{name}/config", body, qos=1, retain=True).wait_for_publish(5)
    assert retained(broker.port, f"zeal/v1/{BAD_STREAMS[1]}/config") == []
    assert retained(broker.port, "zeal/v1/temps/config") == [b'{"stream": "temps"}']
    for user, secret in (("mallory", password), ("evil", "pw-evil")):
        device, _ = connect(broker.port, user, secret)
        topics = []
        for stream in BAD_STREAMS:
            for kind, body in (("presence", b"p" * 100_000), ("presence", PRESENCE),
                               ("up", b"\x20" * 60)):  # fmt: skip
                topic = f"zeal/v1/{stream}/{user}/{kind}"
                topics.append(topic)
                device.publish(topic, body, qos=1, retain=True).wait_for_publish(5)
        device.disconnect()
        device.loop_stop()
        for topic in topics:
            assert retained(broker.port, topic) == [], topic
        for stream, body in ((BAD_STREAMS[1], b"w" * 65_000), ("", PRESENCE)):
            topic = f"zeal/v1/{stream}/{user}/presence"
            refusals = broker_log(broker).count("zeal_retain: refused")
            willing, answer = connect(broker.port, user, secret, topic=topic, payload=body,
                                      qos=1, retain=True)  # fmt: skip
            willing.loop_stop()
            sock = willing.socket()
            assert sock is not None
            sock.close()
            wait_until(
                lambda n=refusals, t=topic, a=answer: (
                    retained(broker.port, t) == []
                    and (broker_log(broker).count("zeal_retain: refused") > n or a != "Success")
                ),
                10,
                "the will's refusal",
            )
    assert "a topic no Zeal client retains" in broker_log(broker)
    collector.disconnect()
    collector.loop_stop()
