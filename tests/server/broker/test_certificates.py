"""TLS and device certificates on the deployment's broker config: a real mosquitto with
deploy/mosquitto's listeners (8883 TLS with passwords, 8884 mutual TLS) and
reload-on-change beside it, certificates made by deploy/tls/make-certs (openssl), a real
`zeal-server serve` whose collector logs in with its certificate, devices provisioned with
`zeal-server devices provision` (a password, or a certificate for a request made on the
device with openssl), and real `zeal-edge` agents."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.broker import (
    BrokerTLS,
    StdinAgent,
    certificate_serial,
    make_certs,
    served_serial,
)
from tools.testbed.relay import Relay
from tools.testbed.server import DeployBroker, Server, serve, stream_body, wait_until
from zeal._core.firmware import profile_bytes
from zeal.mqtt.streamconfig import read_config

pytestmark = pytest.mark.integration
FIRMWARE = Path(__file__).resolve().parents[3] / "edge" / "firmware"
ADMIN = {"ZEAL_MQTT_ADMIN_USERNAME": "zeal-admin", "ZEAL_MQTT_ADMIN_PASSWORD": "pw-zeal-admin"}


@dataclass
class Deployment:
    broker: DeployBroker
    tls: BrokerTLS
    server: Server
    database_url: str
    tmp_path: Path

    @property
    def env(self) -> dict[str, str]:
        """The server's settings, as the operator's shell on its host has them."""
        folder = self.tls.directory
        return {
            "ZEAL_MQTT_URL": f"mqtts://localhost:{self.tls.mtls_port}",
            "ZEAL_MQTT_CA": str(folder / "ca.crt"),
            "ZEAL_MQTT_CERT": str(folder / "collector.crt"),
            "ZEAL_MQTT_KEY": str(folder / "collector.key"),
            "ZEAL_MQTT_ADMIN_URL": f"mqtts://localhost:{self.tls.tls_port}",
            "ZEAL_DEVICE_CA": str(folder / "devices-ca.crt"),
            "ZEAL_DEVICE_CA_KEY": str(folder / "devices-ca.key"),
            "ZEAL_DEVICE_CRL": str(folder / "crl" / "devices.crl"),
            "ZEAL_DATABASE_URL": self.database_url,
            **ADMIN,
        }

    def zeal_server(self, *args: str, stdin: bytes | None = None) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")} | self.env
        done = subprocess.run(
            [sys.executable, "-m", "zeal_server", *args],
            env=env,
            input=stdin,
            capture_output=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    def password_agent(self, device: str) -> StdinAgent:
        """A device provisioned with a password, its agent over TLS (8883)."""
        said = self.zeal_server("devices", "provision", device)
        password = re.search(r"^password: (\S+)$", said, flags=re.M)
        assert password, said
        url = f"mqtts://localhost:{self.tls.tls_port}"
        return StdinAgent(url, self.tmp_path, device, password.group(1), "temps",
                          "--ca", str(self.tls.directory / "ca.crt"),
                          server_key=server_key(said))  # fmt: skip

    def certificate(self, device: str) -> tuple[Path, Path, str]:
        """A device provisioned the recommended way: its key and request made on the device
        (openssl), the request sent, the certificate printed saved beside its key. Returns
        (certificate, key, what provision printed)."""
        folder = self.tmp_path / f"device-{device}"
        folder.mkdir()
        key, csr = folder / "device.key", folder / "device.csr"
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(key), "-subj", f"/CN={device}", "-out", str(csr)],
            check=True, capture_output=True,
        )  # fmt: skip
        said = self.zeal_server("devices", "provision", device, "--csr", str(csr))
        assert "PRIVATE KEY" not in said  # the key never left the device
        pem = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", said, re.S)
        assert pem, said
        certificate = folder / "device.crt"
        certificate.write_text(pem.group(0))
        return certificate, key, said

    def certificate_agent(self, device: str) -> StdinAgent:
        """A device provisioned with a certificate from its own request, its agent over
        mutual TLS (8884), with no password."""
        certificate, key, said = self.certificate(device)
        url = f"mqtts://localhost:{self.tls.mtls_port}"
        return StdinAgent(url, self.tmp_path, device, "", "temps",
                          *("--ca", str(self.tls.directory / "ca.crt")),
                          *("--cert", str(certificate), "--key", str(key)),
                          server_key=server_key(said))  # fmt: skip

    def readings(self, device: str) -> int:
        listed = self.server.http.get("/api/v1/streams/temps/devices").json()["devices"]
        return sum(d["readings"] for d in listed if d["name"] == device)


def all_stored(deployment: Deployment, agents: dict[str, StdinAgent]) -> None:
    """Each agent ends (exit 0: every batch confirmed) and every reading it read is stored."""
    for device, agent in agents.items():
        assert agent.end() == 0, agent.said()[-3000:]
        wait_until(lambda a=agent, d=device: deployment.readings(d) == a.fed, 60, f"{device}'s")
        print(f"{device}: {agent.fed} read, {deployment.readings(device)} stored")


def server_key(said: str) -> str:
    found = re.search(r"^server key: (\S+)$", said, flags=re.M)
    assert found, said
    return found.group(1)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    tls = BrokerTLS.make(tmp_path / "tls")
    broker = DeployBroker(tmp_path / "broker", tls=tls).start()
    database_url = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = serve(database_url, broker, tmp_path, ZEAL_MQTT_LOGIN_PROPERTY="zeal-login")
    deployment = Deployment(broker, tls, server, database_url, tmp_path)
    server.env.update({k: v for k, v in deployment.env.items() if k != "ZEAL_DATABASE_URL"})
    server.start()
    try:
        assert server.http.post("/api/v1/streams", json=stream_body()).status_code == 201
        wait_until(lambda: server.http.get("/readyz").status_code == 200, 30, "collector ready")
        yield deployment
    finally:
        server.stop()
        broker.stop()


def connack(port: int, *, username: str | None = None, password: str | None = None,
            client_id: str, tls: BrokerTLS | None = None,
            cert: tuple[Path, Path] | None = None) -> int:  # fmt: skip
    """The CONNACK reason code a client gets (0: accepted), or -1 when the connection is
    closed or refused before any CONNACK (TLS refused, or no TLS on a TLS port)."""
    done: list[int] = []
    closed = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
    if username is not None:
        c.username_pw_set(username, password)
    if tls is not None:
        c.tls_set(
            ca_certs=str(tls.directory / "ca.crt"),
            certfile=str(cert[0]) if cert else None,
            keyfile=str(cert[1]) if cert else None,
        )
    c.on_connect = lambda _c, _u, _f, reason, _p: done.append(reason.value)
    c.on_disconnect = lambda *_: closed.set()
    try:
        c.connect("localhost", port, keepalive=10)
    except (OSError, ssl.SSLError):
        return -1
    c.loop_start()
    try:
        wait_until(lambda: done or closed.is_set(), 10, "a CONNACK or the connection closed")
    finally:
        c.disconnect()
        c.loop_stop()
    return done[0] if done else -1


def test_agents_over_tls_one_with_a_password_one_with_a_certificate_from_its_own_request(
    deployment: Deployment,
) -> None:
    agents = {
        "pw-1": deployment.password_agent("pw-1"),
        "cert-1": deployment.certificate_agent("cert-1"),
    }
    wait_until(lambda: all(deployment.readings(d) >= 20 for d in agents), 90, "readings of both")
    all_stored(deployment, agents)
    # Plain MQTT on a TLS port gets no broker at all; the certificate listener takes no
    # client without a certificate, however good its password.
    assert connack(deployment.tls.tls_port, username="pw-x", password="x", client_id="pw-x") == -1
    assert connack(deployment.tls.mtls_port, username="zeal-admin", password="pw-zeal-admin",
                   client_id="zeal-admin", tls=deployment.tls) == -1  # fmt: skip


def test_a_revoked_certificate_is_refused_from_its_next_connection(
    deployment: Deployment,
) -> None:
    agent = deployment.certificate_agent("cert-2")
    other_cert, other_key, _ = deployment.certificate("cert-3")
    wait_until(lambda: deployment.readings("cert-2") >= 10, 60, "cert-2's readings")
    cert_2 = (deployment.tmp_path / "device-cert-2" / "device.crt",
              deployment.tmp_path / "device-cert-2" / "device.key")  # fmt: skip
    started = time.monotonic()
    said = deployment.zeal_server("devices", "revoke", "cert-2")
    print(said, f"(revoked and confirmed in {time.monotonic() - started:.1f} s)")
    assert "certificates revoked: 1; the broker refuses them already" in said
    # Its next connection is refused (TLS: certificate revoked); another device's
    # certificate still opens, under its own name.
    mtls = deployment.tls.mtls_port
    log = deployment.broker.directory / "mosquitto.log"
    refusals = log.read_text().count(VERIFY_FAILED)
    assert connack(mtls, client_id="cert-2", tls=deployment.tls, cert=cert_2) == -1
    assert log.read_text().count(VERIFY_FAILED) > refusals  # the TLS layer said no
    assert connack(mtls, client_id="cert-3", tls=deployment.tls, cert=(other_cert, other_key)) == 0
    # The connection it had was dropped when its login went (after the list was loaded).
    wait_until(lambda: KICKED in log.read_text(), 30, "cert-2's connection dropped")
    agent.kill()


#: What the broker logs when the dynamic security plugin drops a client whose login went.
KICKED = "Client cert-2 been disconnected by administrative action"
#: What it logs when it refuses a client certificate (a revoked one among them).
VERIFY_FAILED = "certificate verify failed"


def test_the_collectors_password_and_client_id_without_its_certificate_take_nothing(
    deployment: Deployment,
) -> None:
    agent = deployment.password_agent("pw-2")
    other_cert, other_key, _ = deployment.certificate("cert-4")
    wait_until(lambda: deployment.readings("pw-2") >= 10, 60, "pw-2's readings")
    tls = deployment.tls
    # What deploy/.env holds: the collector's login, password and client id. On the
    # password listeners (TLS, and plain inside the stack) the plugin refuses the login.
    for client_id in ("zeal-collector", "zeal-collector:zs-hostile"):
        got = connack(tls.tls_port, username="zeal-collector", password="pw-zeal-collector",
                      client_id=client_id, tls=tls)  # fmt: skip
        assert got == 135, got  # not authorized
        got = connack(deployment.broker.port, username="zeal-collector",
                      password="pw-zeal-collector", client_id=client_id)  # fmt: skip
        assert got == 135, got
    # A device's certificate asking for the collector's client id gets its own name's.
    assert connack(tls.mtls_port, client_id="zeal-collector", tls=tls,
                   cert=(other_cert, other_key)) == 0  # fmt: skip
    before = deployment.readings("pw-2")
    wait_until(lambda: deployment.readings("pw-2") > before + 5, 60, "readings after the tries")
    all_stored(deployment, {"pw-2": agent})


def test_renewing_the_server_certificate_while_agents_send_loses_nothing(
    deployment: Deployment,
) -> None:
    agents = {
        "pw-3": deployment.password_agent("pw-3"),
        "cert-5": deployment.certificate_agent("cert-5"),
    }
    wait_until(lambda: all(deployment.readings(d) >= 10 for d in agents), 60, "readings")
    folder = deployment.tls.directory
    old = served_serial(deployment.tls.tls_port, folder / "ca.crt")
    make_certs(folder, "renew")
    new = certificate_serial(folder / "server.crt")
    assert new != old
    assert (folder / "server.crt").stat().st_mode & 0o777 == 0o644  # the broker's user reads it
    # reload-on-change tells the broker; new connections get the new certificate on both
    # listeners, the old ones go on.
    for port in (deployment.tls.tls_port, deployment.tls.mtls_port):
        renewed = lambda p=port: served_serial(p, folder / "ca.crt") == new  # noqa: E731
        wait_until(renewed, 30, "the renewed certificate")
    # Every client connects again (a broker restart): the agents and the collector check
    # the renewed certificate, and lose nothing.
    deployment.broker.stop()
    deployment.broker.start()
    before = {d: deployment.readings(d) for d in agents}
    wait_until(lambda: all(deployment.readings(d) > before[d] + 5 for d in agents), 90,
               "readings after the restart")  # fmt: skip
    all_stored(deployment, agents)


def test_a_relay_on_the_path_sees_neither_password_nor_data_over_tls(
    deployment: Deployment,
) -> None:
    """A TCP relay between an agent and the broker records every byte of its session: over
    TLS neither its password, nor its login, nor a data topic appears; the same agent
    through the plain listener (inside the stack only) shows all three, so the check can
    fail."""
    said = deployment.zeal_server("devices", "provision", "pw-9")
    password = re.search(r"^password: (\S+)$", said, flags=re.M)
    assert password, said
    seen = {}
    for name, port, extra in (
        ("tls", deployment.tls.tls_port, ("--ca", str(deployment.tls.directory / "ca.crt"))),
        ("plain", deployment.broker.port, ()),
    ):
        relay = Relay("127.0.0.1", port)
        folder = deployment.tmp_path / f"relayed-{name}"
        folder.mkdir()
        scheme = "mqtts" if extra else "mqtt"
        agent = StdinAgent(f"{scheme}://localhost:{relay.port}", folder,
                           "pw-9", password.group(1), "temps", *extra,
                           server_key=server_key(said))  # fmt: skip
        try:
            before = deployment.readings("pw-9")
            wait_until(lambda b=before: deployment.readings("pw-9") >= b + 10, 60, "readings")
            assert agent.end() == 0, agent.said()[-3000:]
        finally:
            relay.close()
        seen[name] = relay.seen
    secrets = (password.group(1).encode(), b"pw-9", b"zeal/v1/temps")
    print({name: (len(data), [s in data for s in secrets]) for name, data in seen.items()})
    assert seen["tls"][:1] == b"\x16"  # a TLS handshake record first
    assert not any(s in seen["tls"] for s in secrets)
    assert all(s in seen["plain"] for s in secrets)


def test_the_c_device_connects_with_a_certificate_from_its_own_request(
    deployment: Deployment,
) -> None:
    """The firmware library's Linux example (libmosquitto) over mutual TLS: its key and
    request made with openssl, its certificate from `devices provision --csr`, no password:
    every reading it sent stored."""
    subprocess.run(["make", "-s", "-C", str(FIRMWARE), "device"], check=True)
    certificate, key, _ = deployment.certificate("c-cert")
    config = deployment.server.http.get("/api/v1/streams/temps/config").json()
    params = read_config(json.dumps(config)).params
    profile = profile_bytes(params, stream="temps", device="c-cert", unit=0.1)
    now = int(time.time()) * 1000
    csv = deployment.tmp_path / "readings.csv"
    csv.write_text("".join(f"{now - 1000 * (30 - i)},{50 + i / 10}\n" for i in range(30)))
    command = [str(FIRMWARE / "build" / "zeal-device"), "--profile", profile.hex()]
    command += ["--stream", "temps", "--device", "c-cert", "--csv", str(csv), "--batch", "10"]
    command += ["--broker", f"mqtts://localhost:{deployment.tls.mtls_port}"]
    command += ["--ca", str(deployment.tls.directory / "ca.crt")]
    command += ["--cert", str(certificate), "--key", str(key)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    wait_until(lambda: deployment.readings("c-cert") == 30, 60, "the C device's readings")
    print(f"C device over mutual TLS: {done.stdout.count('acknowledged')} batches, 30 stored")


def test_the_api_issues_a_certificate_and_refuses_a_bad_request(deployment: Deployment) -> None:
    """POST /api/v1/devices/{device}/login with {"certificate": true}: a certificate and a
    key made on the server (shown once), no password, and the broker takes it; a request
    that is not a CSR, one naming another device and one of a key too weak are 422 and
    make no login; DELETE revokes it, confirmed by the broker."""
    http = deployment.server.http
    made = http.post("/api/v1/devices/api-1/login", json={"certificate": True})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["password"] is None
    assert "BEGIN CERTIFICATE" in body["certificate"]
    assert "PRIVATE KEY" in body["private_key"]
    folder = deployment.tmp_path / "api-1"
    folder.mkdir()
    (folder / "c.crt").write_text(body["certificate"])
    (folder / "c.key").write_text(body["private_key"])
    pair = (folder / "c.crt", folder / "c.key")
    mtls = deployment.tls.mtls_port
    assert connack(mtls, client_id="api-1", tls=deployment.tls, cert=pair) == 0

    other = deployment.tmp_path / "other.csr"
    weak = deployment.tmp_path / "weak.csr"
    for subject, out, key in (("/CN=someone-else", other, "ec"), ("/CN=api-2", weak, "rsa:1024")):
        extra = ["-pkeyopt", "ec_paramgen_curve:P-256"] if key == "ec" else []
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", key, *extra, "-nodes", "-keyout",
             str(out) + ".key", "-subj", subject, "-out", str(out)],
            check=True, capture_output=True,
        )  # fmt: skip
    for csr, says in (
        ("not a request", "not a PEM request"),
        (other.read_text(), "names 'someone-else', not the device 'api-2'"),
        (weak.read_text(), "at least 2048 bits"),
    ):
        refused = http.post("/api/v1/devices/api-2/login", json={"csr": csr})
        assert refused.status_code == 422, refused.text
        assert says in refused.json()["detail"], refused.text
    assert "api-2" not in http.get("/api/v1/devices").json()

    revoked = http.delete("/api/v1/devices/api-1/login")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json() == {
        "device": "api-1",
        "revoked": True,
        "certificates": 1,
        "confirmed": True,
    }
    assert connack(mtls, client_id="api-1", tls=deployment.tls, cert=pair) == -1


def run_cli(deployment: Deployment, *args: str, stdin: bytes | None = None) -> tuple[int, str]:
    """`zeal-server ARGS` with the operator's settings: its exit status and all it said."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")} | deployment.env
    done = subprocess.run([sys.executable, "-m", "zeal_server", *args], env=env, input=stdin,
                          capture_output=True, check=False, timeout=300)  # fmt: skip
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def copied(folder: Path) -> dict[str, str]:
    """A device folder of `provision --from` as the device has it once copied to
    /etc/zeal-edge: its login.env's settings, the paths in them where the files are."""
    settings = {}
    for line in (folder / "login.env").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings[name] = value.replace("/etc/zeal-edge", str(folder))
    return settings


def test_a_fleet_provisioned_from_a_list(deployment: Deployment) -> None:
    """`devices provision --from LIST --out DIR`: a list of password devices, one with a
    request made on the device (openssl) and one provisioned before; each made device gets a
    folder only its owner reads (login.env, its certificate), and agents run from those
    folders over TLS store every reading; the one provisioned before is refused (exit 2)
    and the rest made; run again, the command skips what it wrote. A list with a bad entry
    makes nothing; --certificate gives every device of a list a certificate made here."""
    tmp = deployment.tmp_path
    deployment.zeal_server("devices", "provision", "old-1")
    requests = tmp / "requests"
    requests.mkdir()
    subprocess.run(
        ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(requests / "lst-csr.key"), "-subj", "/CN=lst-csr",
         "-out", str(requests / "lst-csr.csr")],
        check=True, capture_output=True,
    )  # fmt: skip
    listed = tmp / "fleet.txt"
    listed.write_text(
        "# kitchen sensors\nlst-pw-1\n\nlst-pw-2   # the hall\n"
        "lst-csr requests/lst-csr.csr\nold-1\n"
    )
    out = tmp / "logins"
    command = ("devices", "provision", "--from", str(listed), "--out", str(out))
    code, said = run_cli(deployment, *command)
    print(said)
    assert code == 2, said
    assert "provisioned 3 device(s)" in said
    assert "2 with a password, 1 with a certificate" in said
    assert "1 of 4 not provisioned: old-1: device 'old-1' is already provisioned" in said
    assert sorted(p.name for p in out.iterdir()) == ["logins.csv", "lst-csr", "lst-pw-1",
                                                     "lst-pw-2"]  # fmt: skip
    assert out.stat().st_mode & 0o777 == 0o700
    for path in out.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
    rows = (out / "logins.csv").read_text().splitlines()
    assert rows[0] == "device,login,serial,not_after,result"
    assert [r.split(",")[:2] for r in rows[1:]] == [
        ["lst-pw-1", "password"], ["lst-pw-2", "password"], ["lst-csr", "certificate"],
        ["old-1", ""],
    ]  # fmt: skip
    assert "ZEAL_MQTT_PASSWORD" not in (out / "logins.csv").read_text()
    assert not (out / "lst-csr" / "device.key").exists()  # the device's key stayed on it
    (out / "lst-csr" / "device.key").write_bytes((requests / "lst-csr.key").read_bytes())

    again = run_cli(deployment, *command)
    assert again[0] == 2, again[1]
    assert "skipped 3 device(s)" in again[1]
    assert "1 of 1 not provisioned: old-1" in again[1]

    stdin = b"lst-cert-1\n"
    code, said = run_cli(deployment, "devices", "provision", "--from", "-", "--certificate",
                         "--out", str(out), stdin=stdin)  # fmt: skip
    assert code == 0, said
    assert "0 with a password, 1 with a certificate" in said
    assert "PRIVATE KEY" in (out / "lst-cert-1" / "device.key").read_text()

    bad = tmp / "bad.txt"
    bad.write_text("lst-x\nbad/name\nlst-x\nzeal-collector\n")
    code, said = run_cli(deployment, "devices", "provision", "--from", str(bad), "--out",
                         str(tmp / "bad-out"))  # fmt: skip
    assert code == 2, said
    assert "nothing provisioned: entry 2" in said
    assert "entry 3: 'lst-x' is in the list twice" in said
    assert "entry 4" in said
    listed_now = deployment.zeal_server("devices", "list").split()
    assert "lst-x" not in listed_now
    assert {"lst-pw-1", "lst-pw-2", "lst-csr", "lst-cert-1"} <= set(listed_now)

    tls, ca = deployment.tls, str(deployment.tls.directory / "ca.crt")
    agents = {
        "lst-pw-1": StdinAgent(f"mqtts://localhost:{tls.tls_port}", tmp, "lst-pw-1", "",
                               "temps", "--ca", ca, environment=copied(out / "lst-pw-1")),
        "lst-csr": StdinAgent(f"mqtts://localhost:{tls.mtls_port}", tmp, "lst-csr", "",
                              "temps", "--ca", ca, environment=copied(out / "lst-csr")),
        "lst-cert-1": StdinAgent(f"mqtts://localhost:{tls.mtls_port}", tmp, "lst-cert-1", "",
                                 "temps", "--ca", ca, environment=copied(out / "lst-cert-1")),
    }  # fmt: skip
    wait_until(lambda: all(deployment.readings(d) >= 10 for d in agents), 90, "their readings")
    all_stored(deployment, agents)


def test_two_hundred_and_fifty_devices_from_one_list(deployment: Deployment) -> None:
    """A list far longer than a message to the broker holds (the deployment's 128 KiB
    packets take some 35 devices): every device made once, each folder's password the
    broker's (the last one checked by logging in)."""
    names = [f"fleet-{i:03d}" for i in range(250)]
    started = time.monotonic()
    out = str(deployment.tmp_path / "out")
    code, said = run_cli(deployment, "devices", "provision", "--from", "-", "--out", out,
                         stdin="\n".join(names).encode())  # fmt: skip
    took = time.monotonic() - started
    assert code == 0, said
    assert "100 of 250..." in said
    assert "200 of 250..." in said
    print(f"250 devices from a list: {took:.1f} s (the command, from start to end)")
    assert set(names) <= set(deployment.zeal_server("devices", "list").split())
    env = copied(deployment.tmp_path / "out" / "fleet-249")
    got = connack(deployment.tls.tls_port, username="fleet-249",
                  password=env["ZEAL_MQTT_PASSWORD"], client_id="fleet-249",
                  tls=deployment.tls)  # fmt: skip
    assert got == 0


def test_the_api_provisions_a_list(deployment: Deployment) -> None:
    """POST /api/v1/devices/logins: a password and a certificate login made, a device with a
    login already refused (409) beside them; a list with a device twice, a reserved name,
    over 500 entries or a signing request (they go one per call) is 422 and makes
    nothing."""
    http = deployment.server.http
    assert http.post("/api/v1/devices/api-old/login").status_code == 201
    body = {"devices": [{"device": "api-l1"}, {"device": "api-l2", "certificate": True},
                        {"device": "api-old"}]}  # fmt: skip
    answer = http.post("/api/v1/devices/logins", json=body)
    assert answer.status_code == 200, answer.text
    made = {m["device"]: m for m in answer.json()["provisioned"]}
    assert list(made) == ["api-l1", "api-l2"]
    assert made["api-l1"]["password"]
    assert made["api-l1"]["certificate"] is None
    assert made["api-l2"]["password"] is None
    assert "PRIVATE KEY" in made["api-l2"]["private_key"]
    refused = answer.json()["refused"]
    assert [(r["device"], r["status"]) for r in refused] == [("api-old", 409)]
    folder = deployment.tmp_path / "api-l2"
    folder.mkdir()
    (folder / "c.crt").write_text(made["api-l2"]["certificate"])
    (folder / "c.key").write_text(made["api-l2"]["private_key"])
    tls = deployment.tls
    assert connack(tls.mtls_port, client_id="api-l2", tls=tls,
                   cert=(folder / "c.crt", folder / "c.key")) == 0  # fmt: skip
    assert connack(tls.tls_port, username="api-l1", password=made["api-l1"]["password"],
                   client_id="api-l1", tls=tls) == 0  # fmt: skip

    for devices, says in (
        ([{"device": "api-x"}, {"device": "api-x"}], "'api-x' is in the list twice"),
        ([{"device": "api-y"}, {"device": "zeal-collector"}], "entry 2"),
        ([{"device": f"d{i}"} for i in range(501)], "at most 500"),
        ([{"device": "api-z", "csr": "-----BEGIN"}], "devices.0.csr: not a field of this request"),
    ):
        refused_list = http.post("/api/v1/devices/logins", json={"devices": devices})
        assert refused_list.status_code == 422, refused_list.text
        assert says in refused_list.text, refused_list.text
    assert not {"api-x", "api-y", "d0"} & set(http.get("/api/v1/devices").json())
