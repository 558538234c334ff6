"""A container engine for docker-compose, for tests/deploy/test_stack.py: Docker where a
Docker daemon answers, else Podman behind its Docker-compatible API (``podman system
service`` on a socket of our own), with the base image ``debian:bookworm-slim`` made from
Debian's packages by mmdebstrap when no registry can give it (deploy/README.md, "Podman")."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tools.testbed.wait import wait_until

BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
#: What a Debian host's containers need (deploy/README.md): runc, and rlimits the host allows.
CONTAINERS_CONF = Path("/etc/containers/containers.conf")


@dataclass
class Engine:
    """How to reach the engine: the environment docker-compose needs, and the CLI for what
    Compose does not do (image sizes, a container's memory)."""

    env: dict[str, str]
    cli: str
    _service: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.cli} {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def image_bytes(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).strip())


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    return done.returncode == 0


def podman_config_problems() -> list[str]:
    """What /etc/containers/containers.conf lacks for Podman on a host like the CI's."""
    text = CONTAINERS_CONF.read_text() if CONTAINERS_CONF.exists() else ""
    return [
        f"{CONTAINERS_CONF} lacks {line}"
        for line in ('runtime = "runc"', "default_ulimits")
        if line not in text
    ]


def ensure_base_image(cli: str = "podman") -> None:
    """Make debian:bookworm-slim from Debian's packages when the engine has none: a minbase
    bookworm (about 25 s with mmdebstrap) without docs, man pages or apt's caches."""
    if subprocess.run([cli, "image", "exists", BASE_IMAGE], capture_output=True).returncode == 0:
        return
    with tempfile.TemporaryDirectory() as work:
        tar = Path(work) / "base.tar"
        subprocess.run(
            [
                *("mmdebstrap", "--variant=minbase", "--quiet"),
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-include=/usr/share/doc/*/copyright",
                "--dpkgopt=path-exclude=/usr/share/info/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                "--customize-hook=rm -rf $1/var/cache/apt/* $1/var/lib/apt/lists/*",
                *("bookworm", str(tar)),
            ],
            check=True,
            timeout=900,
        )
        subprocess.run([cli, "import", str(tar), BASE_IMAGE], check=True, capture_output=True)


@contextlib.contextmanager
def engine(directory: Path) -> Iterator[Engine]:
    """Docker if its daemon answers; else Podman's API service on a socket in `directory`,
    stopped on leaving (containers left running by the caller are its business)."""
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    if _docker_answers():
        yield Engine(env=env, cli="docker")
        return
    problems = podman_config_problems()
    if problems:
        raise RuntimeError("; ".join(problems) + " (deploy/README.md, Podman)")
    ensure_base_image()
    socket = directory / "podman.sock"
    log = (directory / "podman-service.log").open("wb")
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=5) as http:

            def answers() -> bool:
                if service.poll() is not None:
                    raise RuntimeError(f"podman system service ended; see {log.name}")
                with contextlib.suppress(httpx.TransportError):
                    return http.get("http://d/_ping").text == "OK"
                return False

            wait_until(answers, 60, f"podman system service on {socket}")
        yield Engine(env={**env, "DOCKER_HOST": f"unix://{socket}"}, cli="podman", _service=service)
    finally:
        service.terminate()
        try:
            service.wait(30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(10)
        log.close()
