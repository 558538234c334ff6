"""A device's cap across streams is spent only by that device: the deployment's broker config
(its zeal_retain plugin names who published each batch, zeal-login), the real server with its
default device cap of 8 (ZEAL_MQTT_LOGIN_PROPERTY=zeal-login), a device provisioned through
the API, the fleet simulator's password-file login (the deploy ACL lets it write any
device's data topic), and a LoRaWAN device named like the MQTT device (ChirpStack's events on
a broker of their own)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from chirpstack_api.integration import UplinkEvent
from fastapi.testclient import TestClient
from google.protobuf import json_format
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.server.helpers import publish_all, wait_until
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto
from tools.testbed.server import USERS, DeployBroker, client
from zeal import Zeal, encode_batch
from zeal.lorawan import encode_lorawan
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

pytestmark = pytest.mark.integration

APP = "5f0d8a8e-2c4b-4d6e-9a1b-0c2d3e4f5a6b"
PORT = 10
DEV_EUI = "70b3d57ed0050001"
SIMULATOR = "zeal-fleet-simulator"
PARAMS = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=8.0)


@pytest.fixture
def app(database_url: str, broker: Mosquitto, tmp_path: Path) -> Iterator[tuple[TestClient, int]]:
    """The server with its defaults (device cap 8) on the deployment's broker, ChirpStack's
    events from `broker`, readings of yesterday accepted (backfill 3 days); three streams
    under the default policy, the third bound to a LoRaWAN application whose devices are
    named by their ChirpStack device name. Yields the client and the deploy broker's port."""
    deploy = DeployBroker(tmp_path / "deploy", users=(*USERS, SIMULATOR)).start()
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": database_url,
            "ZEAL_MQTT_URL": deploy.url,
            "ZEAL_MQTT_USERNAME": "zeal-collector",
            "ZEAL_MQTT_PASSWORD": "pw-zeal-collector",
            "ZEAL_MQTT_ADMIN_USERNAME": "zeal-admin",
            "ZEAL_MQTT_ADMIN_PASSWORD": "pw-zeal-admin",
            "ZEAL_MQTT_LOGIN_PROPERTY": "zeal-login",
            "ZEAL_CHIRPSTACK_URL": broker.url,
            "ZEAL_COLLECTOR_ID": "c1",
            "ZEAL_BACKFILL_SECONDS": str(3 * 86_400),
        }
    )
    assert settings.device_max_epsilon_per_day == 8.0
    try:
        with TestClient(create_app(settings)) as c:
            collector = state(c).collector
            wait_until(lambda: collector.broker_connected, what="collector")
            for name in ("own", "other", "air"):
                body = {"name": name, "lower": 0, "upper": 100, "epsilon": 1}
                assert c.post("/api/v1/streams", json=body).status_code == 201
            binding = {"stream": "air", "device_names": "device_name"}
            bound = c.put(f"/api/v1/lorawan/bindings/{APP}/{PORT}", json=binding)
            assert bound.status_code == 200, bound.text
            wait_until(lambda: collector.source("chirpstack").ready, 30, "ChirpStack's topics")
            yield c, deploy.port
    finally:
        deploy.stop()


def yesterday(hour: int) -> int:
    return (day_of(int(time.time() * 1000)) - 1) * DAY_MS + hour * HOUR_MS


def stored(c: TestClient, stream: str) -> tuple[int, dict[str, int]]:
    """Readings stored and rejects counted for home-1 in `stream`."""
    for d in c.get(f"/api/v1/streams/{stream}/devices").json()["devices"]:
        if d["name"] == "home-1":
            return d["readings"], dict(d.get("rejects") or {})
    return 0, {}


def settled(c: TestClient, stream: str, count: int) -> bool:
    readings, rejects = stored(c, stream)
    return readings + sum(rejects.values()) == count


def batch(stream: str, hour: int, device: str = "home-1") -> bytes:
    return encode_batch(
        PARAMS,
        stream=stream,
        device=device,
        sequence=hour,
        timestamps=[yesterday(hour)],
        codes=PARAMS.perturb([50.0]),
    )


def publish_as(port: int, username: str, password: str, messages: list[tuple[str, bytes]]) -> None:
    """As `username` over MQTT 3.1.1 (the firmware's; the broker names the login to the
    collector all the same)."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=username,
                    protocol=MQTTProtocolVersion.MQTTv311)  # fmt: skip
    c.username_pw_set(username, password)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for topic, payload in messages:
            c.publish(topic, payload, qos=1).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def uplink(hour: int) -> tuple[str, bytes]:
    """A LoRaWAN frame of device home-1 (DevEUI DEV_EUI): one reading at yesterday's hour."""
    up = UplinkEvent(deduplication_id=f"dedup-{hour}", f_cnt=hour, f_port=PORT, dr=5,
                     dev_addr="01020304")  # fmt: skip
    up.data = encode_lorawan(PARAMS, stream="air", device="home-1", codes=PARAMS.perturb([50.0]))
    up.time.FromMilliseconds(yesterday(hour))
    up.device_info.application_id = APP
    up.device_info.dev_eui = DEV_EUI
    up.device_info.device_name = "home-1"
    topic = f"application/{APP}/device/{DEV_EUI}/event/up"
    return topic, json_format.MessageToJson(up).encode()


def test_neither_a_lorawan_device_nor_another_login_spends_an_mqtt_devices_cap(
    app: tuple[TestClient, int], broker: Mosquitto
) -> None:
    """The fleet simulator's login sends 8 readings of yesterday as home-1 into stream other,
    and a LoRaWAN device whose name is home-1 sends 8 into stream air; then the provisioned
    home-1 sends its 8 hourly readings of yesterday into its own stream: all 8 are stored,
    none refused as device_cap. The other two stored theirs on ledgers of their own.
    Before: 0 of home-1's 8 were stored."""
    c, port = app
    login = c.post("/api/v1/devices/home-1/login")
    assert login.status_code == 201, login.text
    password = login.json()["password"]
    simulated = [("zeal/v1/other/home-1/up", batch("other", h)) for h in range(8)]
    publish_as(port, SIMULATOR, f"pw-{SIMULATOR}", simulated)
    wait_until(lambda: settled(c, "other", 8), 60, "the simulator's batches settled")
    publish_all(broker.port, [uplink(h) for h in range(8)])
    wait_until(lambda: settled(c, "air", 8), 60, "the LoRaWAN frames settled")
    own = [("zeal/v1/own/home-1/up", batch("own", h)) for h in range(8, 16)]
    publish_as(port, "home-1", password, own)
    wait_until(lambda: settled(c, "own", 8), 60, "home-1's own batches settled")
    assert stored(c, "own") == (8, {})
    assert stored(c, "other") == (8, {})
    assert stored(c, "air") == (8, {})


def test_a_client_cannot_name_a_login_of_its_own(app: tuple[TestClient, int]) -> None:
    """A batch whose publisher sets the zeal-login property itself (to spend someone else's
    ledger, or none) is refused by the broker; the collector never sees it. A sentinel
    batch after it is stored."""
    c, port = app
    forged = client(port, "evil")
    try:
        properties = Properties(PacketTypes.PUBLISH)
        properties.UserProperty = [("zeal-login", "home-1")]
        forged.publish(
            "zeal/v1/own/evil/up", batch("own", 1, "evil"), qos=1, properties=properties
        ).wait_for_publish(10)
        forged.publish("zeal/v1/own/evil/up", batch("own", 2, "evil"), qos=1).wait_for_publish(10)
    finally:
        forged.disconnect()
        forged.loop_stop()

    def evil() -> int:
        listed = c.get("/api/v1/streams/own/devices").json()["devices"]
        return sum(d["readings"] for d in listed if d["name"] == "evil")

    wait_until(lambda: evil() == 1, 60, "the sentinel stored")
    assert evil() == 1  # the forged batch never reached the collector
