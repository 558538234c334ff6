"""Real Mosquitto brokers and subscribers, for tests/ and bench/."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tools.testbed.wait import wait_until

#: Ports a test server may listen on: below Linux's ephemeral range (32768-60999), so no
#: outgoing connection of the busy machine can take one between its choice and its use (a
#: NATS node died so: "bind: address already in use").
LISTEN_PORTS = range(20_000, 32_768)


def free_port() -> int:
    """A port nothing listens on now, outside the range outgoing connections draw from."""
    for _ in range(1000):
        port = random.choice(LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def listening(port: int) -> bool:
    """Whether something accepts connections on the local `port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    try:
        wait_until(lambda: listening(port), timeout, f"port {port}", every=0.05)
    except AssertionError:
        raise TimeoutError(f"nothing listens on port {port}") from None


class Mosquitto:
    """A private mosquitto process on a free port, with persistence, restartable."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "mosquitto.conf"
        # Run as the test's own user: as root, mosquitto would otherwise switch to the
        # 'mosquitto' user, which cannot write its log and persistence here.
        self.config.write_text(
            f"user {getpass.getuser()}\n"
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {directory}/\n"
            "autosave_interval 1\n"
            "max_queued_messages 0\n"
            f"log_dest file {directory}/mosquitto.log\n"
        )

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        self.process = subprocess.Popen(
            ["mosquitto", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        return self

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log, for failure messages."""
        path = self.directory / "mosquitto.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


#: The topic of `Subscriber.settled`'s sentinel (under its filter, under no stream's name).
SENTINEL = "zeal/v1/_sentinel/_sentinel/up"


@dataclass
class Subscriber:
    """Collects every message on a filter, with a persistent session (survives restarts)."""

    port: int
    topic: str = "zeal/v1/+/+/up"
    messages: list[tuple[str, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"test-sub-{self.port}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.reconnect_delay_set(min_delay=1, max_delay=1)
        self.client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(self.topic, qos=1)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda _c, _u, _mid, _codes, _p: self.subscribed.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect_async(
            "127.0.0.1", self.port, keepalive=5, clean_start=False, properties=props
        )
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise TimeoutError(f"test subscriber could not subscribe on port {self.port}")

    def _on_message(
        self, _client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage
    ) -> None:
        if message.retain:
            return
        with self._lock:
            self.messages.append((message.topic, bytes(message.payload)))

    def snapshot(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return [m for m in self.messages if m[0] != SENTINEL]

    def settled(self, timeout: float = 30.0) -> list[tuple[str, bytes]]:
        """Every message the broker handled before this call, and nothing later: a sentinel
        published now reaches this one subscriber behind them (Mosquitto delivers a
        subscriber's QoS 1 messages in the order it handled them). An absence check waits
        for this event, never for a time: what has not come before the sentinel, from a
        publisher whose publishes were acknowledged before it, will not come."""
        token = os.urandom(8)
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        client.connect("127.0.0.1", self.port)
        client.loop_start()
        try:
            client.publish(SENTINEL, token, qos=1).wait_for_publish(timeout)
        finally:
            client.disconnect()
            client.loop_stop()
        wait_until(lambda: (SENTINEL, token) in self._all(), timeout, "the sentinel")
        got = self._all()
        return [m for m in got[: got.index((SENTINEL, token))] if m[0] != SENTINEL]

    def _all(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.messages)

    def wait_for(
        self, predicate: Callable[[list[tuple[str, bytes]]], object], timeout: float = 30.0
    ) -> list[tuple[str, bytes]]:
        """The messages so far once `predicate` holds of them, or after `timeout` seconds."""
        with contextlib.suppress(AssertionError):
            wait_until(lambda: predicate(self.snapshot()), timeout, "the messages", every=0.05)
        return self.snapshot()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publish_retained(port: int, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


SEATTLE = Path(__file__).resolve().parents[2] / "data" / "seattle-temps.csv"


def fleet_command(broker_url: str, data_dir: Path, *args: str, stream: str = "temps") -> list[str]:
    """`zeal-edge simulate` replaying the Seattle temperatures into a stream of a broker."""
    return [
        sys.executable,
        "-m",
        "zeal_edge",
        "simulate",
        "--source",
        f"csv:{SEATTLE}",
        "--stream",
        stream,
        "--broker",
        broker_url,
        "--data-dir",
        str(data_dir),
        *("--device-max-epsilon-per-day", "none"),  # as the tests' servers (raised policies)
        *args,
    ]


def seattle_rows(path: Path, n: int) -> Path:
    """A CSV at `path` with the header and the first n rows of the Seattle temperatures."""
    path.write_text("".join(SEATTLE.read_text().splitlines(keepends=True)[: n + 1]))
    return path


def run_agent(
    broker_url: str, data_dir: Path, device: str, source: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """`zeal-edge run` of stream temps to the end of a CSV (batches of 60, sent within a
    second), waited for; `env` is added to the environment."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "zeal_edge",
            "run",
            *("--stream", "temps", "--device", device, "--broker", broker_url),
            *("--data-dir", str(data_dir), "--source", f"csv:{source}"),
            *("--batch", "60", "--batch-seconds", "1", "--log-level", "INFO"),
            # The streams of tests and benchmarks have a policy raised knowingly (1e6), and
            # their servers no device cap (tools.testbed.server.RAISED_DEVICE_CAP).
            *("--max-epsilon-per-day", "1e6", "--device-max-epsilon-per-day", "none"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        check=False,
    )


class StdinAgent:
    """`zeal-edge run` of stream `stream` on the broker at `url` under the device's own
    login, fed a reading every 0.05 s on its standard input until ``end()``; its log in a
    file. Its exit status 0 says every batch it made was confirmed by the broker."""

    def __init__(
        self,
        url: str,
        tmp_path: Path,
        device: str,
        password: str,
        stream: str = "temps",
        *extra: str,
        username: str | None = None,
        server_key: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        """`server_key`: the key handed over with the login (else the suite's trust on first
        use, tests/conftest.py). `environment`: settings added to its environment (a
        login.env's, say)."""
        self.log = tmp_path / f"agent-{device}.log"
        self._output = self.log.open("w")
        env = {**os.environ, "ZEAL_MQTT_PASSWORD": password, **(environment or {})}
        if server_key is not None or "ZEAL_SERVER_KEY" in env:
            env.pop("ZEAL_TRUST_FIRST_USE", None)
        if server_key is not None:
            extra = (*extra, "--server-key", server_key)
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "zeal_edge", "run", "--stream", stream),
                *("--device", device, "--username", username or device, "--source", "stdin"),
                *("--broker", url, "--data-dir", str(tmp_path / f"edge-{device}")),
                *("--batch", "5", "--batch-seconds", "0.5", "--max-epsilon-per-day", "1e6"),
                *("--device-max-epsilon-per-day", "1e6"),  # the device's cap, raised with it
                *extra,
            ],
            stdin=subprocess.PIPE,
            stderr=self._output,
            text=True,
            env=env,
        )
        self.fed = 0
        self.feeding = threading.Event()
        self.feeding.set()
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        assert self.process.stdin is not None
        while not self._stop.wait(0.05):
            if not self.feeding.is_set():
                continue
            try:
                self.process.stdin.write("50\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):
                return  # the agent ended (its failure is the test's to report)
            self.fed += 1

    def end(self, timeout: float = 180) -> int:
        """Stop feeding, end its source; its exit status once all it read is confirmed."""
        self._stop.set()
        self._feeder.join()
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            return self.process.wait(timeout)
        finally:
            self._output.close()

    def said(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        self._stop.set()
        self.process.kill()
        self.process.wait(10)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self._output.close()


def agent_status_text(data_dir: Path, *extra: str) -> str:
    """`zeal-edge status` of an agent's data directory, as printed."""
    return subprocess.run(
        [sys.executable, "-m", "zeal_edge", "status", "--data-dir", str(data_dir), *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def agent_status(data_dir: Path) -> list[dict[str, object]]:
    """`zeal-edge status --json` of an agent's data directory."""
    records: list[dict[str, object]] = json.loads(agent_status_text(data_dir, "--json"))
    return records


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"
#: Where deploy/mosquitto/mosquitto.conf loads our plugin from (in the broker's image).
RETAIN_PLUGIN = "/mosquitto/plugins/zeal_retain.so"


def build_retain_plugin() -> Path:
    """deploy/mosquitto/plugin/zeal_retain.so, built with its Makefile (mosquitto-dev)."""
    folder = DEPLOY / "plugin"
    subprocess.run(["make", "-s", "-C", str(folder)], check=True, capture_output=True)
    return folder / "zeal_retain.so"


def dynsec_plugin() -> str:
    """Where Debian's mosquitto package put the dynamic security plugin (per architecture)."""
    found = sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))
    return str(found[0]) if found else "/usr/lib/mosquitto_dynamic_security.so"


@dataclass(frozen=True)
class BrokerTLS:
    """The TLS listeners of deploy/mosquitto's config for a private broker: the files
    deploy/tls/make-certs made in `directory`, and the loopback ports that stand for 8883
    (TLS, passwords) and 8884 (mutual TLS, certificates)."""

    directory: Path
    tls_port: int
    mtls_port: int

    @classmethod
    def make(cls, directory: Path) -> BrokerTLS:
        """deploy/tls/make-certs run in `directory` (localhost and 127.0.0.1), two free ports."""
        make_certs(directory)
        return cls(directory, free_port(), free_port())


def make_certs(directory: Path, *args: str) -> None:
    """deploy/tls/make-certs DIRECTORY ARGS (openssl)."""
    subprocess.run(
        ["sh", str(DEPLOY.parent / "tls" / "make-certs"), str(directory), *args],
        check=True,
        capture_output=True,
        env={**os.environ, "ZEAL_TLS_HOSTS": "localhost,127.0.0.1"},
    )


def served_serial(port: int, ca: Path, host: str = "localhost") -> int:
    """The serial number of the certificate a TLS port presents now (checked with `ca`)."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((host, port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=host) as wrapped,
    ):
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def certificate_serial(path: Path) -> int:
    """The serial number of a PEM certificate file."""
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


#: The TLS listeners of deploy/mosquitto/mosquitto.conf.
TLS_LISTENERS = ("listener 8883", "listener 8884")
#: Its line that keeps the collector's login off the password listeners.
CERTIFICATE_ONLY = "plugin_opt_certificate_only zeal-collector"


def deploy_broker_config(
    conf: str, port: int, directory: Path, tls: BrokerTLS | None = None
) -> str:
    """deploy/mosquitto's mosquitto.conf text for a private broker: its plain listener on
    `port` (loopback), password file, dynamic security file (dynsec/ in it: made with
    `mosquitto_ctrl dynsec init` where a test needs an admin), persistence and log in
    `directory`, the deploy ACL, Debian's plugin path, our plugin built here (when the
    text loads it), run as the test's user. With `tls`, its TLS listeners on tls's ports
    with tls's files; without, no TLS listener, and the collector's login may use its
    password on the plain listener (as tests of everything but TLS log in). Everything
    else is the deployment's own."""
    if RETAIN_PLUGIN in conf:
        conf = conf.replace(RETAIN_PLUGIN, str(build_retain_plugin()))
    if tls is None:
        conf = _without_tls(conf)
    else:
        conf = (
            conf.replace("listener 8883", f"listener {tls.tls_port} 127.0.0.1")
            .replace("listener 8884", f"listener {tls.mtls_port} 127.0.0.1")
            .replace("/mosquitto/tls/", f"{tls.directory}/")
        )
    conf = (
        conf.replace("listener 1883", f"listener {port} 127.0.0.1")
        .replace("/usr/lib/mosquitto_dynamic_security.so", dynsec_plugin())
        .replace("/mosquitto/dynsec/", f"{directory}/dynsec/")
        .replace("/mosquitto/config/passwd", str(directory / "passwd"))
        .replace("/mosquitto/config/acl", str(DEPLOY / "acl"))
        .replace("/mosquitto/data/", f"{directory}/")
        .replace("log_dest stdout", f"log_dest file {directory}/mosquitto.log")
    )
    return f"user {getpass.getuser()}\n{conf}"


def _without_tls(conf: str) -> str:
    """The config without its TLS listeners (each line from `listener 888x` to the next
    blank one) and without the collector's certificate-only line."""
    assert all(f"\n{listener}\n" in conf for listener in TLS_LISTENERS)
    kept: list[str] = []
    skipping = False
    for line in conf.splitlines():
        if line.strip() in TLS_LISTENERS:
            skipping = True
        elif skipping and not line.strip():
            skipping = False
        if not skipping and line.strip() != CERTIFICATE_ONLY:
            kept.append(line)
    return "\n".join(kept) + "\n"
