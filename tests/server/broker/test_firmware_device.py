"""The firmware library end to end: the libmosquitto example device (edge/firmware, in C)
publishes through a real Mosquitto to the real server, and the served average equals
zeal's estimate over the codes the device logged, exactly."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import NO_DEVICE_CAP, stats, wait_until
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto
from zeal._core.firmware import profile_bytes
from zeal.mqtt.streamconfig import read_config
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

pytestmark = pytest.mark.integration

FIRMWARE = Path(__file__).resolve().parents[3] / "edge" / "firmware"
READINGS = 1000


@pytest.fixture
def client(database_url: str, broker: Mosquitto) -> Iterator[TestClient]:
    """The real server on the broker; readings of the last day are accepted (backfill)."""
    env = {"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": broker.url, **NO_DEVICE_CAP}
    settings = ServerSettings.from_env({**env, "ZEAL_BACKFILL_SECONDS": "86400"})
    with TestClient(create_app(settings)) as c:
        wait_until(lambda: state(c).collector.broker_connected, what="collector")
        yield c


def test_the_c_device_publishes_and_the_served_average_is_its_codes_estimate(
    client: TestClient, broker: Mosquitto, tmp_path: Path, seattle: np.ndarray
) -> None:
    """1,000 of the bundled temperatures, in tenths of a degree, privatized on the C device
    and sent in batches of 60 with QoS 1: the server stores all of them, and /average is
    exactly Zeal.estimate_mean over the codes the device logged."""
    subprocess.run(["make", "-s", "-C", str(FIRMWARE), "device"], check=True)
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 1e6}
    assert client.post("/api/v1/streams", json=body).status_code == 201
    config = read_config(json.dumps(client.get("/api/v1/streams/temps/config").json()))
    profile = profile_bytes(config.params, stream="temps", device="c-device", unit=0.1)
    now = int(time.time()) * 1000  # the last 1,000 seconds, one reading a second
    lines = [f"{now - 1000 * (READINGS - i)},{v}\n" for i, v in enumerate(seattle[:READINGS])]
    csv = tmp_path / "readings.csv"
    csv.write_text("".join(lines))
    log = tmp_path / "codes.log"
    command = [str(FIRMWARE / "build" / "zeal-device"), "--profile", profile.hex()]
    command += ["--stream", "temps", "--device", "c-device", "--csv", str(csv)]
    base = [*command, "--batch", "60", "--log", str(log)]
    # TLS needs the CA (test_certificates.py runs it over TLS); --port is the old spelling
    # of --broker's port.
    tls = [*base, "--port", "8883", "--broker", "mqtts://127.0.0.1:8883"]
    refused = subprocess.run(tls, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert "--port is now --broker mqtt://HOST:PORT" in refused.stderr
    assert "mqtts:// needs --ca" in refused.stderr
    command = [*base, "--broker", f"mqtt://127.0.0.1:{broker.port}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is now" not in result.stderr
    assert result.stdout.count("acknowledged") == -(-READINGS // 60)

    logged = np.array([line.split() for line in log.read_text().splitlines()], dtype=np.int64)
    assert len(logged) == READINGS
    wait_until(lambda: stats(client)["readings"] == READINGS, what="the device's readings")
    served = client.get("/api/v1/streams/temps/average").json()
    expected = config.params.estimate_mean(logged[:, 1].astype(np.uint64))
    assert served["n"] == READINGS
    assert served["estimate"]["mean"] == expected.mean
    assert stats(client)["rejects"] == {}
    print(
        f"C device: {READINGS} readings in {result.stdout.count('acknowledged')} batches; "
        f"served {served['estimate']['mean']!r} == estimate over its logged codes "
        f"{expected.mean!r} (true mean {float(np.mean(seattle[:READINGS])):.3f})"
    )


def device_command(profile: bytes, device: str, csv: Path, broker: Mosquitto) -> list[str]:
    command = [str(FIRMWARE / "build" / "zeal-device"), "--profile", profile.hex()]
    command += ["--stream", "temps", "--device", device, "--csv", str(csv)]
    return [*command, "--broker", f"mqtt://127.0.0.1:{broker.port}", "--batch", "10"]


def test_the_c_device_says_a_refusal_and_keeps_its_sequence_across_runs(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """A profile made for c-device, run as c-device-2: the server refuses its batches
    (fingerprint_mismatch) and the device exits 3 with that reason. Two runs with a
    sequence file beside the profile: the second continues the numbering, so the server
    counts no sequence reset. Before: 'acknowledged' and exit 0 on the refusal, and every
    run began at sequence 0."""
    subprocess.run(["make", "-s", "-C", str(FIRMWARE), "device"], check=True)
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 1e6}
    assert client.post("/api/v1/streams", json=body).status_code == 201
    config = read_config(json.dumps(client.get("/api/v1/streams/temps/config").json()))
    profile = profile_bytes(config.params, stream="temps", device="c-device", unit=0.1)
    now = int(time.time()) * 1000
    csv = tmp_path / "readings.csv"
    csv.write_text("".join(f"{now - 1000 * (20 - i)},{50 + i / 10}\n" for i in range(20)))

    wrong = [*device_command(profile, "c-device-2", csv, broker), "--linger", "120"]
    refused = subprocess.run(wrong, capture_output=True, text=True, timeout=180, check=False)
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "the server refused a batch: fingerprint_mismatch" in refused.stderr

    sequence = tmp_path / "profile.seq"
    right = [*device_command(profile, "c-device", csv, broker), "--sequence-file", str(sequence)]
    for run in (1, 2):
        done = subprocess.run(right, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert sequence.read_text() == f"{2 * run}\n"
        wait_until(lambda run=run: stats(client)["readings"] == 20 * run, what="the readings")
    assert "batch 2: 10 readings" in done.stdout  # the second run went on from 2
    assert stats(client)["sequence_resets"] == 0
    assert stats(client)["duplicates"] == 0
