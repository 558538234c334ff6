"""Per-message cost: the collector against a bare paho subscriber, same broker, same run.

For batch sizes 1, 10 and 60 readings per message: a private Mosquitto (no queue limit)
holds persistent sessions for both consumers; one publisher puts the same messages of 100
devices on the broker while both are away, so each session has its copy queued. Then each
consumer drains its queue alone: the bare subscriber (paho, MQTT v5, manual
acknowledgement, nothing else) and the collector (in-process, SQLite, storing and
acknowledging after commit). The rate is taken from the moment 10 % of the messages have
arrived to the last one received (bare) or committed (collector), so start-up is not
counted and a backlog left in the collector's queue is. Three alternated rounds per size;
medians and their ratio are printed, and written as JSON with --out.

A round at one reading per message is 60,000 messages: three of the collector's windows
(Receive Maximum, ZEAL_COLLECTOR_INFLIGHT = 20,000), so the rate includes the broker
refilling the window while the collector stores, and each drain lasts some 3 s (a 1 s
drain of 20,000 moved by a third from one round to the next on this shared machine).

    .venv/bin/python bench/message_cost.py [--messages 60000] [--sizes 1,10,60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench.server_bench import RAISED_DEVICE_CAP, private_broker, stream_body
from zeal import Zeal, encode_batch
from zeal.mqtt.streamconfig import read_config
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

warnings.filterwarnings("ignore")


DEVICES = 100
SIZES = (1, 10, 60)
BARE_ID = "bench-bare-subscriber"


def payloads(
    params: Zeal, stream: str, first: int, messages: int, size: int
) -> list[tuple[str, bytes]]:
    """Messages `first` to `first + messages` of 100 devices, batches of `size` readings
    ten a second, from an hour ago; each device's sequence numbers in order."""
    rng = np.random.default_rng(first + size)
    now = int(time.time() * 1000) - 3_600_000
    out = []
    for k in range(first, first + messages):
        device, sequence = k % DEVICES, k // DEVICES
        codes = params.perturb(rng.uniform(0, 110, size), rng=rng)
        stamps = now + 100 * (sequence * size + np.arange(size))
        payload = encode_batch(
            params, stream=stream, device=f"d{device:03d}", sequence=sequence,
            timestamps=stamps, codes=codes,
        )  # fmt: skip
        out.append((f"zeal/v1/{stream}/d{device:03d}/up", payload))
    return out


def session_client(port: int, client_id: str) -> mqtt.Client:
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    client.manual_ack_set(True)
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    properties.SessionExpiryInterval = 3600
    client.connect("127.0.0.1", port, clean_start=False, properties=properties)
    return client


def publish(port: int, messages: list[tuple[str, bytes]]) -> None:
    publisher = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    publisher.max_inflight_messages_set(1000)
    publisher.connect("127.0.0.1", port)
    publisher.loop_start()
    for at in range(0, len(messages), 10_000):  # message ids are 16-bit: never 65,536 queued
        infos = [publisher.publish(t, p, qos=1) for t, p in messages[at : at + 10_000]]
        for info in infos:
            info.wait_for_publish(60)
    publisher.disconnect()
    publisher.loop_stop()


def rate(stamps: list[float], total: int) -> float:
    """Messages a second between the 10 % and the 100 % mark."""
    first = stamps[total // 10]
    return (total - total // 10) / (stamps[total - 1] - first)


def bare_drain(port: int, total: int) -> float:
    stamps: list[float] = []
    done = threading.Event()

    def on_message(client: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        client.ack(message.mid, message.qos)
        stamps.append(time.perf_counter())
        if len(stamps) == total:
            done.set()

    client = session_client(port, BARE_ID)
    client.on_message = on_message
    client.loop_start()
    if not done.wait(300):
        raise SystemExit(f"the bare subscriber got {len(stamps)} of {total}")
    client.disconnect()
    client.loop_stop()
    return rate(stamps, total)


def collector_drain(app: Any, total: int) -> float:
    """Messages a second from the 10 % mark of those the collector received to the commit
    of the last: what the bare subscriber's rate is, plus storing what is left."""
    collector = app.state.collector
    deadline = time.monotonic() + 300
    while collector.received < total // 10:
        if time.monotonic() > deadline:
            raise SystemExit(f"the collector received {collector.received} of {total}")
        time.sleep(0.001)
    first = time.perf_counter()
    while (stored := collector.counts["stored"]) < total:
        if time.monotonic() > deadline:
            raise SystemExit(f"the collector stored {stored} of {total}")
        time.sleep(0.001)
    return (total - total // 10) / (time.perf_counter() - first)


def measure(tmp: str, port: int, size: int, total: int, rounds: int) -> dict[str, Any]:
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": f"sqlite:///{tmp}/cost-{size}.sqlite",
            "ZEAL_MQTT_URL": f"mqtt://127.0.0.1:{port}",
            "ZEAL_COLLECTOR_ID": f"bench-collector-{size}",
            "ZEAL_BACKFILL_SECONDS": "86400",  # the messages are stamped from an hour ago
            "ZEAL_DEVICE_MAX_EPSILON_PER_DAY": RAISED_DEVICE_CAP,  # as the stream's policy
        }
    )
    bare, collector = [], []
    with TestClient(create_app(settings)) as client:  # creates the collector's session
        client.post("/api/v1/streams", json=stream_body("cost"))
        params = read_config(client.get("/api/v1/streams/cost/config").json()).params
        client.app.state.collector.subscribed.wait(30)  # type: ignore[attr-defined]
    subscriber = session_client(port, BARE_ID)  # the bare subscriber's session
    subscriber.loop_start()
    subscriber.subscribe("zeal/v1/+/+/up", qos=1)
    time.sleep(0.5)
    subscriber.disconnect()
    subscriber.loop_stop()
    for r in range(rounds):
        messages = payloads(params, "cost", total * r, total, size)
        publish(port, messages)
        order = ["bare", "collector"] if r % 2 == 0 else ["collector", "bare"]
        for who in order:
            if who == "bare":
                bare.append(bare_drain(port, total))
                continue
            with TestClient(create_app(settings)) as client:
                collector.append(collector_drain(client.app, total))
    return {
        "readings_per_message": size,
        "messages": total,
        "bare_per_s": statistics.median(bare),
        "collector_per_s": statistics.median(collector),
        "ratio": statistics.median(collector) / statistics.median(bare),
        "rounds": {"bare": bare, "collector": collector},
    }


def main() -> int:
    logging.getLogger("zeal_server").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--messages", type=int, default=60_000,
        help="per round at one reading per message (ten times as many readings at other sizes)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sizes", type=lambda text: [int(v) for v in text.split(",")], default=list(SIZES),
        help="readings per message, comma-separated (default 1,10,60)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        url, broker = private_broker(tmp)
        port = int(url.rsplit(":", 1)[1])
        try:
            for size in args.sizes:
                total = args.messages if size == 1 else max(2000, args.messages * 10 // size)
                result = measure(tmp, port, size, total, args.rounds)
                results.append(result)
                print(
                    f"{size:>2} readings/message, {total:,} messages x {args.rounds} rounds: "
                    f"bare subscriber {result['bare_per_s']:,.0f}/s, collector "
                    f"{result['collector_per_s']:,.0f}/s (medians), ratio {result['ratio']:.2f}",
                    flush=True,
                )
        finally:
            broker.terminate()
            broker.wait()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
