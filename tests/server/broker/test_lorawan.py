"""LoRaWAN devices through ChirpStack, end to end, on SQLite and PostgreSQL: uplink events
built with chirpstack-api's UplinkEvent and marshaled as ChirpStack does (protobuf's JSON
mapping, or protobuf), their payloads encoded by the firmware library (zeal-host) and by
Python, published on ChirpStack's topics to a real Mosquitto, which the collector
subscribes to (ZEAL_CHIRPSTACK_URL); bound to a stream through the API."""

from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chirpstack_api.integration import UplinkEvent
from fastapi.testclient import TestClient
from google.protobuf import json_format

from tests.server.broker.uplink_limits import json_limits, limit_events, mutated
from tests.server.helpers import NO_DEVICE_CAP, publish_all, stats, wait_until
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, free_port
from zeal import Zeal, encode_batch
from zeal._core.firmware import profile_bytes
from zeal.lorawan import encode_lorawan
from zeal.mqtt.streamconfig import params_from_config
from zeal.policy import DAY_MS, HOUR_MS
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

ROOT = Path(__file__).resolve().parents[3]
FIRMWARE = ROOT / "edge" / "firmware"
APP = "5f0d8a8e-2c4b-4d6e-9a1b-0c2d3e4f5a6b"
OTHER_APP = "0b6f6f3c-8a7e-4c55-b1a2-2f1d0e9c8b7a"
PORT = 10
DEVICES = 100
SPACING = 10  # seconds between a frame's readings
PER_FRAME = 10


@pytest.fixture(scope="module")
def zeal_host() -> Path:
    """The firmware library's host tool (`make -C edge/firmware`)."""
    subprocess.run(["make", "-C", str(FIRMWARE)], check=True, capture_output=True)
    return FIRMWARE / "build" / "zeal-host"


def lorawan_app(database_url: str, broker: Mosquitto) -> Any:
    return create_app(
        ServerSettings.from_env(
            {
                "ZEAL_DATABASE_URL": database_url,
                "ZEAL_MQTT_URL": broker.url,
                "ZEAL_COLLECTOR_ID": "c1",
                "ZEAL_CHIRPSTACK_URL": broker.url,
                **NO_DEVICE_CAP,  # its streams' policies are raised
            }
        )
    )


def start(client: TestClient, **stream: Any) -> Zeal:
    """A stream `temps` bound to APP's FPort 10 (devices by DevEUI), once the collector
    listens on ChirpStack's topics: its parameters, as its configuration says."""
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "payload_bits": 6,
            "max_epsilon_per_day": 1e6}  # fmt: skip
    assert client.post("/api/v1/streams", json={**body, **stream}).status_code == 201
    bound = client.put(f"/api/v1/lorawan/bindings/{APP}/{PORT}", json={"stream": "temps"})
    assert bound.status_code == 200, bound.text
    collector = state(client).collector
    wait_until(lambda: collector.source("chirpstack").ready, 30, "the ChirpStack subscription")
    assert client.get("/readyz").json()["chirpstack"] == "ok"
    return params_from_config(client.get("/api/v1/streams/temps/config").json())


def dev_eui(k: int) -> str:
    return f"70b3d57ed005{k:04x}"


def event(
    data: bytes,
    *,
    device: str,
    f_cnt: int,
    time_ms: int,
    dev_addr: str,
    dedup: str,
    app: str = APP,
    port: int = PORT,
) -> UplinkEvent:
    up = UplinkEvent(deduplication_id=dedup, f_cnt=f_cnt, f_port=port, data=data, dr=5,
                     dev_addr=dev_addr)  # fmt: skip
    up.time.FromMilliseconds(time_ms)
    up.device_info.application_id = app
    up.device_info.dev_eui = device
    up.device_info.device_name = f"sensor-{device[-4:]}"
    return up


def marshal(up: UplinkEvent, kind: str) -> bytes:
    """As ChirpStack's MQTT integration does: JSON (its default) or protobuf."""
    if kind == "json":
        return json_format.MessageToJson(up).encode()
    return bytes(up.SerializeToString())


def topic(up: UplinkEvent) -> str:
    info = up.device_info
    return f"application/{info.application_id}/device/{info.dev_eui}/event/up"


def c_payloads(zeal_host: Path, params: Zeal, device: str, frames: list[np.ndarray]) -> list[bytes]:
    """Frames encoded by zeal_encode_lorawan, through the host tool."""
    profile = profile_bytes(params, stream="temps", device=device, unit=0.1)
    lines = "".join(f"{SPACING} {len(c)} {' '.join(map(str, c.tolist()))}\n" for c in frames)
    out = subprocess.run(
        [str(zeal_host), "lorawan", profile.hex()],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [bytes.fromhex(line) for line in out.split()]


def frame_codes(params: Zeal, rng: np.random.Generator, mean: float) -> np.ndarray:
    """One frame's codes: a device of its own level, skewed, with many zero readings."""
    values = np.where(rng.random(PER_FRAME) < 0.3, 0.0, rng.gamma(2.0, mean / 2.0, PER_FRAME))
    return params.perturb(np.clip(values, 0, 110), rng=rng)


def frame(params: Zeal, device: str, codes: np.ndarray) -> bytes:
    return encode_lorawan(
        params, stream="temps", device=device, codes=codes, spacing_seconds=SPACING
    )


class Air:
    """What ChirpStack publishes: the events, marshaled, in order (`again`: published after
    the rest), with the codes that must be stored."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.again: list[tuple[str, bytes]] = []
        self.stored: list[np.ndarray] = []
        self._ids = 0

    def dedup(self) -> str:
        self._ids += 1
        return str(uuid.UUID(int=self._ids))

    def send(self, up: UplinkEvent, kind: str, keep: np.ndarray | None = None) -> bytes:
        body = marshal(up, kind)
        self.messages.append((topic(up), body))
        if keep is not None:
            self.stored.append(keep)
        return body


def test_100_lorawan_devices_through_chirpstack_end_to_end(
    database_url: str, broker: Mosquitto, zeal_host: Path
) -> None:
    """100 devices, 3 frames each (half encoded by the C library, half by Python; JSON and
    protobuf events): the average is the library's estimate on the same codes exactly.
    An event delivered twice and a frame retransmitted (same counter, new time and
    deduplication id) are stored once; a rejoin (new DevAddr, counter from 0) loses
    nothing; a payload made with stale parameters is refused and counted, on /stats and
    on the device's /devices entry; uplinks of an unbound application or port are
    skipped; an event that is not one is refused as bad_event."""
    rng = np.random.default_rng(38)
    air = Air()
    with TestClient(lorawan_app(database_url, broker)) as client:
        params = start(client)
        stale = Zeal(lower=0, upper=100, epsilon=1, payload_bits=6)
        now = store.now_ms()
        for k in range(DEVICES):
            device, mean = dev_eui(k), float(rng.uniform(5, 90))
            kind = "json" if k % 2 == 0 else "protobuf"
            codes = [frame_codes(params, rng, mean) for _ in range(3)]
            payloads = [frame(params, device, c) for c in codes]
            if k < DEVICES // 2:  # the firmware library's frames, byte for byte Python's
                from_c = c_payloads(zeal_host, params, device, codes)
                assert from_c == payloads
                payloads = from_c
            session = f"{0x26000000 + k:08x}"
            for f_cnt, (c, data) in enumerate(zip(codes, payloads, strict=True)):
                when = now + f_cnt * 60_000
                up = event(data, device=device, f_cnt=f_cnt, time_ms=when, dev_addr=session,
                           dedup=air.dedup())  # fmt: skip
                body = air.send(up, kind, keep=c)
                if k < 10 and f_cnt == 1:  # delivered twice: the same event
                    air.again.append((topic(up), body))
                if 10 <= k < 20 and f_cnt == 2:  # retransmitted: heard again 5 s later
                    up.time.FromMilliseconds(when + 5000)
                    up.deduplication_id = air.dedup()
                    air.again.append((topic(up), marshal(up, "protobuf")))
            if 20 <= k < 30:  # rejoined: a new session address, the counter from 0
                for f_cnt in range(2):
                    c = frame_codes(params, rng, mean)
                    up = event(frame(params, device, c), device=device, f_cnt=f_cnt,
                               time_ms=now + (4 + f_cnt) * 60_000,
                               dev_addr=f"{0x27000000 + k:08x}", dedup=air.dedup())  # fmt: skip
                    air.send(up, kind, keep=c)
            if 30 <= k < 35:  # still on the stream's old parameters
                c = stale.perturb(np.full(PER_FRAME, 40.0), rng=rng)
                up = event(frame(stale, device, c), device=device, f_cnt=3,
                           time_ms=now + 180_000, dev_addr=session, dedup=air.dedup())  # fmt: skip
                air.send(up, kind)
        data = frame(params, dev_eui(0), air.stored[0])
        for app, port in ((OTHER_APP, PORT), (APP, PORT + 1)):  # not bound: skipped
            up = event(data, device=dev_eui(0), f_cnt=9, time_ms=now, dev_addr="26000000",
                       dedup=air.dedup(), app=app, port=port)  # fmt: skip
            air.send(up, "json")
        air.messages.append((f"application/{APP}/device/{dev_eui(1)}/event/up", b"\x0a\xff"))
        publish_all(broker.port, air.messages + air.again)

        collector = state(client).collector
        total = len(air.messages) + len(air.again)
        handled = ("stored", "duplicate", "rejected", "skipped")
        wait_until(
            lambda: sum(collector.counts[o] for o in handled) == total, 60, "every event handled"
        )
        expected = {"stored": 320, "duplicate": 20, "rejected": 6, "skipped": 2}
        assert {o: collector.counts[o] for o in handled} == expected
        assert collector.counts["sequence_reset"] == 10 * 2
        assert collector.source("chirpstack").skipped() == {"unbound": 2}
        readings = sum(len(c) for c in air.stored)
        assert readings == 320 * PER_FRAME
        figures = stats(client)
        assert (figures["readings"], figures["devices"]) == (readings, DEVICES)
        assert figures["rejects"] == {"fingerprint_mismatch": 5}  # bad_event: of no stream
        assert dict(collector.rejected_by) == {"fingerprint_mismatch": 5, "bad_event": 1}
        assert (figures["duplicates"], figures["sequence_resets"]) == (20, 20)
        # The frames' own bytes on the air are counted, not the batches they became.
        assert figures["bytes_received"] == sum(len(frame(params, "x", c)) for c in air.stored)
        average = client.get("/api/v1/streams/temps/average").json()
        assert average["n"] == readings
        exact = params.estimate_mean(np.concatenate(air.stored)).mean
        assert average["estimate"]["mean"] == exact
        listed = client.get("/api/v1/streams/temps/devices", params={"limit": 1000}).json()
        by_name = {d["name"]: d for d in listed["devices"]}
        assert [by_name[dev_eui(k)]["rejects"] for k in range(29, 36)] == [
            {},
            *[{"fingerprint_mismatch": 1}] * 5,
            {},
        ]
        assert by_name[dev_eui(25)]["sequence_resets"] == 2
        assert by_name[dev_eui(5)]["duplicates"] == by_name[dev_eui(15)]["duplicates"] == 1


def test_the_policy_caps_hold_for_a_lorawan_device(database_url: str, broker: Mosquitto) -> None:
    """A LoRaWAN device that ignores its ledger, on a stream with the default policy (8
    readings per UTC day, 1 per UTC hour): of its frames of yesterday, three in the first
    hour, one at the start of each later hour and a 10-reading one, the collector stores
    the first of each of the day's first 8 hours and refuses the rest as over_budget,
    counted on its /devices entry."""
    settings = {"ZEAL_BACKFILL_SECONDS": str(2 * 86_400)}  # readings of yesterday
    env = {
        "ZEAL_DATABASE_URL": database_url,
        "ZEAL_MQTT_URL": broker.url,
        "ZEAL_COLLECTOR_ID": "c1",
        "ZEAL_CHIRPSTACK_URL": broker.url,
        **settings,
    }
    with TestClient(create_app(ServerSettings.from_env(env))) as client:
        params = start(client, max_epsilon_per_day=8.0)
        assert (params.readings_per_day, params.readings_per_hour) == (8, 1)
        yesterday = (store.now_ms() // DAY_MS - 1) * DAY_MS
        device, air = dev_eui(7), Air()
        stamps = [yesterday + 1000 * i for i in range(3)]
        stamps += [yesterday + HOUR_MS * h for h in range(1, 24)]
        for f_cnt, when in enumerate(stamps):
            c = params.perturb([50.0])
            up = event(frame(params, device, c), device=device, f_cnt=f_cnt, time_ms=when,
                       dev_addr="26000007", dedup=air.dedup())  # fmt: skip
            air.send(up, "json", keep=c if f_cnt in (0, *range(3, 10)) else None)
        c = params.perturb([50.0] * PER_FRAME)
        up = event(frame(params, device, c), device=device, f_cnt=len(stamps),
                   time_ms=yesterday + 20 * HOUR_MS + 60_000, dev_addr="26000007",
                   dedup=air.dedup())  # fmt: skip
        air.send(up, "protobuf")
        publish_all(broker.port, air.messages)
        refused = len(air.messages) - 8

        def counted() -> int:
            return int(stats(client)["rejects"].get("over_budget", 0))

        wait_until(lambda: counted() == refused, 60, f"{refused} over_budget rejects")
        assert stats(client)["readings"] == 8
        hours = client.get(
            "/api/v1/streams/temps/series",
            params={"interval_seconds": 3600, "start": "2000-01-01T00:00:00Z"},
        ).json()["points"]
        assert [p["n"] for p in hours] == [1] * 8
        (entry,) = client.get("/api/v1/streams/temps/devices").json()["devices"]
        assert (entry["name"], entry["readings"], entry["epsilon_spent"]) == (device, 8, 8.0)
        assert entry["rejects"] == {"over_budget": refused}
        assert "over_budget" in entry["flags"]
        average = client.get("/api/v1/streams/temps/average").json()
        assert average["estimate"]["mean"] == params.estimate_mean(np.concatenate(air.stored)).mean


def test_readiness_says_when_chirpstacks_broker_is_out_of_reach(
    database_url: str, broker: Mosquitto
) -> None:
    """Zeal's broker up, ChirpStack's not listening: /readyz is 503 and names it."""
    env = {
        "ZEAL_DATABASE_URL": database_url,
        "ZEAL_MQTT_URL": broker.url,
        "ZEAL_COLLECTOR_ID": "c1",
        "ZEAL_CHIRPSTACK_URL": f"mqtt://127.0.0.1:{free_port()}",
    }
    with TestClient(create_app(ServerSettings.from_env(env))) as client:
        collector = state(client).collector
        wait_until(lambda: collector.broker_connected, 30, "Zeal's broker")
        wait_until(
            lambda: collector.source("chirpstack").last_error is not None, 30, "a ChirpStack error"
        )
        answer = client.get("/readyz")
        assert answer.status_code == 503
        body = answer.json()
        assert (body["broker"], body["chirpstack"]) == ("ok", "down")
        assert "ChirpStack's broker mqtt://127.0.0.1:" in body["collector"]["chirpstack_error"]
        assert "refused" in body["collector"]["chirpstack_error"].lower()


def test_uplinks_published_while_the_collector_is_away_wait_for_it(
    database_url: str, broker: Mosquitto
) -> None:
    """The collector's session on ChirpStack's broker is persistent: 20 uplinks published
    while its server is stopped are stored once it is back."""
    with TestClient(lorawan_app(database_url, broker)) as client:
        params = start(client)
    air, now = Air(), store.now_ms()
    for k in range(20):
        c = params.perturb([float(k)])
        up = event(frame(params, dev_eui(k), c), device=dev_eui(k), f_cnt=0, time_ms=now,
                   dev_addr=f"{0x26000000 + k:08x}", dedup=air.dedup())  # fmt: skip
        air.send(up, "protobuf", keep=c)
    publish_all(broker.port, air.messages)
    with TestClient(lorawan_app(database_url, broker)) as client:
        wait_until(lambda: stats(client)["readings"] == 20, 30, "the 20 readings")
        average = client.get("/api/v1/streams/temps/average").json()
        assert average["estimate"]["mean"] == params.estimate_mean(np.concatenate(air.stored)).mean


def test_no_uplink_event_stops_the_writer_and_mqtt_ingest_goes_on(
    database_url: str, broker: Mosquitto
) -> None:
    """Every field of UplinkEvent at the limits of its type (timestamps in the year 146
    billion, nanos past a second, enums the schema lacks, thousands of nested entries,
    45 KB strings; protobuf and JSON), then 5,000 mutated events, all of a bound
    application: each is stored, refused with a reason or skipped, and acknowledged; an
    MQTT device's 50 batches sent after them are all stored; the writer runs and /readyz
    says ready. (The first run of this test stopped the writer on the first
    out-of-range time, for good: the event came back at every restart.)"""
    rng = np.random.default_rng(48)
    with TestClient(lorawan_app(database_url, broker)) as client:
        params = start(client)
        now = store.now_ms()
        data = frame(params, dev_eui(0), frame_codes(params, rng, 40.0))
        base = event(data, device=dev_eui(0), f_cnt=1, time_ms=now, dev_addr="26000001",
                     dedup=str(uuid.UUID(int=1)))  # fmt: skip
        limits = limit_events(base) + json_limits(base)
        bodies = [body for _, body in limits]
        noise = list(mutated([marshal(base, "json"), marshal(base, "protobuf")], 5000, rng))
        events = [(topic(base), body) for body in bodies + noise]
        codes = [params.perturb(np.full(3, 50.0), rng=rng) for _ in range(50)]
        times = [now - 3000, now - 2000, now - 1000]
        batches = [
            (
                "zeal/v1/temps/mqtt-1/up",
                encode_batch(
                    params, stream="temps", device="mqtt-1", sequence=k, timestamps=times, codes=c
                ),
            )
            for k, c in enumerate(codes)
        ]
        publish_all(broker.port, events + batches)

        collector = state(client).collector
        handled = ("stored", "duplicate", "rejected", "skipped")
        total = len(events) + len(batches)

        def settled() -> bool:
            assert collector.writer_error is None, collector.writer_error
            return sum(collector.counts[o] for o in handled) == total

        wait_until(settled, 120, "every event and batch handled")
        assert collector.writer.acknowledged == collector.received == total
        assert collector.rejected_by["undecodable"] == 0, "a decoder raised an unexpected error"
        assert collector.rejected_by["bad_event"] > 0
        listed = client.get("/api/v1/streams/temps/devices", params={"limit": 1000}).json()
        by_name = {d["name"]: d for d in listed["devices"]}
        assert by_name["mqtt-1"]["readings"] == 150
        assert (client.get("/readyz").status_code, client.get("/livez").status_code) == (200, 200)


def test_an_mqtt_device_named_like_a_deveui_is_never_merged_into_that_lorawan_device(
    database_url: str, broker: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """A LoRaWAN device's frames first, then an MQTT device publishing under its DevEUI: the
    MQTT batches are refused (transport_mismatch, counted on the device, logged with what
    it means), the LoRaWAN device keeps its readings and has no sequence reset. The other
    way round (an MQTT device first, then that DevEUI's frames), the frames are refused.
    Before: the two merged into one device (10 sequence resets, no warning)."""
    rng = np.random.default_rng(6)
    with TestClient(lorawan_app(database_url, broker)) as client:
        params = start(client)
        now = store.now_ms()
        first, second = dev_eui(0), dev_eui(1)

        def uplink(device: str, f_cnt: int) -> tuple[str, bytes]:
            codes = frame_codes(params, rng, 40.0)
            data = frame(params, device, codes)
            up = event(data, device=device, f_cnt=f_cnt, time_ms=now + f_cnt,
                       dev_addr="26000001", dedup=str(uuid.uuid4()))  # fmt: skip
            return topic(up), marshal(up, "protobuf")

        def mqtt_batch(device: str, sequence: int) -> tuple[str, bytes]:
            codes = params.perturb(np.full(3, 50.0), rng=rng)
            times = [now - 3000 + sequence, now - 2000 + sequence, now - 1000 + sequence]
            payload = encode_batch(params, stream="temps", device=device, sequence=sequence,
                                   timestamps=times, codes=codes)  # fmt: skip
            return f"zeal/v1/temps/{device}/up", payload

        with caplog.at_level(logging.WARNING, logger="zeal_server.broker.door"):
            publish_all(broker.port, [uplink(first, k) for k in range(3)])
            publish_all(broker.port, [mqtt_batch(second, k) for k in range(3)])
            collector = state(client).collector
            wait_until(lambda: collector.counts["stored"] == 6, 30, "both devices' first data")
            publish_all(broker.port, [mqtt_batch(first, k) for k in range(5)])
            publish_all(broker.port, [uplink(second, k) for k in range(4)])
            wait_until(lambda: collector.rejected_by["transport_mismatch"] == 9, 30, "the refusals")
        listed = client.get("/api/v1/streams/temps/devices").json()["devices"]
        by_name = {d["name"]: d for d in listed}
        lorawan, mqtt_device = by_name[first], by_name[second]
        assert (lorawan["readings"], lorawan["sequence_resets"]) == (3 * PER_FRAME, 0)
        assert lorawan["rejects"] == {"transport_mismatch": 5}
        assert (mqtt_device["readings"], mqtt_device["sequence_resets"]) == (9, 0)
        assert mqtt_device["rejects"] == {"transport_mismatch": 4}
        said = [r.getMessage() for r in caplog.records]
        assert any(
            f"from temps/{first}: transport_mismatch, the device name belongs" in m for m in said
        )
