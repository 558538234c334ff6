"""deploy/README.md's path from nothing to a running stack, run as written up to the point
where Docker would start the containers; then its broker files in a real mosquitto with
the deployment's config, and its provisioning command against that broker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.compose_check import staged
from tools.testbed.broker import Mosquitto, deploy_broker_config
from zeal_server import store
from zeal_server.store.db import make_engine, migrate, session_factory

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def commands() -> list[str]:
    """The section's sh block, one command per line."""
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text.split("## From nothing to a running stack", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_operators_path_runs_as_written_until_docker_starts(tmp_path: Path) -> None:
    """Every command before `docker-compose ... up` succeeds in a copy of the repository's
    deployment files (one shell, as an operator types them): random tokens replace the
    examples, the certificates are made, the password file is empty, the dynamic security
    admin exists, and Compose accepts the result. The broker files then work in a real
    mosquitto, and the README's provisioning command makes a device login."""
    before_up = []
    for command in commands():
        if re.match(r"docker-compose .*\bup\b", command):
            break
        before_up.append(command)
    assert before_up[0] == "cp deploy/env.example deploy/.env"
    assert before_up[-1] == "docker-compose config --quiet"
    directory = staged(ROOT, tmp_path / "stack")
    (directory / "deploy" / ".env").unlink()  # the first command makes it
    (directory / "deploy" / "mosquitto" / "passwd").unlink()
    for made in (directory / "deploy" / "tls").iterdir():  # the README makes them
        if made.name != "make-certs":
            shutil.rmtree(made) if made.is_dir() else made.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEAL_", "POSTGRES_"))}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(before_up)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr
    settings = dict(
        line.split("=", 1)
        for line in (directory / "deploy" / ".env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    for token in ("ZEAL_OPERATOR_TOKEN", "ZEAL_READ_TOKEN"):
        assert re.fullmatch(r"[0-9a-f]{48}", settings[token]), token
    users = (directory / "deploy" / "mosquitto" / "passwd").read_text().splitlines()
    # Empty: the collector logs in with its certificate, and no login may publish as any
    # device (the simulator's is made for the demo profile only).
    assert users == []
    for made in ("ca.crt", "server.crt", "devices-ca.crt", "collector.crt", "crl/devices.crl"):
        assert (directory / "deploy" / "tls" / made).is_file(), made
    dynsec = json.loads(
        (directory / "deploy" / "mosquitto" / "dynsec" / "dynamic-security.json").read_text()
    )
    assert [c["username"] for c in dynsec["clients"]] == [settings["ZEAL_MQTT_ADMIN_USERNAME"]]

    files = directory / "deploy" / "mosquitto"
    broker = Mosquitto(tmp_path / "broker")
    conf = (files / "mosquitto.conf").read_text()
    broker.config.write_text(deploy_broker_config(conf, broker.port, files))
    broker.start()
    # The server's database (in the stack: PostgreSQL, and the command runs in the server's
    # container), for the key provisioning hands over with the login.
    database = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    engine = make_engine(database)
    migrate(engine)
    with session_factory(engine)() as session:
        key = store.signer(session).public
    engine.dispose()
    try:
        provision = subprocess.run(
            [sys.executable, "-m", "zeal_server", "devices", "provision", "kitchen-1"],
            env={**env, **settings, "ZEAL_MQTT_URL": broker.url, "ZEAL_DATABASE_URL": database},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert provision.returncode == 0, provision.stderr
        assert "username: kitchen-1" in provision.stdout
        assert f"server key: {key}" in provision.stdout
    finally:
        broker.stop()
