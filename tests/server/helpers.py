"""Helpers the tests share (never imported from a test module)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import psycopg
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, fleet_command
from tools.testbed.wait import wait_until as wait_until  # the one wait (re-exported)
from zeal import Zeal, encode_batch
from zeal.mqtt.topics import NOTICE_FORMAT
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings

OPERATOR, READER = "operator-token-0123456789", "reader-token-0123456789"


T0 = 1767225600000  # 2026-01-01T00:00:00Z


#: Test streams hold many readings per device and day: their operator raised the privacy
#: policy (the default, 8 readings a day at epsilon 1, is tested in test_policy).
RAISED_POLICY = 1e6


PARAMS = Zeal(lower=0, upper=110, epsilon=1, payload_bits=6, max_epsilon_per_day=RAISED_POLICY)


#: The tests' servers run streams whose policy is raised (RAISED_POLICY): their operator
#: lifts the device cap across streams with it (tests/server/ingest/test_device_cap*.py
#: keep the default).
NO_DEVICE_CAP = {"ZEAL_DEVICE_MAX_EPSILON_PER_DAY": "none"}


def settings(url: str, **extra: str) -> ServerSettings:
    return ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": url, "ZEAL_MQTT_URL": "off", **NO_DEVICE_CAP, **extra}
    )


def operator_client(url: str) -> Iterator[TestClient]:
    """A client of a server on `url` (no broker) that sends the operator token."""
    with TestClient(create_app(settings(url, ZEAL_OPERATOR_TOKEN=OPERATOR))) as c:
        c.headers["Authorization"] = f"Bearer {OPERATOR}"
        yield c


def answered(client: TestClient, url: str, **query: Any) -> dict[str, Any]:
    """A read's 200 body (the test fails with the answer's text otherwise)."""
    answer = client.get(url, params=query)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def create(client: TestClient, **overrides: Any) -> dict[str, Any]:
    body = {
        "name": "temps",
        "lower": 0,
        "upper": 110,
        "epsilon": 1,
        "payload_bits": 6,
        "bucket_seconds": 60,
        "max_epsilon_per_day": RAISED_POLICY,
        **overrides,
    }
    response = client.post("/api/v1/streams", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def feed(
    client: TestClient,
    device: str,
    sequence: int,
    readings: np.ndarray,
    start_ms: int,
    stream: str = "temps",
    rng: int = 0,
) -> np.ndarray:
    """Perturb readings, encode them as a batch and hand the message to the store."""
    codes = PARAMS.perturb(readings, rng=np.random.default_rng(rng))
    payload = encode_batch(
        PARAMS,
        stream=stream,
        device=device,
        sequence=sequence,
        codes=codes,
        timestamps=start_ms + 1000 * np.arange(readings.size),
    )
    ingest = Ingest()
    with state(client).sessions() as session, session.begin():
        outcome = ingest.add(session, f"zeal/v1/{stream}/{device}/up", payload, start_ms)
    assert outcome.status == "stored", outcome
    return codes


def server_app(
    database_url: str, broker: Mosquitto, collector_id: str = "c1", share_group: str = ""
) -> Any:
    return create_app(
        ServerSettings.from_env(
            {
                "ZEAL_DATABASE_URL": database_url,
                "ZEAL_MQTT_URL": broker.url,
                **NO_DEVICE_CAP,
                "ZEAL_COLLECTOR_ID": collector_id,
                "ZEAL_SHARE_GROUP": share_group,
            }
        )
    )


def create_stream(client: TestClient, **extra: Any) -> Zeal:
    body = {
        "name": "temps",
        "lower": 0,
        "upper": 110,
        "epsilon": 1,
        "max_epsilon_per_day": 1e6,
        **extra,
    }
    out = client.post("/api/v1/streams", json=body).json()
    return Zeal(
        lower=0,
        upper=110,
        epsilon=1,
        exponent=out["exponent"],
        max_epsilon_per_day=out["max_epsilon_per_day"],
    )


def stats(client: TestClient, stream: str = "temps") -> dict[str, Any]:
    result: dict[str, Any] = client.get(f"/api/v1/streams/{stream}/stats").json()
    return result


def simulate(broker: Mosquitto, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fleet_command(broker.url, tmp_path / "sim", *args),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@contextmanager
def stalled(database_url: str, seconds: float) -> Iterator[threading.Event]:
    """Another client holds the lock the collector's writes need for `seconds` (in a
    thread; the event is set once the lock is held and cleared when it is released)."""
    held = threading.Event()

    def hold() -> None:
        if database_url.startswith("sqlite:///"):
            lite = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
            lite.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(seconds)  # time is the scenario: a database that stalls this long
            lite.execute("COMMIT")
            lite.close()
        else:
            url = database_url.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(url) as conn:
                conn.execute("LOCK TABLE device_periods IN ACCESS EXCLUSIVE MODE")
                held.set()
                time.sleep(seconds)  # time is the scenario: a database that stalls this long
        held.clear()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10), "could not take the database lock"
    try:
        yield held
    finally:
        thread.join()


def publish_all(
    port: int,
    messages: list[tuple[str, bytes]],
    protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv5,
    qos: list[int] | None = None,
) -> None:
    """A foreign publisher, on one connection, in order (QoS 1 unless `qos` says each
    message's) that waits for every PUBACK."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="stall-pub", protocol=protocol)
    client.connect("127.0.0.1", port)
    client.loop_start()
    levels = qos or [1] * len(messages)
    infos = [client.publish(t, p, qos=q) for (t, p), q in zip(messages, levels, strict=True)]
    for info in infos:
        info.wait_for_publish(30)
    client.disconnect()
    client.loop_stop()


def agent_command(
    data_dir: Path, broker: Mosquitto, params: Path, *args: str, stream: str = "temps"
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zeal_edge",
        "run",
        "--stream",
        stream,
        "--device",
        "dev1",
        "--source",
        "stdin",
        "--broker",
        broker.url,
        "--data-dir",
        str(data_dir),
        "--params",
        str(params),
        *("--max-epsilon-per-day", "1e6"),  # the policy of stream_body
        *("--device-max-epsilon-per-day", "none"),  # and no device cap (NO_DEVICE_CAP)
        *args,
    ]


def save_config(client: Any, path: Path, stream: str = "temps") -> Path:
    """What the README tells users: curl .../config > params.json."""
    response = client.get(f"/api/v1/streams/{stream}/config")
    assert response.status_code == 200, response.text
    path.write_text(response.text)
    return path


def zeal_server(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zeal_server", *args],
        env={**os.environ, "ZEAL_MQTT_URL": "off", **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def postgres_database() -> Iterator[str]:
    name = f"zeal_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    yield f"{base}/{name}"
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


PG = os.environ.get("ZEAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG, autocommit=True)


def notices_into(got: list[dict[str, Any]]) -> Callable[..., None]:
    """A paho on_message callback that keeps the notices (zeal-notice/2) heard on a device's
    notice topic in `got`, parsed, and leaves out the caps documents the collector sends
    there too (zeal-caps/1: zeal_server.broker.devicecaps)."""

    def keep(client: Any, userdata: Any, message: Any) -> None:
        document = json.loads(message.payload)
        if document.get("format") == NOTICE_FORMAT:
            got.append(document)

    return keep
