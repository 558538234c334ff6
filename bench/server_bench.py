"""Server speed: end-to-end ingest into SQLite, and /average over 10**7 readings.

1. A collector (in-process, SQLite in a temp dir) on the broker at ZEAL_MQTT_URL, or on a
   private Mosquitto started here with ``max_queued_messages 0`` (a broker's default of 1000
   queued messages per client drops QoS 1 messages for a collector that falls behind);
   one `zeal-edge simulate` process publishes 600,000 readings as fast as acknowledged; the
   figure is readings committed per second, from the first publish to the last commit
   (target >= 50,000).
2. 10**7 readings ingested straight into a SQLite store (100 devices, 1 reading/s, 60 s
   buckets); the median latency of 50 GET /average calls through the ASGI app, ungrouped
   and for a group of half the devices (target < 50 ms); and of 10 GET /stats (with the
   efficiency figures, as the dashboard polls it).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from zeal import Zeal, encode_batch
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings

warnings.filterwarnings("ignore")


ROOT = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("ZEAL_MQTT_URL", "")


def private_broker(tmp: str, extra: str = "") -> tuple[str, subprocess.Popen[bytes]]:
    """Mosquitto on a free port that never drops queued QoS 1 messages (+ `extra` lines)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Path(tmp) / "mosquitto.conf"
    config.write_text(
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\n"
        f"allow_anonymous true\nmax_queued_messages 0\n{extra}"
    )
    process = subprocess.Popen(
        ["mosquitto", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    return f"mqtt://127.0.0.1:{port}", process


def ingest_rate(
    tmp: str, broker: str, database_url: str | None = None, label: str = "SQLite"
) -> float:
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": database_url or f"sqlite:///{tmp}/e2e.sqlite",
            "ZEAL_MQTT_URL": broker,
            "ZEAL_COLLECTOR_ID": f"bench-{os.getpid()}",
            "ZEAL_SHARE_GROUP": f"bench-{os.getpid()}",
            "ZEAL_DEVICE_MAX_EPSILON_PER_DAY": RAISED_DEVICE_CAP,  # as the stream's policy
        }
    )
    app = create_app(settings)
    with TestClient(app) as client:
        client.post(
            "/api/v1/streams",
            json=stream_body("bench-e2e"),
        )
        if not app.state.collector.subscribed.wait(30):
            raise SystemExit(f"the collector could not subscribe at {broker}")
        total = 200 * 3000
        started = time.time()
        sim = subprocess.run(
            [
                sys.executable,
                "-m",
                "zeal_edge",
                "simulate",
                "--devices",
                "200",
                "--source",
                f"csv:{ROOT / 'data' / 'seattle-temps.csv'}",
                "--stream",
                "bench-e2e",
                "--broker",
                broker,
                "--rate",
                "0",
                "--readings",
                "3000",
                "--data-dir",
                os.path.join(tmp, f"sim-{label}"),
                "--log-level",
                "WARNING",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if sim.returncode:
            raise SystemExit(f"simulate failed: {sim.stderr[-2000:]}")
        deadline = time.time() + 300
        while client.get("/api/v1/streams/bench-e2e/stats").json()["readings"] < total:
            if time.time() > deadline:
                raise SystemExit("not all readings arrived within 300 s")
            time.sleep(0.05)
        seconds = time.time() - started
    print(
        f"end-to-end ingest into {label}: {total:,} readings in {seconds:.1f} s = "
        f"{total / seconds:,.0f} readings/s committed (target 50,000)"
    )
    return total / seconds


#: The device cap across streams of the benchmarks' servers: none, as the streams' policies
#: are raised (stream_body) for devices that send many readings a day.
RAISED_DEVICE_CAP = "none"


def stream_body(name: str) -> dict[str, Any]:
    """A 0-110 stream at epsilon 1 whose many readings a day need a raised privacy policy."""
    return {"name": name, "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 1e6}


def average_latency(tmp: str) -> tuple[float, float]:
    params = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6)
    settings = ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": f"sqlite:///{tmp}/big.sqlite", "ZEAL_MQTT_URL": "off"}
    )
    app = create_app(settings)
    with TestClient(app) as client:
        client.post(
            "/api/v1/streams",
            json=stream_body("big"),
        )
        rng = np.random.default_rng(0)
        ingest, t0, batch, devices, per_device = Ingest(), 1767225600000, 600, 100, 100_000
        started = time.time()
        for start in range(0, per_device, batch):
            codes = params.perturb(rng.uniform(30, 70, (devices, batch)), rng=rng)
            messages = [
                (
                    f"zeal/v1/big/d{d:03d}/up",
                    encode_batch(
                        params,
                        stream="big",
                        device=f"d{d:03d}",
                        sequence=start // batch,
                        codes=codes[d],
                        timestamps=t0 + 1000 * (start + np.arange(batch)),
                    ),
                    t0,
                )
                for d in range(devices)
            ]
            with app.state.sessions() as session, session.begin():
                ingest.add_many(session, messages)
        print(f"loaded {devices * per_device:,} readings in {time.time() - started:.0f} s")
        for d in range(devices // 2):
            client.put(f"/api/v1/streams/big/devices/d{d:03d}/tags", json={"tags": {"half": "a"}})
        results = []
        for params_ in ({}, {"group": "half:a"}):
            times = []
            for _ in range(50):
                begin = time.perf_counter()
                body = client.get("/api/v1/streams/big/average", params=params_).json()
                times.append(time.perf_counter() - begin)
            results.append(statistics.median(times) * 1000)
            print(
                f"/average {json.dumps(params_)} over n = {body['n']:,}: median "
                f"{results[-1]:.1f} ms (target < 50)"
            )
        times = []
        for _ in range(10):  # what the dashboard's stream page polls every 10 s
            begin = time.perf_counter()
            body = client.get("/api/v1/streams/big/stats").json()
            times.append(time.perf_counter() - begin)
        print(
            f"/stats with efficiency over {body['readings']:,} readings in "
            f"{devices * -(-per_device // batch):,} uncompacted segments: median "
            f"{statistics.median(times) * 1000:.1f} ms"
        )
    return results[0], results[1]


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        process = None
        broker = BROKER
        if not broker:
            broker, process = private_broker(tmp)
        try:
            ingest_rate(tmp, broker)
        finally:
            if process is not None:
                process.terminate()
        average_latency(tmp)
