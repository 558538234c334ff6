"""TLS and certificate settings: the server's and the agent's refuse what cannot work, in
one line naming the setting (unit tests; the TLS itself runs in
tests/server/broker/test_certificates.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zeal_server.settings import ServerSettings, SettingsError

BASE = {"ZEAL_DATABASE_URL": "sqlite://", "ZEAL_MQTT_URL": "mqtts://broker:8884"}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"ZEAL_DEVICE_CA": "ca.crt"}, "missing: ZEAL_DEVICE_CA_KEY, ZEAL_DEVICE_CRL"),
        (
            {
                "ZEAL_DEVICE_CA": "a",
                "ZEAL_DEVICE_CA_KEY": "b",
                "ZEAL_DEVICE_CRL": "c",
                "ZEAL_DEVICE_CERT_DAYS": "0",
            },
            "ZEAL_DEVICE_CERT_DAYS must be 1 to 36500 days",
        ),
        ({"ZEAL_TLS_CERT": "server.crt"}, "ZEAL_TLS_CERT and ZEAL_TLS_KEY go together"),
        ({"ZEAL_MQTT_ADMIN_URL": "http://broker"}, "ZEAL_MQTT_ADMIN_URL: broker URL"),
    ],
)
def test_bad_tls_settings_are_refused_naming_them(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        ServerSettings.from_env({**BASE, **env})


def test_the_admin_logs_in_without_the_collectors_certificate() -> None:
    settings = ServerSettings.from_env(
        {
            **BASE,
            "ZEAL_MQTT_CA": "ca.crt",
            "ZEAL_MQTT_CERT": "collector.crt",
            "ZEAL_MQTT_KEY": "collector.key",
            "ZEAL_MQTT_ADMIN_URL": "mqtts://broker:8883",
        }
    )
    assert settings.admin_broker is not None
    assert (settings.admin_broker.port, settings.admin_broker.ca_file) == (8883, "ca.crt")
    assert settings.admin_broker.cert_file is None
    assert ServerSettings.from_env(BASE).admin_broker is None  # the broker's own, then


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--cert", "d.crt"], "--cert and --key go together"),
        (["--broker", "mqtt://b:1883", "--ca", "ca.crt"], "the broker URL must be mqtts://"),
        (
            ["--stream", "a,b", "--cert", "d.crt", "--key", "d.key"],
            "a client certificate is one session on the broker",
        ),
    ],
)
def test_an_agent_refuses_tls_options_that_cannot_work(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "zeal_edge", "run", "--device", "d1", "--source", "stdin"]
    command += ["--data-dir", str(tmp_path), "--server-key", "A" * 43 + "="]
    if "--stream" not in argv:
        command += ["--stream", "temps"]
    if "--broker" not in argv:
        command += ["--broker", "mqtts://b:8884"]
    done = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
