"""The Compose stack built and run: deploy/README.md's path followed as written (secrets,
password file, `mosquitto_ctrl dynsec init`, `up -d --build`, a stream, a device), on
Docker where a daemon answers and else on Podman (tools.testbed.containers), then:
provisioned agents stored and served exactly, a device login's attacks, restarts of every
service while agents send, the monitoring and cluster profiles, and an upgrade.

Serial: it builds five images and runs a dozen containers. The stack's ports are published
on free ports (ZEAL_PUBLISH_*), so services of the host (its Mosquitto on 1883) stay up."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.broker import StdinAgent, certificate_serial, free_port, served_serial
from tools.testbed.containers import Engine, engine
from tools.testbed.nats import nats_server
from tools.testbed.relay import Relay
from tools.testbed.server import batches, wait_until
from zeal import Zeal
from zeal.mqtt.streamconfig import params_from_config

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: The release the upgrade starts from: the last one before migration 0011 (signing keys,
#: transports), so the rebuilt server must migrate a populated database at start.
UPGRADE_FROM = "b35d8a7^"
#: Where a Debian host keeps the CA certificates it added (a TLS-intercepting proxy's).
HOST_CAS = Path("/usr/local/share/ca-certificates")
SECRETS = ("deploy/.env", "deploy/mosquitto/passwd", "deploy/mosquitto/dynsec")


def readme_block() -> str:
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text.split("## From nothing to a running stack", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]


def stage(directory: Path, sources: Path = ROOT) -> Path:
    """The repository's files as a fresh clone has them, without the operator's secrets;
    the host's added CA certificates in deploy/ca (README: behind a TLS proxy)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=sources,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for relative in listed:
        if relative.startswith(SECRETS) or relative.endswith(".crt"):
            continue
        source = sources / relative
        if source.is_file():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for cert in sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []:
        shutil.copy(cert, directory / "deploy" / "ca" / cert.name)
    return directory


def _health_checks(engine_: Engine, stop: threading.Event) -> None:
    """Podman runs health checks from systemd timers; with no systemd (a container, CI)
    nothing runs them, and `depends_on: service_healthy` would wait for ever. This stands
    in for the timer: every 2 s, each running Compose container's check, once."""
    while not stop.wait(2):
        with contextlib.suppress(Exception):
            names = engine_.run(
                *("ps", "--filter", "label=com.docker.compose.project"),
                *("--format", "{{.Names}}"),
                timeout=30,
            ).split()
            for name in names:
                subprocess.run(
                    ["podman", "healthcheck", "run", name],
                    capture_output=True,
                    timeout=30,
                    check=False,
                )


@dataclass
class Stack:
    directory: Path
    engine: Engine
    env: dict[str, str]
    ports: dict[str, int]
    figures: dict[str, Any] = field(default_factory=dict)
    #: https (the stack as deployed), or http for a server of a release before it
    scheme: str = "https"

    def compose(self, *args: str, timeout: float = 900, directory: Path | None = None) -> str:
        done = subprocess.run(
            ["docker-compose", *args],
            cwd=directory or self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stderr[-4000:]}"
        return done.stdout

    def zeal_server(self, *args: str) -> str:
        return self.compose("exec", "-T", "server", "zeal-server", *args, timeout=120)

    def provision(self, device: str) -> str:
        said = self.zeal_server("devices", "provision", device)
        found = re.search(r"^password: (\S+)$", said, flags=re.M)
        assert found, said
        return found.group(1)

    @property
    def ca(self) -> Path:
        """The stack's CA certificate (deploy/tls/make-certs), as devices are given it."""
        return self.directory / "deploy" / "tls" / "ca.crt"

    def certificate(self, device: str, folder: Path) -> tuple[Path, Path]:
        """A device provisioned with a certificate the recommended way: its key and request
        made on the device (openssl), the request given to `devices provision --csr -`, the
        certificate it prints saved beside the key. Returns (certificate, key)."""
        folder.mkdir(parents=True, exist_ok=True)
        key, csr = folder / f"{device}.key", folder / f"{device}.csr"
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(key), "-subj", f"/CN={device}", "-out", str(csr)],
            check=True, capture_output=True,
        )  # fmt: skip
        done = subprocess.run(
            ["docker-compose", "exec", "-T", "server", "zeal-server", "devices", "provision",
             device, "--csr", "-"],
            cwd=self.directory, env=self.env, input=csr.read_text(), capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "PRIVATE KEY" not in done.stdout
        pem = re.search(
            r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", done.stdout, re.S
        )
        assert pem, done.stdout
        certificate = folder / f"{device}.crt"
        certificate.write_text(pem.group(0))
        return certificate, key

    def agent(self, tmp_path: Path, device: str, stream: str) -> StdinAgent:
        """The device's agent over TLS: a password login on the published 8883, or (when
        `certificates` holds the device's) its certificate on 8884."""
        key = self.figures["server_key"]
        ca = ("--ca", str(self.ca))
        if device in self.figures.get("certificates", {}):
            cert, private = self.figures["certificates"][device]
            url = f"mqtts://localhost:{self.ports['MQTT_CERT']}"
            own = ("--cert", str(cert), "--key", str(private))
            return StdinAgent(url, tmp_path, device, "", stream, *ca, *own, server_key=key)
        return StdinAgent(self.mqtt_url, tmp_path, device, self.figures[device], stream, *ca,
                          server_key=key)  # fmt: skip

    @property
    def settings(self) -> dict[str, str]:
        lines = (self.directory / "deploy" / ".env").read_text().splitlines()
        return dict(
            line.split("=", 1) for line in lines if "=" in line and not line.startswith("#")
        )

    def http(self) -> httpx.Client:
        token = self.settings["ZEAL_READ_TOKEN"]
        return httpx.Client(
            base_url=f"{self.scheme}://localhost:{self.ports['HTTPS']}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=ssl.create_default_context(cafile=str(self.ca))
            if self.scheme == "https"
            else True,
        )

    @property
    def mqtt_url(self) -> str:
        return f"mqtts://localhost:{self.ports['MQTT']}"

    def ready(self, timeout: float = 300) -> None:
        def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError), self.http() as http:
                return http.get("/readyz").status_code == 200
            return False

        wait_until(answers, timeout, "the server ready")

    def readings(self, stream: str) -> int:
        with self.http() as http:
            answer = http.get(f"/api/v1/streams/{stream}/stats", params={"efficiency": "false"})
        assert answer.status_code == 200, answer.text
        return int(answer.json()["readings"])

    def health(self, service: str, *options: str) -> str:
        """What the engine's health check says of the service's (first) container."""
        container = self.compose(*options, "ps", "-q", service).split()[0]
        return self.engine.run("inspect", "--format", "{{.State.Health.Status}}", container).strip()

    def broker_rss_mb(self) -> float:
        status = self.compose("exec", "-T", "mosquitto", "cat", "/proc/1/status", timeout=60)
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.M)
        assert found, status
        return int(found.group(1)) / 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """deploy/README.md's block run as written, in one shell, in a staged copy; the
    stack left running for the tests of this module, and taken down with its volumes."""
    base = tmp_path_factory.mktemp("stack")
    project = f"zealstack{os.getpid()}"
    ports = {
        name: free_port()
        for name in ("MQTT", "MQTT_CERT", "HTTPS", "PROMETHEUS", "NATS1", "NATS2", "NATS3")
    }
    with engine(base) as engine_:
        env = {
            **{k: v for k, v in engine_.env.items() if not k.startswith(("ZEAL_", "POSTGRES_"))},
            **{f"ZEAL_PUBLISH_{name}": str(port) for name, port in ports.items()},
            "COMPOSE_PROJECT_NAME": project,
        }
        stack_ = Stack(stage(base / "zeal"), engine_, env, ports)
        stop = threading.Event()
        checker = None
        if engine_.cli == "podman":
            checker = threading.Thread(target=_health_checks, args=(engine_, stop), daemon=True)
            checker.start()
        try:
            started = time.monotonic()
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", readme_block()],
                cwd=stack_.directory,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            stack_.figures["readme_seconds"] = round(time.monotonic() - started)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
            found = re.search(r"^password: (\S+)$", done.stdout, flags=re.M)
            assert found, done.stdout
            stack_.figures["kitchen-1"] = found.group(1)
            key = re.search(r"^server key: (\S+)$", done.stdout, flags=re.M)
            assert key, done.stdout  # handed over with the login, as the README says
            stack_.figures["server_key"] = key.group(1)
            images = {
                service: engine_.image_bytes(f"zeal/{service}:local") / 1e6
                for service in ("server", "mosquitto", "postgres")
            }
            print(f"README block: {stack_.figures['readme_seconds']} s; images (MB): {images}")
            yield stack_
        finally:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                logs = stack_.compose("logs", "--no-color", "--tail=200", timeout=120)
                (base / "compose.log").write_text(logs)
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                stack_.compose(
                    *("--profile", "cluster", "--profile", "monitoring"),
                    *("down", "--volumes", "--remove-orphans"),
                    timeout=600,
                )
            stop.set()
            if checker is not None:
                checker.join(60)


def version(said: str) -> str:
    found = re.search(r"\bv?(\d+\.\d+\.\d+)", said)
    assert found, said
    return found.group(1)


def host_version(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return version(done.stdout + done.stderr)


def test_the_broker_and_database_images_run_the_versions_the_tests_run(stack: Stack) -> None:
    """The broker in its image is the mosquitto the other tests run (Debian's), with both
    plugins loaded; PostgreSQL is Debian's; the containers run unprivileged."""
    said = stack.compose("exec", "-T", "mosquitto", "sh", "-c", "mosquitto -h; true")
    assert version(said) == host_version("mosquitto", "-h")
    maps = stack.compose("exec", "-T", "mosquitto", "cat", "/proc/1/maps")
    assert "/mosquitto/plugins/zeal_retain.so" in maps
    assert "mosquitto_dynamic_security.so" in maps
    postgres = stack.compose("exec", "-T", "postgres", "postgres", "--version")
    for service in ("postgres", "server"):
        wait_until(lambda s=service: stack.health(s) == "healthy", 120, f"{service} healthy")
    for service in ("mosquitto", "postgres", "server"):
        assert stack.compose("exec", "-T", service, "id", "-u").strip() != "0", service
    print(f"broker {version(said)}, {postgres.strip()}")


def create_load_stream(stack: Stack, name: str, devices: tuple[str, ...] = ()) -> None:
    """A stream whose operator raised the privacy policy knowingly (many readings a day),
    and the caps across streams of `devices` with it (the stack keeps the default, 8)."""
    stack.zeal_server(
        *("streams", "create", name, "--lower", "0", "--upper", "110", "--epsilon", "1"),
        *("--bucket-seconds", "1", "--max-epsilon-per-day", "1000000"),
    )
    for device in devices:
        stack.zeal_server("policy", "device", device, "1000000")


def test_provisioned_agents_are_stored_and_served_exactly(stack: Stack, tmp_path: Path) -> None:
    """Two real `zeal-edge` agents over TLS, kitchen-1 with the README's password login on
    8883, kitchen-2 with a certificate made from its own request on 8884 (mutual TLS),
    each read 100 readings and exit 0 (all confirmed): the stack stores every one, and its
    average is, to the last bit, the library's estimate over the codes behind the
    stream's /export."""
    create_load_stream(stack, "kitchens", ("kitchen-1", "kitchen-2"))
    stack.figures["certificates"] = {
        "kitchen-2": stack.certificate("kitchen-2", stack.directory.parent / "devices")
    }
    agents = [stack.agent(tmp_path, device, "kitchens") for device in ("kitchen-1", "kitchen-2")]
    try:
        wait_until(lambda: min(a.fed for a in agents) >= 100, 120, "100 readings each")
        codes = [agent.end() for agent in agents]
        assert codes == [0, 0], [agent.said()[-2000:] for agent in agents]
        fed = sum(agent.fed for agent in agents)
        wait_until(lambda: stack.readings("kitchens") == fed, 120, f"{fed} readings stored")
    finally:
        for agent in agents:
            agent.kill()
    with stack.http() as http:
        config = http.get("/api/v1/streams/kitchens/config").text
        average = http.get("/api/v1/streams/kitchens/average").json()
        exported = http.get("/api/v1/streams/kitchens/export").text
    params = params_from_config(config, stream="kitchens")
    estimates = np.array([float(r["estimate"]) for r in csv.DictReader(io.StringIO(exported))])
    codes_ = codes_of(params, estimates)
    assert np.array_equal(params.decode(codes_), estimates)  # the export is the codes
    library = params.estimate_mean(codes_)
    print(f"agents: {fed} readings read, {average['n']} stored; mean {average['estimate']}")
    assert average["n"] == fed == len(estimates)
    assert average["estimate"]["mean"] == library.mean
    assert average["estimate"]["std_error"] == pytest.approx(library.std_error, rel=1e-12)


def test_a_fleet_provisioned_from_a_list_as_deploy_readme_says(
    stack: Stack, tmp_path: Path
) -> None:
    """deploy/README.md's line for a fleet from a list, run as written: three devices'
    folders come out of the server's container as logins/ (none left in it), each readable
    by its owner only, and an agent run with a folder's login.env stores every reading."""
    line = next(
        ln.strip()
        for ln in (stack.directory / "deploy" / "README.md").read_text().splitlines()
        if "devices provision --from -" in ln
    )
    names = ("fleet-a", "fleet-b", "fleet-c")
    create_load_stream(stack, "listed", names)
    (stack.directory / "fleet.txt").write_text("\n".join(names) + "\n")
    done = subprocess.run(["sh", "-c", line], cwd=stack.directory, env=stack.env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "provisioned 3 device(s)" in done.stderr, done.stderr
    logins = stack.directory / "logins"
    assert sorted(p.name for p in logins.iterdir()) == ["fleet-a", "fleet-b", "fleet-c",
                                                        "logins.csv"]  # fmt: skip
    assert (logins / "fleet-b" / "login.env").stat().st_mode & 0o777 == 0o600
    left = stack.compose("exec", "-T", "server", "sh", "-c", "ls /tmp")
    assert "logins" not in left.split(), left
    environment = {}
    for setting in (logins / "fleet-b" / "login.env").read_text().splitlines():
        if setting and not setting.startswith("#"):
            key, _, value = setting.partition("=")
            environment[key] = value
    assert environment["ZEAL_SERVER_KEY"] == stack.figures["server_key"]
    agent = StdinAgent(stack.mqtt_url, tmp_path, "fleet-b", "", "listed", "--ca", str(stack.ca),
                       environment=environment)  # fmt: skip
    try:
        wait_until(lambda: stack.readings("listed") >= 30, 120, "fleet-b's readings")
        assert agent.end() == 0, agent.said()[-2000:]
        wait_until(lambda: stack.readings("listed") == agent.fed, 120, "every reading stored")
    finally:
        agent.kill()
    print(f"a fleet from a list: 3 folders out, fleet-b stored {agent.fed} readings")


def codes_of(params: Zeal, estimates: np.ndarray) -> np.ndarray:
    """The codes whose decoded values are `estimates` (Zeal.decode inverted)."""
    highest = (1 << params.payload_bits) - 2
    depth = np.rint((params.ebar + params.C - estimates) / params.grid_step).astype(np.int64)
    return (highest - depth).astype(np.uint64)


def _client(stack: Stack, user: str, password: str | None, client_id: str) -> mqtt.Client:
    """A client of `user` over TLS: its password on 8883, or (None) its certificate on
    8884."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    if password is not None:
        client.username_pw_set(user, password)
    cert = stack.figures["certificates"][user] if password is None else (None, None)
    client.tls_set(ca_certs=str(stack.ca), certfile=cert[0], keyfile=cert[1])
    port = stack.ports["MQTT" if password is not None else "MQTT_CERT"]
    answered = threading.Event()
    accepted: list[bool] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: (
        accepted.append(not reason.is_failure),
        answered.set(),
    )
    client.on_disconnect = lambda *_: answered.set()  # refused before any CONNACK
    try:
        client.connect("localhost", port)
    except OSError as exc:
        raise AssertionError(f"{user} could not connect: {exc}") from None
    client.loop_start()
    if not answered.wait(30) or accepted != [True]:
        client.loop_stop()
        raise AssertionError(f"{user} could not connect")
    return client


def first_answer(port: int, request: bytes) -> bytes:
    """What a published port answers a request sent in clear (empty: it closed)."""
    with socket.create_connection(("localhost", port), timeout=30) as plain:
        plain.sendall(request)
        with contextlib.suppress(OSError):
            return plain.recv(64)
    return b""


#: An MQTT 3.1.1 CONNECT of client "ab", and a plain HTTP request.
PLAIN_CONNECT = b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x0a\x00\x02ab"
PLAIN_GET = b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n"


def test_nothing_crosses_a_published_port_in_clear(stack: Stack, tmp_path: Path) -> None:
    """Plain MQTT to the published broker ports and plain HTTP to the published API port
    get no answer of the broker or the API. A TCP relay between kitchen-1's agent and the
    broker records its whole session: neither its password, nor its login, nor a data
    topic in it; the same for an HTTPS request with the operator token. The collector's
    password and client id (deploy/.env) open nothing. A certificate device revoked is
    refused from its next connection (the server's list, the broker's image reloading)."""
    for port in (stack.ports["MQTT"], stack.ports["MQTT_CERT"]):
        answer = first_answer(port, PLAIN_CONNECT)
        assert not answer.startswith(b"\x20"), answer  # no CONNACK
    answer = first_answer(stack.ports["HTTPS"], PLAIN_GET)
    assert not answer.startswith(b"HTTP/"), answer

    create_load_stream(stack, "relayed", ("kitchen-1",))
    relay = Relay("127.0.0.1", stack.ports["MQTT"])
    agent = StdinAgent(f"mqtts://localhost:{relay.port}", tmp_path, "kitchen-1",
                       stack.figures["kitchen-1"], "relayed", "--ca", str(stack.ca),
                       server_key=stack.figures["server_key"])  # fmt: skip
    try:
        wait_until(lambda: stack.readings("relayed") >= 20, 120, "readings through the relay")
        assert agent.end() == 0, agent.said()[-2000:]
        wait_until(lambda: stack.readings("relayed") == agent.fed, 120, "every reading")
    finally:
        agent.kill()
        relay.close()
    secrets = (stack.figures["kitchen-1"].encode(), b"kitchen-1", b"zeal/v1/relayed")
    assert relay.seen[:1] == b"\x16"
    assert not any(secret in relay.seen for secret in secrets)
    token = stack.settings["ZEAL_OPERATOR_TOKEN"]
    relay = Relay("127.0.0.1", stack.ports["HTTPS"])
    try:
        with httpx.Client(
            verify=ssl.create_default_context(cafile=str(stack.ca)), timeout=30
        ) as http:
            answer = http.get(  # the device logins: the operator token's alone
                f"https://localhost:{relay.port}/api/v1/devices",
                headers={"Authorization": f"Bearer {token}"},
            )
        assert answer.status_code == 200, answer.text
        assert "kitchen-1" in answer.json()
    finally:
        relay.close()
    assert relay.seen[:1] == b"\x16"
    assert token.encode() not in relay.seen
    assert b"/api/v1/devices" not in relay.seen
    print(f"relayed: MQTT session {len(secrets)} secrets absent, {agent.fed} readings stored")

    collector = (stack.settings["ZEAL_MQTT_USERNAME"], stack.settings["ZEAL_MQTT_PASSWORD"])
    refused = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=collector[0],
                          protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
    refused.username_pw_set(*collector)
    refused.tls_set(ca_certs=str(stack.ca))
    codes: list[int] = []
    refused.on_connect = lambda _c, _u, _f, reason, _p: codes.append(reason.value)
    refused.connect("localhost", stack.ports["MQTT"])
    refused.loop_start()
    try:
        wait_until(lambda: codes, 30, "the broker's answer to the collector's password")
    finally:
        refused.disconnect()
        refused.loop_stop()
    assert codes == [135], codes  # not authorized: certificate only

    folder = stack.directory.parent / "devices"
    stack.figures["certificates"]["kitchen-3"] = stack.certificate("kitchen-3", folder)
    device = _client(stack, "kitchen-3", None, "kitchen-3")
    device.disconnect()
    device.loop_stop()
    said = stack.zeal_server("devices", "revoke", "kitchen-3")
    assert "the broker refuses them already" in said, said
    with pytest.raises(AssertionError):
        _client(stack, "kitchen-3", None, "kitchen-3")
    print("kitchen-3 revoked: refused at its next connection")


def test_a_device_login_cannot_fill_the_broker_nor_read_other_devices(
    stack: Stack, tmp_path: Path
) -> None:
    """kitchen-1's login subscribes to `#` and `$SYS/#` while kitchen-2 sends: it gets
    nothing of kitchen-2 (nor of the broker). It then leaves 300 retained 100 KB presences
    under invented streams: the broker's memory grows by at most 20 MB (the zeal_retain
    plugin refuses them; without it, the broker holds 30 MB and more, and without the
    plugin in the image the broker does not start at all)."""
    password = stack.figures["kitchen-1"]
    heard: list[str] = []
    spy = _client(stack, "kitchen-1", password, "kitchen-1:spy")
    spy.on_message = lambda _c, _u, message: heard.append(message.topic)
    spy.subscribe([("#", 1), ("$SYS/#", 1)])
    before = stack.readings("kitchens")
    publisher = _client(stack, "kitchen-2", None, "kitchen-2")  # its certificate
    params = kitchens_params(stack)
    for payload in batches(params, "kitchens", "kitchen-2", 20, first=10_000):
        publisher.publish("zeal/v1/kitchens/kitchen-2/up", payload, qos=1).wait_for_publish(30)
    publisher.disconnect()
    publisher.loop_stop()
    wait_until(lambda: stack.readings("kitchens") >= before + 200, 60, "kitchen-2's batches")
    foreign = [t for t in heard if "kitchen-2" in t or t.startswith("$SYS")]
    print(f"a device login subscribed to # and $SYS/#: {len(heard)} messages, foreign {foreign}")
    assert foreign == []

    rss = stack.broker_rss_mb()
    filler = _client(stack, "kitchen-1", password, "kitchen-1:fill")
    blob = os.urandom(100_000)
    for i in range(300):
        filler.publish(f"zeal/v1/invented{i}/kitchen-1/presence", blob, qos=1, retain=True)
    # A last message through the same connection: the 300 before it have been handled.
    filler.publish("zeal/v1/kitchens/kitchen-1/presence", b"{}", qos=1).wait_for_publish(120)
    filler.disconnect()
    filler.loop_stop()
    spy.disconnect()
    spy.loop_stop()
    grown = stack.broker_rss_mb() - rss
    stack.figures["broker_growth_mb"] = round(grown, 1)
    print(f"300 retained 100 KB presences under invented streams: broker +{grown:.1f} MB")
    assert grown <= 20


def kitchens_params(stack: Stack) -> Zeal:
    with stack.http() as http:
        return params_from_config(
            http.get("/api/v1/streams/kitchens/config").text, stream="kitchens"
        )


def test_restarts_of_every_service_and_down_up_lose_no_acknowledged_reading(
    stack: Stack, tmp_path: Path
) -> None:
    """Two agents (a password, a certificate) send all along while the server certificate
    is renewed (deploy/README.md: `make-certs renew`, the broker reloads by itself), then
    the broker, the server and PostgreSQL are each restarted (`docker-compose restart`:
    every client connects again, to the renewed certificate), then the stack goes `down`
    and `up` again (its volumes kept): ingest resumes after each, the agents exit 0 (every
    batch confirmed by the broker), and every reading they read is stored once."""
    create_load_stream(stack, "restarts", ("kitchen-1", "kitchen-2"))
    agents = [stack.agent(tmp_path, device, "restarts") for device in ("kitchen-1", "kitchen-2")]
    steps: list[str] = []

    def resumed(after: str) -> None:
        stack.ready()
        mark = stack.readings("restarts")
        wait_until(lambda: stack.readings("restarts") >= mark + 40, 300, f"ingest after {after}")
        fed = sum(agent.fed for agent in agents)
        steps.append(f"{after}: {fed} read, {stack.readings('restarts')} stored")

    try:
        resumed("start")
        tls = stack.directory / "deploy" / "tls"
        old = served_serial(stack.ports["MQTT"], stack.ca)
        subprocess.run(["sh", str(tls / "make-certs"), str(tls), "renew"], check=True)
        new = certificate_serial(tls / "server.crt")
        assert new != old
        for port in (stack.ports["MQTT"], stack.ports["MQTT_CERT"]):
            wait_until(lambda p=port: served_serial(p, stack.ca) == new, 60, "the renewed cert")
        resumed("renewal")
        for service in ("mosquitto", "server", "postgres"):
            stack.compose("restart", service, timeout=300)
            resumed(f"restart {service}")
        stack.compose("down", timeout=300)
        stack.compose("up", "-d", timeout=600)
        resumed("down and up")
        codes = [agent.end() for agent in agents]
        fed = sum(agent.fed for agent in agents)
        with contextlib.suppress(AssertionError):  # said below, with the figures
            wait_until(lambda: stack.readings("restarts") == fed, 120, "every reading stored")
        stored = stack.readings("restarts")
        print("restarts:", "; ".join(steps), f"; end: {fed} read, {stored} stored")
        assert codes == [0, 0], [agent.said()[-2000:] for agent in agents]
        assert stored == fed
        with stack.http() as http:
            assert http.get("/api/v1/streams/restarts/average").json()["n"] == fed
    finally:
        for agent in agents:
            agent.kill()


def test_monitoring_profile_scrapes_the_server_and_loads_the_alert_rules(stack: Stack) -> None:
    """Prometheus of the monitoring profile (Grafana, the one upstream image, is not
    started): it scrapes the server with the read token (a real query answers the stored
    readings), its four alert rules load, and promtool in its image checks and tests them."""
    stack.compose("--profile", "monitoring", "up", "-d", "--build", "prometheus")
    said = stack.compose("exec", "-T", "prometheus", "prometheus", "--version")
    wait_until(
        lambda: stack.health("prometheus", "--profile", "monitoring") == "healthy",
        120,
        "Prometheus healthy",
    )
    assert version(said) == host_version("prometheus", "--version")
    stored = stack.readings("kitchens")
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.ports['PROMETHEUS']}") as prometheus:

        def scraped() -> bool:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                result = prometheus.get(
                    "/api/v1/query",
                    params={"query": 'zeal_stream_readings_total{stream="kitchens"}'},
                ).json()["data"]["result"]
                return bool(result) and float(result[0]["value"][1]) == stored
            return False

        wait_until(scraped, 180, "Prometheus's scrape of the stored readings")
        up = prometheus.get("/api/v1/query", params={"query": 'up{job="zeal"}'}).json()
        assert [r["value"][1] for r in up["data"]["result"]] == ["1"]
        groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = {r["name"]: r["health"] for g in groups for r in g["rules"]}
    assert set(rules) == {
        "ZealCollectorDown",
        "ZealCommitLag",
        "ZealRejectsRising",
        "ZealDeviceSilent",
    }
    assert "err" not in rules.values(), rules
    checked = stack.compose(
        "exec", "-T", "prometheus", "promtool", "check", "rules", "/etc/prometheus/alerts.yml"
    )
    assert "SUCCESS: 4 rules found" in checked
    tested = stack.compose(
        *("exec", "-T", "--workdir", "/etc/prometheus", "prometheus"),
        *("promtool", "test", "rules", "alerts.test.yml"),
    )
    assert "SUCCESS" in tested
    size = stack.engine.image_bytes("zeal/prometheus:local") / 1e6
    print(f"monitoring: Prometheus scraped {stored} readings; rules {sorted(rules)}; {size:.0f} MB")


def test_the_cluster_profile_loses_nothing_when_a_node_is_killed(
    stack: Stack, tmp_path: Path
) -> None:
    """deploy/SCALING.md's cluster: three NATS nodes and two collectors (`--scale
    collector=2`, MQTT over TLS to the nodes) on the stack's database. A device (MQTT
    3.1.1 over TLS, its NATS login) sends through node 1 while node 2 is killed and started
    again: the agent exits 0, and every reading it read is stored once. Plain MQTT to a
    node's published port gets no CONNACK; a renewed certificate is served after a SIGHUP."""
    create_load_stream(stack, "cluster", ("dev1",))
    users = stack.directory / "deploy" / "nats" / "users.conf"
    device_password = os.urandom(12).hex()
    users.write_text(
        (stack.directory / "deploy" / "nats" / "users.conf.example")
        .read_text()
        .replace("change-me-collector", stack.settings["ZEAL_MQTT_PASSWORD"])
        .replace("change-me-dev1", device_password)
    )
    stack.compose("--profile", "cluster", "up", "-d", "--build", "--scale", "collector=2")

    def pulling() -> bool:
        said = stack.compose("--profile", "cluster", "logs", "--no-color", "collector")
        return said.count("pulls from JetStream") >= 2

    wait_until(pulling, 180, "two collectors pulling from JetStream")
    said = stack.compose("--profile", "cluster", "exec", "-T", "nats1", "nats-server", "--version")
    assert version(said) == host_version(nats_server(), "--version")
    print(f"nats image: {stack.engine.image_bytes('zeal/nats:local') / 1e6:.0f} MB")
    wait_until(
        lambda: stack.health("nats1", "--profile", "cluster") == "healthy",
        120,
        "NATS node 1 healthy",
    )
    for node in ("NATS1", "NATS2", "NATS3"):
        answer = first_answer(stack.ports[node], PLAIN_CONNECT)
        assert not answer.startswith(b"\x20"), (node, answer)  # no CONNACK in clear
    agent = StdinAgent(
        f"mqtts://localhost:{stack.ports['NATS1']}",
        tmp_path,
        "dev1",
        device_password,
        "cluster",
        *("--protocol", "3.1.1", "--ca", str(stack.ca)),
        server_key=stack.figures["server_key"],
    )
    try:
        wait_until(lambda: stack.readings("cluster") >= 40, 180, "readings through the cluster")
        stack.compose("--profile", "cluster", "kill", "nats2", timeout=120)
        mark = stack.readings("cluster")
        wait_until(lambda: stack.readings("cluster") >= mark + 40, 180, "ingest on two nodes")
        stack.compose("--profile", "cluster", "start", "nats2", timeout=120)
        mark = stack.readings("cluster")
        wait_until(lambda: stack.readings("cluster") >= mark + 40, 180, "ingest on three")
        code = agent.end()
        fed = agent.fed
        with contextlib.suppress(AssertionError):
            wait_until(lambda: stack.readings("cluster") == fed, 180, "every reading stored")
        stored = stack.readings("cluster")
        print(f"cluster, node 2 killed and back: {fed} read, {stored} stored")
        assert code == 0, agent.said()[-2000:]
        assert stored == fed
        # A renewed certificate (deploy/SCALING.md): each node serves it after a SIGHUP.
        tls = stack.directory / "deploy" / "tls"
        old = served_serial(stack.ports["NATS1"], stack.ca)
        subprocess.run(["sh", str(tls / "make-certs"), str(tls), "renew"], check=True)
        new = certificate_serial(tls / "server.crt")
        assert new != old
        stack.compose("--profile", "cluster", "kill", "-s", "HUP", "nats1", "nats2", "nats3")
        for node in ("NATS1", "NATS2", "NATS3"):
            renewed = lambda p=stack.ports[node]: served_serial(p, stack.ca) == new  # noqa: E731
            wait_until(renewed, 60, f"{node}'s renewed certificate")
    finally:
        agent.kill()
        stack.compose("--profile", "cluster", "stop", "collector", "nats1", "nats2", "nats3")


def test_an_upgrade_migrates_a_populated_database_and_serves_the_same_figures(
    stack: Stack, tmp_path: Path
) -> None:
    """A stack of the release before migration 0011 (its server built from that commit's
    sources with this commit's Dockerfiles and broker, serving plain HTTP: it knows no
    ZEAL_TLS_CERT; its collector on the certificate listener, its device provisioned over
    the password one), holding a stream with 300 readings; then `docker-compose up -d
    --build` from this commit on the same volumes: the server upgrades the schema at start
    and serves the same average, stats and export, over HTTPS."""
    new = tmp_path / "new"
    copy_owned(stack.directory, new)
    old = tmp_path / "old"
    copy_owned(new, old)
    for part in ("shared", "edge", "server"):
        shutil.rmtree(old / part)
    archive = subprocess.run(
        ["git", "archive", UPGRADE_FROM, "shared", "edge", "server", "constraints.txt"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    (old / "docker-compose.override.yml").write_text(OLD_SERVER)
    ports = {"MQTT": free_port(), "MQTT_CERT": free_port(), "HTTPS": free_port()}
    env = {
        **stack.env,
        "COMPOSE_PROJECT_NAME": f"zealupgrade{os.getpid()}",
        **{f"ZEAL_PUBLISH_{name}": str(port) for name, port in ports.items()},
    }
    upgrade = Stack(old, stack.engine, env, ports, scheme="http")
    try:
        upgrade.compose("up", "-d", "--build", "server")
        upgrade.ready()
        create_load_stream(upgrade, "upgrade")
        said = upgrade.compose(  # its admin over the password listener, without a certificate
            *("exec", "-T", "server", "env", "-u", "ZEAL_MQTT_CERT", "-u", "ZEAL_MQTT_KEY"),
            *("ZEAL_MQTT_URL=mqtts://mosquitto:8883", "zeal-server", "devices", "provision"),
            "up-1",
            timeout=120,
        )
        found = re.search(r"^password: (\S+)$", said, flags=re.M)
        assert found, said
        password = found.group(1)
        with upgrade.http() as http:
            config = http.get("/api/v1/streams/upgrade/config").text
        params = params_from_config(config, stream="upgrade")
        device = _client(upgrade, "up-1", password, "up-1:t")
        for payload in batches(params, "upgrade", "up-1", 30):
            device.publish("zeal/v1/upgrade/up-1/up", payload, qos=1).wait_for_publish(30)
        device.disconnect()
        device.loop_stop()
        wait_until(lambda: upgrade.readings("upgrade") == 300, 120, "300 readings stored")
        before = served(upgrade)
        upgrade.compose("up", "-d", "--build", "server", directory=new)
        upgrade.scheme = "https"
        upgrade.ready()
        after = served(upgrade)
        logs = upgrade.compose("logs", "--no-color", "server")
        migrated = re.findall(r"database schema upgraded from (\S+) to revision (\S+)", logs)
        print(f"upgrade from {UPGRADE_FROM}: schema {migrated}; 300 readings served alike")
        assert any(not start.startswith(("empty", "0011")) for start, _ in migrated), logs
        assert after == before
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            upgrade.compose("down", "--volumes", "--remove-orphans", timeout=300)


def copy_owned(source: Path, target: Path) -> None:
    """A copy of a staged stack whose deploy/ files keep their owners (the README's chown:
    the broker reads the server key and rewrites the dynamic security file as uid 1883)."""
    shutil.copytree(source, target, symlinks=True)
    for path in (source / "deploy").rglob("*"):
        if not path.is_symlink():
            owner = path.stat()
            os.chown(target / path.relative_to(source), owner.st_uid, owner.st_gid)


#: Compose's override beside the old release: its server knows no ZEAL_TLS_CERT (it serves
#: plain HTTP, which its health check and its commands then ask), nor ZEAL_MQTT_ADMIN_URL.
OLD_SERVER = """services:
  server:
    environment:
      ZEAL_TLS_CERT: ""
      ZEAL_TLS_KEY: ""
      ZEAL_SERVER_URL: http://server:8000
"""


def served(stack: Stack) -> dict[str, Any]:
    """The figures an upgrade must keep. The export's rows as a sorted list: rows of one
    device with one timestamp have no order of their own (a raw part keeps their arrival
    order, a compacted chunk another: store.export), and whether the old server compacted
    the stream's buckets before the upgrade or the new one after is a matter of timing.
    The export as the release before the code column wrote it: epoch times (asked where
    the server knows times=; a release before answers 422 to it), the code left out."""
    with stack.http() as http:
        stats = http.get("/api/v1/streams/upgrade/stats", params={"efficiency": "false"}).json()
        url = "/api/v1/streams/upgrade/export"
        exported = http.get(url, params={"times": "epoch"})
        if exported.status_code == 422:  # a release from before times=
            exported = http.get(url)
        header, *rows = exported.text.splitlines()
        if header == "timestamp_ms,device,code,estimate":
            fields = [line.split(",") for line in [header, *rows]]
            header, *rows = [",".join(f[:2] + f[3:]) for f in fields]
        return {
            "average": http.get("/api/v1/streams/upgrade/average").json(),
            "readings": stats["readings"],
            "devices": stats["devices"],
            "export": [header, *sorted(rows)],
        }
