"""Device logins through Mosquitto's dynamic security plugin: the deployment's broker config
on a real mosquitto, a real `zeal-server serve`, the CLI and the API."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.server import TOKEN, DeployBroker, Server, batches, create, serve, wait_until
from zeal.mqtt.brokerurl import parse_broker_url
from zeal_server.broker.provisioning import BrokerAdmin, role_name

pytestmark = pytest.mark.integration
ADMIN = {"ZEAL_MQTT_ADMIN_USERNAME": "zeal-admin", "ZEAL_MQTT_ADMIN_PASSWORD": "pw-zeal-admin"}


class Device:
    """A device's MQTT connection with the login it was given; remembers how it ended."""

    def __init__(self, port: int, username: str, password: str) -> None:
        self.connected = threading.Event()
        self.refused: str | None = None
        self.disconnected = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=username,
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda c, u, f, r, p: self.disconnected.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_until(lambda: self.connected.is_set() or self.refused, 10, f"{username}'s CONNACK")

    def _on_connect(self, c: mqtt.Client, u: object, f: object, reason: object, p: object) -> None:
        if getattr(reason, "is_failure", False):
            self.refused = str(reason)
            self.client.disconnect()
        else:
            self.connected.set()

    def publish(self, topic: str, payloads: list[bytes]) -> None:
        for payload in payloads:
            info = self.client.publish(topic, payload, qos=1)
            try:
                info.wait_for_publish(5)
            except RuntimeError:  # the broker may close the connection of a denied publish
                return

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def cli(broker: DeployBroker, *args: str) -> subprocess.CompletedProcess[str]:
    """`zeal-server devices ...` where the broker's admin login and the server's database
    (setup's: it prints the server's key with a login) are at hand."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")}
    database = f"sqlite:///{broker.directory.parent / 'zeal.sqlite'}"
    env |= {"ZEAL_MQTT_URL": broker.url, "ZEAL_DATABASE_URL": database, **ADMIN}
    return subprocess.run(
        [sys.executable, "-m", "zeal_server", "devices", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[DeployBroker, Server]]:
    broker = DeployBroker(tmp_path / "broker").start()
    server = serve(
        f"sqlite:///{tmp_path / 'zeal.sqlite'}",
        broker,
        tmp_path,
        ZEAL_MQTT_USERNAME="zeal-collector",
        ZEAL_MQTT_PASSWORD="pw-zeal-collector",
        ZEAL_OPERATOR_TOKEN=TOKEN,
        **ADMIN,
    ).start()
    server.http.headers["Authorization"] = f"Bearer {TOKEN}"
    yield broker, server
    server.stop()
    broker.stop()


def readings_of(server: Server, device: str) -> int:
    listing = server.http.get("/api/v1/streams/temps/devices").json()["devices"]
    return sum(d["readings"] for d in listing if d["name"] == device)


def test_provisioned_devices_publish_only_their_own_data_and_revoked_ones_are_refused(
    setup: tuple[DeployBroker, Server],
) -> None:
    """A device provisioned with the CLI and one provisioned through the API each publish
    their data, which is stored; neither they nor a password-file device can publish on
    another's topic; revoking a connected device disconnects it at once, and its login is
    refused afterwards."""
    broker, server = setup
    params = create(server)
    made = cli(broker, "provision", "kitchen-1")
    assert made.returncode == 0, made.stderr
    password = made.stdout.split("password: ", 1)[1].split()[0]
    key = server.http.get("/api/v1/server").json()["key"]
    assert f"\nserver key: {key}\n" in made.stdout  # handed over with the login
    answer = server.http.post("/api/v1/devices/hall-2/login")
    assert answer.status_code == 201, answer.text
    assert answer.json()["username"] == "hall-2"
    assert answer.json()["server_key"] == key
    assert sorted(server.http.get("/api/v1/devices").json()) == ["hall-2", "kitchen-1"]

    kitchen = Device(broker.port, "kitchen-1", password)
    hall = Device(broker.port, "hall-2", answer.json()["password"])
    intruder = Device(broker.port, "evil", "pw-evil")  # a password-file device
    for device in (kitchen, hall, intruder):
        assert device.connected.is_set()
    kitchen.publish("zeal/v1/temps/kitchen-1/up", batches(params, "temps", "kitchen-1", 3))
    hall.publish("zeal/v1/temps/hall-2/up", batches(params, "temps", "hall-2", 2))
    wait_until(
        lambda: (readings_of(server, "kitchen-1"), readings_of(server, "hall-2")) == (30, 20),
        10,
        "both provisioned devices' data stored",
    )
    # Others on kitchen-1's topic, with payloads that would be stored if they got through.
    forged = batches(params, "temps", "kitchen-1", 2, first=100)
    hall.publish("zeal/v1/temps/kitchen-1/up", forged[:1])
    intruder.publish("zeal/v1/temps/kitchen-1/up", forged[1:])
    kitchen.publish("zeal/v1/temps/hall-2/up", batches(params, "temps", "hall-2", 1, 100))
    # A sentinel: hall-2's own batch, published after the broker answered all of those;
    # once it is stored, whatever got through before it is stored too.
    hall.publish("zeal/v1/temps/hall-2/up", batches(params, "temps", "hall-2", 1, 300))
    wait_until(lambda: readings_of(server, "hall-2") >= 30, 10, "hall-2's sentinel batch")
    assert (readings_of(server, "kitchen-1"), readings_of(server, "hall-2")) == (30, 30)

    revoked = server.http.delete("/api/v1/devices/kitchen-1/login")
    assert revoked.status_code == 200, revoked.text
    assert kitchen.disconnected.wait(5), "the revoked device stayed connected"
    kitchen.close()
    again = Device(broker.port, "kitchen-1", password)
    assert again.refused is not None
    assert not again.connected.is_set()
    again.close()
    gone = cli(broker, "revoke", "hall-2")
    assert gone.returncode == 0, gone.stderr
    assert hall.disconnected.wait(5)
    hall.close()
    intruder.close()
    assert server.http.get("/api/v1/devices").json() == []
    assert readings_of(server, "kitchen-1") == 30  # revoking keeps what was stored


def test_provisioning_errors_are_clear(setup: tuple[DeployBroker, Server]) -> None:
    """Twice the same device: 409; revoking an unknown one: 404; a name that is not a
    device id, or the collector's own login: 422; without a token: 401; the CLI says the
    same in one line with status 2."""
    broker, server = setup
    assert server.http.post("/api/v1/devices/d1/login").status_code == 201
    again = server.http.post("/api/v1/devices/d1/login")
    assert (again.status_code, again.json()["detail"]) == (
        409,
        "device 'd1' is already provisioned",
    )
    assert server.http.delete("/api/v1/devices/nobody/login").status_code == 404
    assert server.http.post("/api/v1/devices/zeal-collector/login").status_code == 422
    assert server.http.post("/api/v1/devices/zeal-collector-2/login").status_code == 422
    assert server.http.post("/api/v1/devices/a+b/login").status_code == 422
    anonymous = server.http.post("/api/v1/devices/d2/login", headers={"Authorization": ""})
    assert anonymous.status_code == 401
    twice = cli(broker, "provision", "d1")
    assert (twice.returncode, twice.stderr) == (
        2,
        "zeal-server: error: device 'd1' is already provisioned\n",
    )
    wrong = subprocess.run(
        [sys.executable, "-m", "zeal_server", "devices", "list"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")},
            "ZEAL_MQTT_URL": broker.url,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2
    assert "ZEAL_MQTT_ADMIN_USERNAME" in wrong.stderr


class Spy:
    """A device login that subscribes to everything it can and records what it receives."""

    FILTERS = (
        "#",
        "$SYS/#",
        "zeal/v1/+/+/up",
        "zeal/v1/+/+/presence",
        "zeal/v1/+/+/notice",
    )

    def __init__(self, port: int, username: str, password: str) -> None:
        self.username = username
        self.received: list[str] = []
        self.granted: list[bool] = []
        self.subscribed = threading.Event()
        self.lock = threading.Lock()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=username, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.username_pw_set(username, password)
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe([(f, 1) for f in self.FILTERS])
        assert self.subscribed.wait(5), f"{username}: no SUBACK"
        self.wide = self.granted
        self.subscribed.clear()
        # Its own presence, which it may read: the barrier below travels there.
        self.client.subscribe(f"zeal/v1/temps/{username}/presence", 1)
        assert self.subscribed.wait(5), f"{username}: no SUBACK"
        assert self.granted == [True], f"{username}: own presence refused"

    def _on_subscribe(self, c: object, u: object, mid: object, codes: list[Any], p: object) -> None:
        self.granted = [not code.is_failure for code in codes]
        self.subscribed.set()

    def _on_message(self, c: object, u: object, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.received.append(message.topic)

    def barrier(self) -> None:
        """Publish to its own presence and wait for it: everything the broker routed
        before has been delivered to this client."""
        marker = f"zeal/v1/temps/{self.username}/presence"
        self.client.publish(marker, b"barrier", qos=1)
        wait_until(lambda: marker in self.topics(), 5, f"{self.username}'s own presence")

    def topics(self) -> list[str]:
        with self.lock:
            return list(self.received)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_a_device_login_receives_nothing_of_another_device_or_of_the_broker(
    setup: tuple[DeployBroker, Server],
) -> None:
    """A device provisioned through the API and one from the password file subscribe to
    `#`, `$SYS/#` and every device's data, presence and notices, while another device
    publishes data and its retained presence, and the collector sends it notices. An
    operator's login sees that traffic (so it flowed); the two devices see only the
    stream configurations and their own presence. The provisioned device's wider filters
    are refused in the SUBACK; the password-file one's are granted by Mosquitto's acl_file
    (it checks reads, not subscriptions) but deliver nothing."""
    broker, server = setup
    params = create(server)
    made = server.http.post("/api/v1/devices/mallory/login")
    assert made.status_code == 201, made.text
    victim_login = server.http.post("/api/v1/devices/kitchen-1/login").json()["password"]
    operator = Spy(broker.port, "zeal-admin", "pw-zeal-admin")
    spies = [
        Spy(broker.port, "mallory", made.json()["password"]),
        Spy(broker.port, "evil", "pw-evil"),
    ]
    assert spies[0].wide == [False, False, False, False, False]
    victim = Device(broker.port, "kitchen-1", victim_login)
    victim.client.publish(
        "zeal/v1/temps/kitchen-1/presence", b'{"online": true}', qos=1, retain=True
    ).wait_for_publish(5)
    victim.publish("zeal/v1/temps/kitchen-1/up", batches(params, "temps", "kitchen-1", 3))
    # A batch for a stream that does not exist: the collector answers with a notice.
    victim.publish("zeal/v1/nosuch/kitchen-1/up", batches(params, "nosuch", "kitchen-1", 1))
    wanted = {
        "zeal/v1/temps/kitchen-1/up",
        "zeal/v1/temps/kitchen-1/presence",
        "zeal/v1/nosuch/kitchen-1/notice",
    }
    wait_until(
        lambda: (
            wanted <= set(operator.topics())
            and any(t.startswith("$SYS/") for t in operator.topics())
        ),
        15,
        "the operator sees the device's data, presence, notice and the broker's $SYS",
    )
    for spy in spies:
        spy.barrier()
        # Subscribing again after the retained presence exists would deliver it if allowed.
        spy.client.subscribe([(f, 1) for f in Spy.FILTERS])
        spy.barrier()
        others = [
            t for t in spy.topics() if f"/{spy.username}/" not in t and not t.endswith("/config")
        ]
        assert others == [], f"{spy.username} received {others[:5]}"
    for client in (*spies, operator):
        client.close()
    victim.close()


def test_harden_closes_logins_provisioned_before_the_denials(
    setup: tuple[DeployBroker, Server],
) -> None:
    """A role as an earlier version made it (its allows only) under the plugin's init
    defaults lets its login subscribe to `#`; `zeal-server devices harden` adds the
    denials, after which the same filters are refused; a second run changes nothing."""
    broker, _server = setup
    admin = BrokerAdmin(parse_broker_url(broker.url), "zeal-admin", "pw-zeal-admin")
    own = [
        ("publishClientSend", "zeal/v1/+/old-1/up"),
        ("publishClientSend", "zeal/v1/+/old-1/presence"),
        ("subscribePattern", "zeal/v1/+/config"),
        ("subscribePattern", "zeal/v1/+/old-1/notice"),
        ("subscribePattern", "zeal/v1/+/old-1/presence"),
    ]
    answers = admin.run(
        [
            {
                "command": "createRole",
                "rolename": role_name("old-1"),
                "acls": [{"acltype": k, "topic": t, "allow": True} for k, t in own],
            },
            {
                "command": "createClient",
                "username": "old-1",
                "password": "pw-old-1",
                "roles": [{"rolename": role_name("old-1")}],
            },
        ]
    )
    assert [a.get("error") for a in answers] == [None, None]
    before = Spy(broker.port, "old-1", "pw-old-1")
    assert before.wide == [True] * 5  # the leak this version closes
    before.close()
    first = cli(broker, "harden")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "default access: deny; roles given the denials: 1",
        "  old-1",
    ]
    after = Spy(broker.port, "old-1", "pw-old-1")
    assert after.wide == [False] * 5
    after.close()
    again = cli(broker, "harden")
    assert again.stdout.strip() == "default access: deny; roles given the denials: 0"


def test_a_collector_whose_subscription_the_broker_refuses_does_not_say_subscribed(
    tmp_path: Path,
) -> None:
    """A server started with a device's login instead of the collector's (an operator's
    slip): the broker lets it connect and read the stream configurations, and refuses its
    subscription to every device's data in the SUBACK (the device's role reads only what
    is its own). /healthz says the broker connection is up and not subscribed, with the
    refusal in its last error, and answers 503: such a collector receives nothing."""
    broker = DeployBroker(tmp_path / "broker").start()
    admin = BrokerAdmin(parse_broker_url(broker.url), "zeal-admin", "pw-zeal-admin")
    password = admin.provision("kitchen-1")
    server = serve(
        f"sqlite:///{tmp_path / 'zeal.sqlite'}",
        broker,
        tmp_path,
        ZEAL_MQTT_USERNAME="kitchen-1",
        ZEAL_MQTT_PASSWORD=password,
        ZEAL_OPERATOR_TOKEN=TOKEN,
    ).start(ready=False)
    server.http.headers["Authorization"] = f"Bearer {TOKEN}"
    try:

        def refused() -> bool:
            error = server.http.get("/healthz").json()["collector"]["last_error"]
            return "refused the collector's subscription" in (error or "")

        wait_until(refused, 30, "the refused subscription reported")
        health = server.http.get("/healthz")
        body = health.json()
        assert health.status_code == 503
        assert (body["broker"], body["collector"]["subscribed"]) == ("not subscribed", False)
        assert "Not authorized" in body["collector"]["last_error"]
        assert server.http.get("/readyz").status_code == 503
    finally:
        server.stop()
        broker.stop()
