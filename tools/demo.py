"""``make demo``: a broker, the server and 200 simulated devices; served vs true average.

Uses the broker at ZEAL_MQTT_URL (default mqtt://127.0.0.1:1883) when one answers there,
otherwise starts a local ``mosquitto``. Each run starts from an empty ``demo-data/`` (the
server's SQLite database and the logs) and leaves it there for inspection. Every 5 seconds
it prints the served (debiased, privatized) average next to the true average of exactly the
readings stored so far. Ctrl-C, SIGTERM or SIGHUP (the terminal closing) stop everything it
started; on a broker it did not start, it then withdraws the demo stream's retained
configuration, so no later agent configures itself for a server that is gone.
"""

from __future__ import annotations

import csv
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tools.testbed.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "seattle-temps.csv"
STATE = ROOT / "demo-data"
DEVICES, RATE, BATCH = 200, 5, 30
STREAM = "demo-temps"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def wait_port(port: int, seconds: float = 20) -> None:
    try:
        wait_until(lambda: answers("127.0.0.1", port), seconds, f"port {port}")
    except AssertionError:
        raise SystemExit(f"nothing answers on port {port}") from None


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


SITES = ("north", "south")


def tag_sites(api: str, devices: list[dict[str, Any]]) -> None:
    """Put the demo's devices into two groups (even and odd numbers) for the dashboard."""
    for device in devices:
        if not device["tags"]:
            site = SITES[int(device["name"].rsplit("-", 1)[-1]) % 2]
            post(
                f"{api}/api/v1/streams/{STREAM}/devices/{device['name']}/tags",
                {"tags": {"site": site}},
                method="PUT",
            )


def post(url: str, body: dict[str, Any], method: str = "POST") -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def true_average(data: np.ndarray, devices: list[dict[str, Any]]) -> float:
    """The mean of exactly the readings stored so far (the simulator's replay is fixed:
    device d starts at row d * (len // DEVICES + 7) and steps one row per reading)."""
    total, count = 0.0, 0
    for device in devices:
        d, n = int(device["name"].split("-")[1]), int(device["readings"])
        rows = (d * (data.size // DEVICES + 7) + np.arange(n)) % data.size
        total += float(data[rows].sum())
        count += n
    return total / count if count else float("nan")


def main() -> int:
    children: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], env: dict[str, str] | None = None, log: str = "") -> None:
        out = (STATE / log).open("ab") if log else subprocess.DEVNULL
        children.append(
            subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir()
    external: str | None = None  # a broker the demo did not start
    try:
        url = os.environ.get("ZEAL_MQTT_URL", "mqtt://127.0.0.1:1883")
        parts = urlsplit(url)
        if answers(parts.hostname or "127.0.0.1", parts.port or 1883):
            broker = external = url
            print(f"broker: using {broker}")
        else:
            # No embedded Python broker as a fallback: amqtt 0.12.1, the maintained one,
            # refuses MQTT 5 clients ("Unsupported protocol version"), and the agent and the
            # collector speak MQTT 5 (shared subscriptions, reason codes).
            if shutil.which("mosquitto") is None:
                print(
                    f"no broker answers at {url} and there is no mosquitto binary; install "
                    "one (apt-get install mosquitto) or set ZEAL_MQTT_URL",
                    file=sys.stderr,
                )
                return 2
            port = free_port()
            (STATE / "mosquitto.conf").write_text(
                f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous true\n"
                "max_queued_messages 0\n"
            )
            start(["mosquitto", "-c", str(STATE / "mosquitto.conf")], log="mosquitto.log")
            wait_port(port)
            broker = f"mqtt://127.0.0.1:{port}"
            print(f"broker: no broker at {url}; started mosquitto at {broker}")
        http_port = int(os.environ.get("ZEAL_DEMO_PORT", "0")) or free_port()
        api = f"http://127.0.0.1:{http_port}"
        env = {
            **os.environ,
            "ZEAL_DATABASE_URL": f"sqlite:///{STATE / 'zeal.sqlite'}",
            "ZEAL_MQTT_URL": broker,
            "ZEAL_SHARE_GROUP": f"demo-{os.getpid()}",
            "ZEAL_COLLECTOR_ID": f"demo-{os.getpid()}",
            "ZEAL_MODE": "development",
            # ... and so is the device cap across streams (8 a day by default, as the
            # policy's): the demo's devices send one stream each, at a reading a second.
            "ZEAL_DEVICE_MAX_EPSILON_PER_DAY": "100000",
        }
        env.pop("ZEAL_OPERATOR_TOKEN", None)
        start(
            [sys.executable, "-m", "zeal_server", "serve", "--port", str(http_port)],
            env,
            "server.log",
        )
        wait_port(http_port)

        def subscribed() -> bool:
            try:
                return bool(get(f"{api}/healthz").get("broker") == "ok")
            except (urllib.error.URLError, OSError):
                return False

        wait_until(subscribed, 30, "the collector subscribed on the broker")
        stream = post(
            f"{api}/api/v1/streams",
            {
                "name": STREAM,
                "lower": 0,
                "upper": 110,
                "epsilon": 1,
                "bucket_seconds": 60,
                "unit": "degF",  # what the demo prints, and the dashboard shows
                # The demo's devices read every second: the policy is raised knowingly
                # (the default allows 8 readings a day at epsilon 1; docs/privacy.md).
                "max_epsilon_per_day": 100_000,
            },
        )
        print(
            f"stream {STREAM}: epsilon 1 per reading, {stream['payload_bits']} bits per "
            f"reading on the wire (Abar = {stream['abar']:.4g})"
        )
        print(f"dashboard: {api}/   API docs: {api}/docs", flush=True)
        # The devices are given their server's key, as provisioned devices are: they use
        # only the configuration it signed (docs/edge-agent.md).
        key = get(f"{api}/api/v1/server")["key"]
        start(
            [
                sys.executable,
                "-m",
                "zeal_edge",
                "simulate",
                "--server-key",
                key,
                "--devices",
                str(DEVICES),
                "--source",
                f"csv:{DATA}",
                "--stream",
                STREAM,
                "--broker",
                broker,
                "--rate",
                str(RATE),
                "--batch",
                str(BATCH),
                "--data-dir",
                str(STATE / "fleet"),
                "--device-max-epsilon-per-day",
                "100000",
                "--log-level",
                "WARNING",
            ],
            log="fleet.log",
        )
        print(
            f"fleet: {DEVICES} devices replaying Seattle 2010 temperatures, {RATE} readings/s "
            "each; Ctrl-C stops everything"
        )
        with DATA.open() as handle:
            data = np.array([float(row["temp"]) for row in csv.DictReader(handle)])
        began = time.time()
        while True:
            time.sleep(5)  # why it sleeps: the demo prints the average every 5 seconds
            if any(child.poll() is not None for child in children):
                print("a demo process ended unexpectedly; see demo-data/*.log", file=sys.stderr)
                return 1
            average = get(f"{api}/api/v1/streams/{STREAM}/average")
            estimate = average["estimate"]
            if estimate is None:
                print(f"t={time.time() - began:4.0f}s  waiting for the first batches ...")
                continue
            devices = get(f"{api}/api/v1/streams/{STREAM}/devices?limit=1000")["devices"]
            tag_sites(api, devices)
            low, high = estimate["guaranteed"]
            print(
                f"t={time.time() - began:4.0f}s  readings {average['n']:>8,}  "
                f"served average {estimate['mean']:7.3f} degF  (guaranteed [{low:.2f}, "
                f"{high:.2f}])  true average {true_average(data, devices):7.3f} degF",
                flush=True,
            )
    except KeyboardInterrupt:
        print("\nstopping the demo ...", flush=True)
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up
        for child in reversed(children):
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if external is not None:
            withdraw_config(external)


def withdraw_config(url: str) -> None:
    """Clear the demo stream's retained configuration on a broker that outlives the demo."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    from zeal.mqtt.brokerurl import parse_broker_url
    from zeal.mqtt.topics import config_topic

    broker = parse_broker_url(url)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    try:
        client.connect(broker.host, broker.port)
        client.loop_start()
        client.publish(config_topic(STREAM), b"", qos=1, retain=True).wait_for_publish(5)
        client.disconnect()
        client.loop_stop()
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"could not withdraw the demo's configuration from {url}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
