"""Real processes for tests and benchmarks: `zeal-server serve` as a subprocess, the
deployment's broker, devices that publish, and the helpers that drive them.

tests/ and bench/ both import this (benchmarks never import the test suite)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.broker import (
    CERTIFICATE_ONLY,
    RETAIN_PLUGIN,
    BrokerTLS,
    Mosquitto,
    deploy_broker_config,
    fleet_command,
    free_port,
    wait_for_port,
)
from tools.testbed.wait import wait_until as wait_until  # the one wait (re-exported)
from zeal import Zeal, encode_batch
from zeal.mqtt.streamconfig import params_from_config

ROOT = Path(__file__).resolve().parents[2]


class Server:
    """`zeal-server serve` as a subprocess that can be killed and restarted."""

    def __init__(
        self,
        database_url: str | None,
        broker: Mosquitto,
        log: Path,
        *,
        collector_id: str | None = "crash-test",
        cwd: Path | None = None,
    ) -> None:
        """`database_url` and `collector_id` None: the server's defaults (in `cwd`)."""
        self.port = free_port()
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("ZEAL_DATABASE_URL", "ZEAL_COLLECTOR_ID", "ZEAL_DATA_DIR")
        }
        self.env.update({"ZEAL_MQTT_URL": broker.url, "PYTHONUNBUFFERED": "1"})
        # The streams of tests and benchmarks have a policy raised knowingly (stream_body):
        # their operator lifts the device cap across streams with it.
        self.env.setdefault("ZEAL_DEVICE_MAX_EPSILON_PER_DAY", RAISED_DEVICE_CAP)
        if database_url is not None:
            self.env["ZEAL_DATABASE_URL"] = database_url
        if collector_id is not None:
            self.env["ZEAL_COLLECTOR_ID"] = collector_id
        self.cwd = cwd
        self.log = log
        #: How the server is run (a test may run it through a wrapper script).
        self.launcher = [sys.executable, "-m", "zeal_server"]
        self.process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        #: The CA of its HTTPS certificate (use_https); None: plain HTTP.
        self.ca: Path | None = None
        self.http = self._client()

    def use_https(self, folder: Path) -> Server:
        """Serve HTTPS with the server certificate deploy/tls/make-certs made in `folder`
        (ZEAL_TLS_CERT, ZEAL_TLS_KEY), and ask it so, checking it with folder's CA."""
        self.env["ZEAL_TLS_CERT"] = str(folder / "server.crt")
        self.env["ZEAL_TLS_KEY"] = str(folder / "server.key")
        self.ca = folder / "ca.crt"
        self.http.close()
        self.http = self._client()
        return self

    def _client(self) -> httpx.Client:
        if self.ca is not None:
            return httpx.Client(
                base_url=f"https://127.0.0.1:{self.port}",
                timeout=10,
                verify=ssl.create_default_context(cafile=str(self.ca)),
            )
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def start(self, *, ready: bool = True) -> Server:
        """Start the server and wait until /healthz answers 200 (with `ready` false, until
        it answers at all: a server whose collector cannot do its work answers 503)."""
        self._release()
        self._output = self.log.open("ab")
        self.process = subprocess.Popen(
            [*self.launcher, "serve", "--port", str(self.port)],
            env=self.env,
            cwd=self.cwd,
            stdout=self._output,
            stderr=subprocess.STDOUT,
        )

        def up() -> bool:
            try:
                status = self.http.get("/healthz").status_code
            except httpx.TransportError:
                return False
            return status == 200 or not ready

        try:
            wait_until(up, 30, "the server's /healthz")
        except AssertionError:
            raise AssertionError(
                f"server did not come up:\n{self.log.read_text()[-3000:]}"
            ) from None
        return self

    def _release(self) -> None:
        """Close the log handle and the HTTP connections of the last run (a new client is
        ready for the next start)."""
        if self._output is not None:
            self._output.close()
            self._output = None
        self.http.close()
        self.http = self._client()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._release()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self._release()

    def stats(self) -> dict[str, int]:
        # Counts only: the efficiency figures are not needed for polling.
        stats = "/api/v1/streams/temps/stats?efficiency=false"
        body = self.http.get(stats).json()
        return {"messages": body["messages"], "readings": body["readings"]}


def start_fleet(
    broker: Mosquitto, tmp_path: Path, devices: int, readings: int, batch: int = 60
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        fleet_command(
            broker.url,
            tmp_path / "sim",
            *("--devices", str(devices), "--rate", "20", "--readings", str(readings)),
            *("--batch", str(batch), "--log-level", "WARNING"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(server: Server, expected: dict[str, int], timeout: float = 90) -> dict[str, int]:
    """The server's counts once they are `expected`, or the last seen after `timeout` s."""
    seen: dict[str, int] = {}

    def arrived() -> bool:
        nonlocal seen
        try:
            seen = server.stats()
        except httpx.TransportError:
            seen = {}
        return seen == expected

    with contextlib.suppress(AssertionError):
        wait_until(arrived, timeout, "the expected counts", every=0.25)
    return seen


def verify(database_url: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "zeal_server", "verify"],
        capture_output=True,
        text=True,
        env={**os.environ, "ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off"},
        check=False,
    )
    return result.stdout + result.stderr


#: The device cap across streams of the servers tests and benchmarks run (none: their
#: devices send many readings a day into streams whose policy is raised, stream_body).
RAISED_DEVICE_CAP = "none"


def stream_body(name: str = "temps", **extra: Any) -> dict[str, Any]:
    """A stream on 0-110 at epsilon 1 for tests and benchmarks whose devices send many
    readings a day: its operator raised the privacy policy (docs/privacy.md) to 1e6."""
    return {
        "name": name,
        "lower": 0,
        "upper": 110,
        "epsilon": 1,
        "max_epsilon_per_day": 1e6,
        **extra,
    }


def create_temps(server: Server) -> None:
    assert server.http.post("/api/v1/streams", json=stream_body()).status_code == 201


TOKEN = "operator-token-0123456789"
READ = "read-token-0123456789abc"
USERS = ("zeal-collector", "dev1", "evil")


class DeployBroker(Mosquitto):
    """deploy/mosquitto (its mosquitto.conf and acl, unchanged but for paths and port) with a
    password file holding `users` (password pw-USER; USERS by default), and the dynamic
    security plugin's file made by `mosquitto_ctrl dynsec init` with its admin zeal-admin
    (pw-zeal-admin). Its
    plugin deploy/mosquitto/plugin/zeal_retain.so is built here; `retain_plugin` False
    leaves it out (to measure what it prevents). With `tls` (BrokerTLS.make), its TLS
    listeners too, with deploy/mosquitto/reload-on-change running beside it as in the
    broker's image (ZEAL_RELOAD_EVERY 0.5 s)."""

    def __init__(
        self,
        directory: Path,
        *,
        retain_plugin: bool = True,
        users: tuple[str, ...] = USERS,
        tls: BrokerTLS | None = None,
    ) -> None:
        super().__init__(directory)
        self.tls = tls
        self.watcher: subprocess.Popen[bytes] | None = None
        conf = (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text()
        if not retain_plugin:
            line = f"plugin {RETAIN_PLUGIN}\n"
            assert line in conf
            conf = conf.replace(line, "").replace(f"{CERTIFICATE_ONLY}\n", "")
        self.config.write_text(deploy_broker_config(conf, self.port, directory, tls))
        for i, user in enumerate(users):
            subprocess.run(
                [
                    "mosquitto_passwd",
                    "-b",
                    *(["-c"] if i == 0 else []),
                    str(directory / "passwd"),
                    user,
                    f"pw-{user}",
                ],
                check=True,
            )
        (directory / "dynsec").mkdir()
        subprocess.run(
            [
                "mosquitto_ctrl",
                "dynsec",
                "init",
                str(directory / "dynsec" / "dynamic-security.json"),
                "zeal-admin",
                "pw-zeal-admin",
            ],
            check=True,
            capture_output=True,
        )

    def start(self) -> DeployBroker:
        super().start()
        if self.tls is not None and self.process is not None:
            wait_for_port(self.tls.tls_port)
            wait_for_port(self.tls.mtls_port)
            folder = self.tls.directory
            self.watcher = subprocess.Popen(
                [
                    "sh",
                    str(ROOT / "deploy" / "mosquitto" / "reload-on-change"),
                    str(self.process.pid),
                    *(str(folder / f) for f in RELOADED),
                ],
                env={**os.environ, "ZEAL_RELOAD_EVERY": "0.5"},
            )
        return self

    def stop(self) -> None:
        super().stop()
        if self.watcher is not None:
            self.watcher.wait(timeout=10)  # it ends when the broker does
            self.watcher = None


#: The files the broker's image reloads on (deploy/mosquitto/Dockerfile).
RELOADED = ("server.crt", "server.key", "devices-ca.crt", "crl/devices.crl")


def client(port: int, user: str | None, client_id: str = "", **connect: object) -> mqtt.Client:
    """A client of `user` (password pw-USER; its client id the login by default, as the
    deployment's broker requires), connected and looping."""
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id or (user or ""),
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    if user is not None:
        c.username_pw_set(user, f"pw-{user}")
    c.connect("127.0.0.1", port, **connect)  # type: ignore[arg-type]
    c.loop_start()
    return c


def batches(params: Zeal, stream: str, device: str, count: int, first: int = 0) -> list[bytes]:
    now = int(time.time() * 1000)
    rng = np.random.default_rng(first)
    return [
        encode_batch(
            params,
            stream=stream,
            device=device,
            sequence=first + i,
            timestamps=now + 1000 * np.arange(10),
            codes=params.perturb(np.full(10, 50.0), rng=rng),
        )
        for i in range(count)
    ]


def serve(database_url: str, broker: Mosquitto, tmp_path: Path, **env: str) -> Server:
    server = Server(database_url, broker, tmp_path / "server.log", collector_id="zs-hostile")
    server.env.update(env)
    return server


def serve_collector(broker: DeployBroker, tmp_path: Path) -> Server:
    """A running server (SQLite) whose collector logs in as zeal-collector."""
    return serve(
        f"sqlite:///{tmp_path / 'zeal.sqlite'}",
        broker,
        tmp_path,
        ZEAL_MQTT_USERNAME="zeal-collector",
        ZEAL_MQTT_PASSWORD="pw-zeal-collector",
    ).start()


def create(server: Server, name: str = "temps", **extra: Any) -> Zeal:
    body = stream_body(name, bucket_seconds=1, **extra)
    created = server.http.post("/api/v1/streams", json=body)
    assert created.status_code == 201, created.text
    config = server.http.get(f"/api/v1/streams/{name}/config").json()
    return params_from_config(json.dumps(config), stream=name)


def stats(server: Server, name: str = "temps", token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    got = server.http.get(f"/api/v1/streams/{name}/stats?efficiency=false", headers=headers)
    assert got.status_code == 200, got.text
    return got.json()


FLOOD = r"""
import sys, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
port, count = int(sys.argv[1]), int(sys.argv[2])
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="evil", protocol=MQTTProtocolVersion.MQTTv5)
c.username_pw_set("evil", "pw-evil")
c.max_inflight_messages_set(100)
c.connect("127.0.0.1", port)
c.loop_start()
pending = []
for i in range(count):
    name = f"{i:08d}" + "s" * 60_000
    pending.append(c.publish(f"zeal/v1/{name}/evil/up", b"\x20" * 20, qos=1))
    if len(pending) >= 100:
        for p in pending:
            p.wait_for_publish(30)
        pending = []
for p in pending:
    p.wait_for_publish(30)
c.disconnect()
print(count, flush=True)
"""
