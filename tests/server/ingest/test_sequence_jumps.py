"""A device's sequence within sane bounds, end to end: a real Mosquitto, the real server on
SQLite and PostgreSQL, a device publishing its batches and listening to its notices. A batch
far beyond the device's numbering (2**63 - 1, 2**64 - 1: zeal.protocol.MAX_SEQUENCE_JUMP) is
a jump, stored and counted as a reset, never a gap: ``missing`` stays the honest gap, later
honest batches are new, and no notice tells the device to continue from a sequence it
cannot store (zeal_server.store.sequences)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.server.helpers import NO_DEVICE_CAP, notices_into, publish_all, wait_until
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto
from zeal import Zeal, encode_batch
from zeal.protocol import MAX_SEQUENCE
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

pytestmark = pytest.mark.integration

PARAMS = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6)
HONEST = [s for s in range(300) if s != 7]  # one batch lost on the way: the honest gap


@pytest.fixture
def client(database_url: str, broker: Mosquitto) -> Iterator[TestClient]:
    settings = ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": broker.url, **NO_DEVICE_CAP}
    )
    with TestClient(create_app(settings)) as c:
        collector = state(c).collector
        wait_until(lambda: collector.broker_connected, what="collector")
        body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1,
                "max_epsilon_per_day": 1e6}  # fmt: skip
        assert c.post("/api/v1/streams", json=body).status_code == 201
        yield c


def batch(device: str, sequence: int, k: int) -> tuple[str, bytes]:
    """Batch `sequence` of `device`: one reading, stamped by its place `k` (distinct)."""
    now = int(time.time() * 1000) - 60_000  # after the stream was created (backfill)
    payload = encode_batch(PARAMS, stream="temps", device=device, sequence=sequence,
                           timestamps=[now + k], codes=PARAMS.perturb([50.0]))  # fmt: skip
    return f"zeal/v1/temps/{device}/up", payload


def row(c: TestClient, device: str) -> dict[str, Any]:
    listed = c.get("/api/v1/streams/temps/devices").json()["devices"]
    return next((d for d in listed if d["name"] == device), {"batches": 0, "duplicates": 0})


class Notices:
    """What one device hears on its notice topic."""

    def __init__(self, broker: Mosquitto, device: str) -> None:
        self.got: list[dict[str, Any]] = []
        subscribed = threading.Event()
        self.mqtt = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{device}-ear",
                                protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
        self.mqtt.on_message = notices_into(self.got)
        self.mqtt.on_subscribe = lambda *_: subscribed.set()
        self.mqtt.connect("127.0.0.1", broker.port)
        self.mqtt.loop_start()
        self.mqtt.subscribe(f"zeal/v1/temps/{device}/notice", qos=1)
        assert subscribed.wait(10)

    def close(self) -> None:
        self.mqtt.disconnect()
        self.mqtt.loop_stop()


def test_one_batch_at_2_63_minus_1_leaves_missing_at_the_honest_gap(
    client: TestClient, broker: Mosquitto
) -> None:
    """Device d1 sends 0..19, then one batch at 2**63 - 1 and one at 2**64 - 1, then 20..299
    (7 never arrives), then the 2**63 - 1 batch again. Every honest reading is stored once,
    the two jumps are stored and counted as resets, the redelivery is a duplicate, no
    honest batch is a reset, and ``missing`` is 1, the honest gap. The jumps' notices say
    the device's highest sequence is 19. Before: missing was 9,223,372,036,854,775,807,
    every later honest batch was a reset, and the notices said to continue from 2**64 - 1."""
    ear = Notices(broker, "d1")
    jumps = [batch("d1", 2**63 - 1, 1000), batch("d1", 2**64 - 1, 1001)]
    order = [batch("d1", s, s) for s in HONEST if s < 20] + jumps
    order += [batch("d1", s, s) for s in HONEST if s >= 20] + jumps[:1]
    try:
        publish_all(broker.port, order)
        wait_until(
            lambda: row(client, "d1")["batches"] + row(client, "d1")["duplicates"] == len(order),
            120,
            "every batch settled",
        )
        d1 = row(client, "d1")
        assert d1["readings"] == len(HONEST) + 2
        assert (d1["duplicates"], d1["sequence_resets"], d1["missing"]) == (1, 2, 1)
        wait_until(lambda: len(ear.got) >= 1, 30, "the jump's notice")
    finally:
        ear.close()
    for notice in ear.got:
        assert notice["reason"] == "sequence_jump", notice
        assert notice["last_sequence"] == 19
        assert notice["sequence"] in (2**63 - 1, 2**64 - 1)


def test_a_jump_as_the_first_batch_does_not_make_the_honest_ones_resets(
    client: TestClient, broker: Mosquitto
) -> None:
    """Device d2's first batch is at 2**63 - 1 (someone holding its login), then its agent
    sends 0..9: ten new batches, one reset (the jump), nothing missing; a notice about the
    jump names no sequence to continue from (the device has stored none yet)."""
    ear = Notices(broker, "d2")
    order = [batch("d2", MAX_SEQUENCE, 500)] + [batch("d2", s, s) for s in range(10)]
    try:
        publish_all(broker.port, order)
        wait_until(lambda: row(client, "d2")["batches"] == 11, 60, "every batch stored")
        d2 = row(client, "d2")
        assert (d2["readings"], d2["sequence_resets"], d2["missing"]) == (11, 1, 0)
        wait_until(lambda: len(ear.got) >= 1, 30, "the jump's notice")
    finally:
        ear.close()
    assert [(n["reason"], n["last_sequence"]) for n in ear.got] == [("sequence_jump", None)]
