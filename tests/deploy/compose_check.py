"""Checks of docker-compose.yml and deploy/ that do not need a Docker daemon: the files it
references, and what Compose itself (Debian's docker-compose, which resolves the file
exactly as `up` would) gives each service."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from zeal_edge.settings import SETTINGS
from zeal_server.settings import VARIABLES

#: Files the compose file needs that hold secrets: created by the operator, never committed.
SECRETS = {
    "deploy/.env": "deploy/env.example",
    "deploy/mosquitto/passwd": None,
    "deploy/mosquitto/dynsec": None,  # the broker's device logins (dynamic security)
    "deploy/nats/users.conf": "deploy/nats/users.conf.example",  # the NATS cluster's logins
    # Certificates and keys: made by deploy/tls/make-certs (deploy/README.md, step 2).
    "deploy/tls/ca.crt": "deploy/tls/make-certs",
    "deploy/tls/crl": "deploy/tls/make-certs",
}
#: What zeal's programs read: the server, the agent, and the CLI's way to the running server.
KNOWN = set(VARIABLES) | {s.env for s in SETTINGS} | {"ZEAL_SERVER_URL", "ZEAL_SERVER_CA"}
_REFERENCE = re.compile(r"(?<!\$)\$\{?[A-Z_]")
#: The one interpolation the file makes: a host port to publish, with the usual default.
_PUBLISHED_PORT = re.compile(r"\$\{ZEAL_PUBLISH_[A-Z0-9_]+:-\d+\}")


def _ignored(root: Path, relative: str) -> bool:
    result = subprocess.run(["git", "check-ignore", "-q", relative], cwd=root, check=False)
    return result.returncode == 0


def problems(root: Path) -> list[str]:
    """Everything wrong with the compose file and deploy/; empty when all is well."""
    found: list[str] = []
    compose_path = root / "docker-compose.yml"
    try:
        compose: dict[str, Any] = yaml.safe_load(compose_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"docker-compose.yml does not parse: {exc}"]
    example = root / "deploy" / "env.example"
    if not example.exists():
        found.append("deploy/env.example is missing")

    def need_file(relative: str, why: str) -> None:
        relative = relative.removeprefix("./")
        if relative in SECRETS:
            stand_in = SECRETS[relative]
            if stand_in is not None and not (root / stand_in).exists():
                found.append(f"{why}: {relative} is documented by {stand_in}, which is missing")
            if not _ignored(root, relative):
                found.append(f"{why}: secret file {relative} is not git-ignored")
        elif not (root / relative).exists():
            found.append(f"{why}: {relative} does not exist")

    for name, service in compose.get("services", {}).items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith(("./", "/")):
                need_file(host, f"service {name} mounts")
        build = service.get("build")
        if build:
            context = root / build.get("context", ".")
            dockerfile = build.get("dockerfile", "Dockerfile")
            need_file(str((context / dockerfile).relative_to(root)), f"service {name} builds")
            dockerfile_path = context / dockerfile
            if dockerfile_path.exists():
                for line in dockerfile_path.read_text().splitlines():
                    if line.startswith("COPY ") and "--from=" not in line:
                        for source in line.split()[1:-1]:
                            need_file(
                                str((context / source).relative_to(root)), f"{dockerfile} copies"
                            )
        env_file = service.get("env_file")
        for item in [env_file] if isinstance(env_file, str) else env_file or []:
            need_file(item, f"service {name} reads")
        for key in service.get("environment", {}):
            if key.startswith("ZEAL_") and key not in KNOWN:
                found.append(f"service {name} sets {key}, which no zeal setting reads")
    if _REFERENCE.search(_PUBLISHED_PORT.sub("", yaml.safe_dump(compose))):
        found.append(
            "docker-compose.yml interpolates a variable other than a published port "
            "(${ZEAL_PUBLISH_...:-port}): Compose fills ${...} from the shell, never from "
            "env_file; give values through deploy/.env (write $$ for the container's shell)"
        )
    conf = root / "deploy" / "mosquitto" / "mosquitto.conf"
    if conf.exists():
        text = conf.read_text()
        for setting in (
            "allow_anonymous false",
            "password_file",
            "acl_file",
        ):
            if setting not in text:
                found.append(f"deploy/mosquitto/mosquitto.conf lacks '{setting}'")
    return found


def first_step(root: Path) -> str:
    """The lines of deploy/README.md's setup that make deploy/.env (up to `set -a`)."""
    block = (root / "deploy" / "README.md").read_text().split("```sh\n", 1)[1]
    return block.split("set -a", 1)[0]


def staged(root: Path, directory: Path) -> Path:
    """docker-compose.yml and deploy/ copied to `directory` with the operator's first steps
    done: deploy/.env made by deploy/README.md's own first lines (copied from
    deploy/env.example, every secret made), an empty password file."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "docker-compose.yml", directory / "docker-compose.yml")
    shutil.copytree(root / "deploy", directory / "deploy", dirs_exist_ok=True)
    subprocess.run(["bash", "-euc", first_step(root)], cwd=directory, check=True)
    (directory / "deploy" / "mosquitto" / "passwd").touch()
    subprocess.run(  # the certificates the stack mounts (deploy/README.md's next step)
        ["sh", str(root / "deploy" / "tls" / "make-certs"), str(directory / "deploy" / "tls")],
        check=True,
        capture_output=True,
    )
    nats = directory / "deploy" / "nats"
    password = re.search(
        r"^ZEAL_MQTT_PASSWORD=(.*)$", (directory / "deploy" / ".env").read_text(), re.M
    )
    assert password is not None
    (nats / "users.conf").write_text(  # deploy/SCALING.md's users.conf
        (nats / "users.conf.example").read_text().replace("change-me-collector", password[1])
    )
    return directory


def compose_config(directory: Path, *profiles: str) -> tuple[dict[str, Any], str]:
    """`docker-compose config` run in `directory`: the resolved file and what the tool
    warned about (empty when it had nothing to say)."""
    command = ["docker-compose"]
    for profile in profiles:
        command += ["--profile", profile]
    done = subprocess.run(
        [*command, "config"], cwd=directory, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"docker-compose config failed: {done.stderr}")
    resolved: dict[str, Any] = yaml.safe_load(done.stdout)
    return resolved, done.stderr.strip()
