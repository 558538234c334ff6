"""The size benchmark's packet arithmetic against the bytes paho actually writes."""

from __future__ import annotations

import socket
import threading

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.helpers import load_temps
from zeal_edge.bench import TOPIC, json_message, publish_packet_size, size_table


def _read_packet(conn: socket.socket) -> bytes:
    head = conn.recv(1, socket.MSG_WAITALL)
    length_bytes, multiplier, remaining = b"", 1, 0
    while True:
        byte = conn.recv(1, socket.MSG_WAITALL)
        length_bytes += byte
        remaining += (byte[0] & 0x7F) * multiplier
        multiplier *= 128
        if not byte[0] & 0x80:
            break
    return head + length_bytes + conn.recv(remaining, socket.MSG_WAITALL)


def test_publish_size_matches_paho_on_the_wire() -> None:
    """publish_packet_size equals the length of the PUBLISH packet paho sends (v5, QoS 1)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    sizes: list[int] = []

    def fake_broker() -> None:
        conn, _ = server.accept()
        with conn:
            _read_packet(conn)  # CONNECT
            conn.sendall(b"\x20\x03\x00\x00\x00")  # CONNACK, success, no properties
            for _ in range(3):
                sizes.append(len(_read_packet(conn)))

    thread = threading.Thread(target=fake_broker, daemon=True)
    thread.start()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    payloads = [b"x" * 61, b"y" * 300, json_message(1767225600000, 52.3)]
    for payload in payloads:
        client.publish(TOPIC, payload, qos=1)
    thread.join(timeout=10)
    client.loop_stop()
    server.close()
    assert sizes == [publish_packet_size(TOPIC, len(p)) for p in payloads]


def test_batch_of_60_at_6_bits_is_30_times_smaller_than_json() -> None:
    """At batch 60 and 6 bits a reading costs at least 30x fewer bytes than a JSON message."""
    rows = size_table(load_temps("seattle-temps.csv"))
    row = next(r for r in rows if r["bits"] == 6 and r["batch"] == 60)
    assert row["vs_json"] >= 30
    assert row["payload"] <= 64
    assert all(r["per_reading"] < r["raw"] for r in rows if r["batch"] > 1)
    assert np.isclose(row["per_reading"] * 60, publish_packet_size(TOPIC, row["payload"]))
