"""One `zeal-edge simulate` process into the broker at ZEAL_MQTT_URL (default: local 1883).

Prints the readings per second the broker acknowledged (target: >= 20,000). 1,000 devices,
600 readings each, as fast as acknowledged. A QoS 0 subscription to the stream's data stands
in for the collector's: without a subscriber the broker drops what it is sent and says so,
and the simulator keeps those batches and sends them again (docs/edge-agent.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from zeal import Zeal
from zeal.mqtt.brokerurl import parse_broker_url
from zeal.mqtt.streamconfig import config_document

ROOT = Path(__file__).resolve().parents[1]


def stand_in(url: str) -> mqtt.Client:
    """A subscriber to the bench stream's data at QoS 0 (it discards what it gets)."""
    settings = parse_broker_url(url)
    subscribed = threading.Event()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_connect = lambda c, *_: c.subscribe("zeal/v1/bench/+/up", qos=0)
    client.connect(settings.host, settings.port)
    client.loop_start()
    if not subscribed.wait(10):
        raise SystemExit(f"cannot subscribe at {url}")
    return client


def main() -> int:
    broker = os.environ.get("ZEAL_MQTT_URL", "mqtt://127.0.0.1:1883")
    subscriber = stand_in(broker)
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(config_document("bench", Zeal(lower=0, upper=110, epsilon=1))))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "zeal_edge",
                "simulate",
                "--devices",
                "1000",
                "--source",
                f"csv:{ROOT / 'data' / 'seattle-temps.csv'}",
                "--stream",
                "bench",
                "--broker",
                broker,
                "--params",
                str(params),
                "--rate",
                "0",
                "--readings",
                "600",
                "--data-dir",
                tmp,
                "--log-level",
                "WARNING",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    subscriber.disconnect()
    subscriber.loop_stop()
    print(f"simulate into {broker}: {result.stdout.strip() or result.stderr.strip()}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
