"""What one device login can make the broker hold (docs/reliability.md, "Probed as an attacker
would"): the deployment's broker configuration (deploy/mosquitto, its password file, ACL
and dynamic security plugin) on a private Mosquitto, a device provisioned through the
plugin as the API does (`mallory`) and one from the password file (`evil`).

For each attack, the broker's resident memory (VmRSS) before, at its peak and after the
attacker has gone, and what the broker did:

1. unreleased QoS 2: 6,000 PUBLISH packets of 100 KB at QoS 2 on the device's own data
   topic, never released (a raw MQTT 3.1.1 client; it connects again when the broker
   closes the connection);
2. retained messages: 2,000 retained 100 KB messages on the device's own presence topics
   under invented stream names, with the deployment's config as it is, and with its
   zeal_retain plugin enabled (deploy/mosquitto/plugin; then also under 65-character
   stream names, which no Zeal name fits, from both logins, and 20,000 presences of 1 KB,
   under the plugin's size limit);
3. an offline session: each login connects with a persistent session, subscribes to `#`,
   `zeal/v1/+/+/up` and its own topics, and goes away; 200 other devices then publish
   100,000 batches.

Target: no attack grows the broker's memory by more than 50 MB. Exits 1 when
one does (the retained attack does, without the plugin). Memory figures, so a benchmark
and not a unit test.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.server import DeployBroker
from tools.testbed.verdict import finish
from zeal.mqtt.brokerurl import parse_broker_url
from zeal_server.broker.provisioning import BrokerAdmin

ROOT = Path(__file__).resolve().parents[1]


BIG = b"x" * 100_000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("!H", len(data)) + data


def raw_connect(port: int, user: str, password: str) -> socket.socket:
    """An MQTT 3.1.1 connection made by hand (clean session), CONNACK read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = _text("MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 60)
    body += _text(user) + _text(user) + _text(password)
    sock.sendall(b"\x10" + _length(len(body)) + body)
    answer = sock.recv(4)
    if len(answer) < 4 or answer[3] != 0:
        raise ConnectionError(f"CONNACK {answer!r}")
    return sock


def unreleased_qos2(port: int, user: str, password: str, count: int) -> dict[str, Any]:
    topic = f"zeal/v1/temps/{user}/up"
    sent = reconnects = 0
    sock = raw_connect(port, user, password)
    while sent < count:
        packet_id = sent % 65535 + 1
        body = _text(topic) + struct.pack("!H", packet_id) + BIG
        try:
            sock.sendall(b"\x34" + _length(len(body)) + body)  # PUBLISH, QoS 2
            sent += 1
        except OSError:
            sock.close()
            reconnects += 1
            try:
                sock = raw_connect(port, user, password)
            except OSError:
                time.sleep(0.05)
    time.sleep(1.0)  # what the broker holds now: the attacker is still connected
    return {"publishes": sent, "reconnects": reconnects, "socket": sock}


def paho_client(port: int, user: str, password: str, *, persistent: bool = False) -> mqtt.Client:
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=user,
        protocol=MQTTProtocolVersion.MQTTv311,
        clean_session=not persistent,
    )
    c.username_pw_set(user, password)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def retained(
    port: int,
    user: str,
    password: str,
    count: int,
    payload: bytes = BIG,
    stream: str = "invented-{i}",
) -> dict[str, Any]:
    """`count` retained presences under the stream names `stream` makes (with {i})."""
    c = paho_client(port, user, password)
    accepted = 0
    for i in range(count):
        topic = f"zeal/v1/{stream.format(i=i)}/{user}/presence"
        info = c.publish(topic, payload, qos=1, retain=True)
        try:
            info.wait_for_publish(10)
            accepted += 1
        except (RuntimeError, ValueError):
            break
    c.disconnect()
    c.loop_stop()
    return {"published": accepted}


def offline_session(port: int, logins: list[tuple[str, str]], batches: int) -> dict[str, Any]:
    for user, password in logins:
        c = paho_client(port, user, password, persistent=True)
        c.subscribe([("#", 1), ("zeal/v1/+/+/up", 1), (f"zeal/v1/+/{user}/notice", 1)])
        time.sleep(0.5)
        c.disconnect()
        c.loop_stop()
    fleet = paho_client(port, "zeal-fleet-simulator", "pw-zeal-fleet-simulator")
    payload = b"\x20" + b"z" * 59  # a batch-sized message (the broker does not decode it)
    for i in range(batches):
        fleet.publish(f"zeal/v1/temps/dev{i % 200:03d}/up", payload, qos=1)
        if i % 1000 == 999:
            fleet.publish("zeal/v1/temps/dev000/up", payload, qos=1).wait_for_publish(30)
    fleet.disconnect()
    fleet.loop_stop()
    return {"batches": batches}


def attack(name: str, run: Any, *, plugin: bool = False) -> dict[str, Any]:
    """`plugin`: with deploy/mosquitto/plugin/zeal_retain.so enabled, and the collector's
    configuration of stream temps retained first (as a running collector's is)."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = DeployBroker(Path(tmp) / "broker", retain_plugin=plugin)
        passwd = Path(tmp) / "broker" / "passwd"
        subprocess.run(
            [
                "mosquitto_passwd",
                "-b",
                str(passwd),
                "zeal-fleet-simulator",
                "pw-zeal-fleet-simulator",
            ],
            check=True,
        )
        broker.start()
        try:
            assert broker.process is not None
            pid = broker.process.pid
            admin = BrokerAdmin(parse_broker_url(broker.url), "zeal-admin", "pw-zeal-admin")
            password = admin.provision("mallory")
            if plugin:
                collector = paho_client(broker.port, "zeal-collector", "pw-zeal-collector")
                collector.publish(
                    "zeal/v1/temps/config", b'{"stream": "temps"}', qos=1, retain=True
                ).wait_for_publish(10)
                collector.disconnect()
                collector.loop_stop()
            before = rss_mb(pid)
            found = run(broker.port, password)
            held = rss_mb(pid)
            sock = found.pop("socket", None)
            if sock is not None:
                sock.close()
            time.sleep(2.0)
            after = rss_mb(pid)
            log = (Path(tmp) / "broker" / "mosquitto.log").read_text()
            db = Path(tmp) / "broker" / "mosquitto.db"
        finally:
            broker.stop()
        stored = db.stat().st_size / 1e6 if db.exists() else 0.0
    found.update(
        attack=name + (" with zeal_retain" if plugin else ""),
        rss_before_mb=round(before, 1),
        rss_attacker_present_mb=round(held, 1),
        rss_after_mb=round(after, 1),
        grown_mb=round(max(held, after) - before, 1),
        persisted_mb_at_stop=round(stored, 1),
        disconnects_logged=log.count("disconnected") + log.count("Disconnecting"),
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    results = [
        attack(
            "unreleased QoS 2 (provisioned login)",
            lambda port, pw: unreleased_qos2(port, "mallory", pw, 6000),
        ),
        attack(
            "unreleased QoS 2 (password-file login)",
            lambda port, _pw: unreleased_qos2(port, "evil", "pw-evil", 6000),
        ),
        attack(
            "retained (provisioned login)", lambda port, pw: retained(port, "mallory", pw, 2000)
        ),
        attack(
            "retained (provisioned login)",
            lambda port, pw: retained(port, "mallory", pw, 2000),
            plugin=True,
        ),
        attack(  # the ACL's `+` matches a level no Zeal name fits: once the plugin's bypass
            "retained under 65-character stream names (provisioned login)",
            lambda port, pw: retained(port, "mallory", pw, 2000, stream="{i:065d}"),
            plugin=True,
        ),
        attack(
            "retained under 65-character stream names (password-file login)",
            lambda port, _pw: retained(port, "evil", "pw-evil", 2000, stream="{i:065d}"),
            plugin=True,
        ),
        attack(
            "20,000 retained 1 KB presences (provisioned login)",
            lambda port, pw: retained(port, "mallory", pw, 20_000, b"p" * 1000),
            plugin=True,
        ),
        attack(
            "offline sessions of both logins",
            lambda port, pw: offline_session(port, [("mallory", pw), ("evil", "pw-evil")], 100_000),
        ),
    ]
    missed = []
    for found in results:
        print(json.dumps(found))
        if found["grown_mb"] > 50:
            missed.append(found["attack"])
    return finish(results, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
