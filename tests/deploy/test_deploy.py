"""docker-compose.yml and deploy/: files validated (Docker cannot run here), the broker's
access control checked against a real mosquitto."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.deploy.compose_check import problems
from tests.mqtt_helpers import deploy_broker_config, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


def test_compose_and_deploy_files_are_consistent() -> None:
    """The compose file parses, every file it references exists (secrets are git-ignored and
    documented), and every variable it sets or needs is one the settings know."""
    assert problems(ROOT) == []


def _copy_repo(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(
        ROOT,
        copy,
        ignore=shutil.ignore_patterns(".venv", ".git", "*.sqlite", "__pycache__", ".mypy_cache"),
    )
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    return copy


def test_validation_fails_when_a_file_or_variable_is_missing(tmp_path: Path) -> None:
    """Removing a referenced file or a required variable makes the validation fail."""
    copy = _copy_repo(tmp_path)
    assert problems(copy) == []
    (copy / "deploy" / "mosquitto" / "acl").unlink()
    assert any("deploy/mosquitto/acl does not exist" in p for p in problems(copy))
    (copy / "deploy" / "mosquitto" / "acl").write_text("")
    example = copy / "deploy" / "env.example"
    example.write_text(
        "\n".join(
            line
            for line in example.read_text().splitlines()
            if not line.startswith("ZEAL_OPERATOR_TOKEN")
        )
    )
    assert any("${ZEAL_OPERATOR_TOKEN}" in p for p in problems(copy))
    compose = copy / "docker-compose.yml"
    compose.write_text(compose.read_text().replace("ZEAL_SHARE_GROUP:", "ZEAL_SHARE_GRUOP:"))
    assert any("ZEAL_SHARE_GRUOP, which no zeal setting reads" in p for p in problems(copy))


class _Client:
    def __init__(
        self, port: int, user: str | None, password: str | None, ca: Path | None = None
    ) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.refused: str | None = None
        self.connected = False
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"t-{user}-{time.time_ns()}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        if user is not None:
            self.client.username_pw_set(user, password)
        if ca is not None:
            self.client.tls_set(ca_certs=str(ca))
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, bytes(m.payload)))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        deadline = time.monotonic() + 5
        while not (self.connected or self.refused) and time.monotonic() < deadline:
            time.sleep(0.02)

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


def make_certificates(directory: Path) -> dict[str, Path]:
    """A test CA and a server certificate for 127.0.0.1, made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, crt = (
        directory / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt")
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=zeal-test-ca",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return {"ca": ca, "cert": crt, "key": key}


@pytest.mark.integration
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_broker_config_enforces_device_topics(tmp_path: Path, tls: bool) -> None:
    """deploy/mosquitto, on its plain listener and on its TLS listener (a test CA): anonymous
    and wrong-password clients refused; a device cannot publish as, or read, another device;
    its own topic reaches the collector; configs are readable by devices; the collector's
    notices reach only their device, which cannot write them; a device announces its own
    presence and can neither read nor forge another device's."""
    port = free_port()
    conf = (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text()
    ca = None
    if tls:
        certs = make_certificates(tmp_path / "certs")
        ca = certs["ca"]
        assert "#listener 8883" in conf
        conf = (
            conf.replace("listener 1883\nuse_username_as_clientid true\n", "")
            .replace("#listener 8883", f"listener {port} 127.0.0.1")
            .replace("#use_username_as_clientid", "use_username_as_clientid")
            .replace("#cafile /mosquitto/certs/ca.crt", f"cafile {certs['ca']}")
            .replace("#certfile /mosquitto/certs/server.crt", f"certfile {certs['cert']}")
            .replace("#keyfile /mosquitto/certs/server.key", f"keyfile {certs['key']}")
            .replace("#tls_version", "tls_version")
        )
    (tmp_path / "mosquitto.conf").write_text(deploy_broker_config(conf, port, tmp_path))
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
        collector = _Client(port, "zeal-collector", "pw-zeal-collector", ca)
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
        time.sleep(0.5)
        collector.client.publish(
            "zeal/v1/temps/config", b"{}", qos=1, retain=True
        ).wait_for_publish(5)
        collector.client.publish("zeal/v1/temps/dev1/notice", b"n", qos=1).wait_for_publish(5)
        dev1.client.publish(
            "zeal/v1/temps/dev1/presence", b"p1", qos=1, retain=True
        ).wait_for_publish(5)
        dev1.client.publish("zeal/v1/temps/dev1/up", b"own", qos=1).wait_for_publish(5)
        deadline = time.monotonic() + 5
        while len(dev1.messages) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Forbidden publishes last: the broker may answer one by closing the connection.
        for topic in ("zeal/v1/temps/dev1/presence", "zeal/v1/temps/dev1/notice"):
            with contextlib.suppress(RuntimeError):  # forged presence, forged notice
                dev2.client.publish(topic, b"forged", qos=1).wait_for_publish(5)
        with contextlib.suppress(RuntimeError):
            dev1.client.publish("zeal/v1/temps/dev1/notice", b"self", qos=1).wait_for_publish(5)
        # The broker may answer a forbidden publish by closing the connection.
        with contextlib.suppress(RuntimeError):
            dev1.client.publish("zeal/v1/temps/dev2/up", b"forged", qos=1).wait_for_publish(5)
        time.sleep(1.5)
        assert collector.messages == [("zeal/v1/temps/dev1/up", b"own")]
        assert dev2.messages == [("zeal/v1/temps/config", b"{}")]
        assert sorted(dev1.messages) == [
            ("zeal/v1/temps/dev1/notice", b"n"),
            ("zeal/v1/temps/dev1/presence", b"p1"),
        ]
        for client in (anonymous, wrong, collector, dev1, dev2):
            client.close()
    finally:
        broker.terminate()
        broker.wait(timeout=10)
