"""Bytes on the wire per reading (``python -m zeal_edge.bench``).

Whole MQTT v5 PUBLISH packets at QoS 1 (fixed header, topic, packet id, properties, payload)
per reading, for Zeal batches beside a JSON telemetry message per reading and a raw 16-byte
binary reading (8-byte ms timestamp, 8-byte float64) per message. Computed from the packet
layout of the MQTT 5 specification (section 3.3); a test checks it against paho's bytes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from zeal import Zeal, encode_batch
from zeal.mqtt.topics import data_topic

__all__ = ["json_message", "publish_packet_size", "size_table"]

TOPIC = data_topic("temps", "device-0001")
DATA = Path(__file__).resolve().parents[2] / "data" / "seattle-temps.csv"
BASE_MS = 1767225600000


def _varint_len(value: int) -> int:
    length = 1
    while value >= 128:
        value >>= 7
        length += 1
    return length


def publish_packet_size(topic: str, payload_len: int, *, qos: int = 1) -> int:
    """Bytes of an MQTT v5 PUBLISH packet without properties."""
    remaining = 2 + len(topic.encode()) + (2 if qos else 0) + 1 + payload_len
    return 1 + _varint_len(remaining) + remaining


def json_message(timestamp_ms: int, value: float) -> bytes:
    """The JSON telemetry message the comparison uses for one reading."""
    return json.dumps({"ts": timestamp_ms, "values": {"temp": value}}).encode()


def size_table(readings: np.ndarray) -> list[dict[str, float]]:
    """Bytes per reading for each batch size and width, with the JSON and raw references."""
    json_bytes = np.mean(
        [
            publish_packet_size(TOPIC, len(json_message(BASE_MS + i * 1000, float(v))))
            for i, v in enumerate(readings[:1000])
        ]
    )
    raw_bytes = publish_packet_size(TOPIC, 16)
    rows = []
    for bits in (4, 6, 8):
        params = Zeal(lower=0, upper=110, epsilon=1, payload_bits=bits)
        for n in (1, 10, 60, 600):
            codes = params.perturb(readings[:n], rng=np.random.default_rng(0))
            payload = encode_batch(
                params,
                stream="temps",
                device="device-0001",
                sequence=1000,
                codes=codes,
                timestamps=BASE_MS + 1000 * np.arange(n),
            )
            per_reading = publish_packet_size(TOPIC, len(payload)) / n
            rows.append(
                {
                    "bits": bits,
                    "batch": n,
                    "payload": len(payload),
                    "per_reading": per_reading,
                    "json": float(json_bytes),
                    "raw": float(raw_bytes),
                    "vs_json": float(json_bytes) / per_reading,
                    "vs_raw": raw_bytes / per_reading,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zeal_edge.bench", description=__doc__)
    parser.add_argument("--dataset", type=Path, default=DATA, help="CSV with a temp column")
    args = parser.parse_args(argv)
    with args.dataset.open(newline="") as handle:
        readings = np.array([float(r["temp"]) for r in csv.DictReader(handle)])
    rows = size_table(readings)
    print(f"MQTT v5 PUBLISH bytes per reading, QoS 1, topic {TOPIC!r} ({len(TOPIC)} chars)")
    print(
        f"JSON message per reading: {rows[0]['json']:.1f} B   "
        f"raw 16-byte reading: {rows[0]['raw']:.0f} B"
    )
    print(
        f"{'bits':>4} {'batch':>6} {'payload B':>10} {'B/reading':>10} "
        f"{'x smaller than JSON':>20} {'than raw':>9}"
    )
    for r in rows:
        print(
            f"{r['bits']:>4} {r['batch']:>6} {r['payload']:>10} {r['per_reading']:>10.2f} "
            f"{r['vs_json']:>20.1f} {r['vs_raw']:>9.1f}"
        )


if __name__ == "__main__":
    main()
