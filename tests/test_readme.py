"""The README's "Getting started" commands, run as written from a fresh clone."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tools.testbed.broker import Mosquitto
from tools.testbed.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
# One worker runs both files: they share fresh_clone's environment (and port 8000).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("fresh_clone")]
LONG_RUNNING = ("zeal-server serve", "zeal-edge run")


def walkthrough() -> list[str]:
    """Every command of the section's ```sh blocks, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Getting started", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_walkthrough_has_every_step() -> None:
    """Install, server, stream, agent (both ways), average, status: in the order run."""
    commands = walkthrough()
    order = [
        "make install",
        "zeal-server serve",
        "zeal-server streams create",
        "zeal-edge run",
        "/config > params.json",
        "--params params.json",
        "/average",
        "zeal-edge status",
    ]
    positions = [next(i for i, c in enumerate(commands) if step in c) for step in order]
    assert positions == sorted(positions), commands


def test_the_readme_walkthrough_works_as_written(tmp_path: Path, fresh_clone: Path) -> None:
    """A fresh clone (shared with the demo's test), a broker at ZEAL_MQTT_URL, the commands
    exactly as the README gives them: both agents' readings reach the served average,
    status tells what the broker confirmed, Ctrl-C stops everything cleanly, and git sees
    no new files."""
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 8000)) != 0, "port 8000 (the README's) is taken"
    clone = fresh_clone
    broker = Mosquitto(tmp_path / "broker").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")}
    env |= {"ZEAL_MQTT_URL": broker.url, "PYTHONUNBUFFERED": "1"}
    background: list[tuple[str, subprocess.Popen[str]]] = []
    outputs: dict[str, str] = {}
    # What the long-running commands print goes to files, never to a pipe nobody reads
    # until the end: a full pipe (the server's access log, while the walkthrough polls it
    # on a busy machine) stopped the server mid-request.
    printed: dict[str, Path] = {}
    try:
        for command in walkthrough():
            if any(marker in command for marker in LONG_RUNNING):
                printed[command] = tmp_path / f"background-{len(printed)}.log"
                with printed[command].open("w") as out:
                    process = subprocess.Popen(
                        ["bash", "-c", f"exec {command}"],
                        cwd=clone,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                background.append((command, process))
                if "serve" in command:
                    wait_for_server(process)
                continue
            if "/average" in command:
                outputs[command] = wait_for_average(command, clone, env)
                continue
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=clone,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
            outputs[command] = done.stdout
        status = next(out for command, out in outputs.items() if "zeal-edge status" in command)
        assert "temps/kitchen-1" in status, status
        assert "temps/kitchen-2" in status, status
        assert "confirmed" in status, status
    finally:
        logs = {}
        for command, process in reversed(background):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            logs[command] = printed[command].read_text()
        broker.stop()
    for command, process in background:
        assert process.returncode == 0, (command, logs[command][-3000:])
        if "zeal-edge run" in command:
            assert "queued" in logs[command], logs[command][-2000:]
            assert "confirmed by the broker" in logs[command], logs[command][-2000:]
    average = json.loads(next(out for command, out in outputs.items() if "/average" in command))
    assert average["stream"] == "temps"
    assert average["estimate"] is not None
    untracked = subprocess.run(
        ["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    assert untracked == "", untracked


def wait_for_server(process: subprocess.Popen[str], timeout: float = 60) -> None:
    def listening() -> bool:
        assert process.poll() is None, "the server exited (its output is in the test's tmp_path)"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", 8000)) == 0

    wait_until(listening, timeout, "the server listening on port 8000")


def wait_for_average(command: str, clone: Path, env: dict[str, str], timeout: float = 90) -> str:
    """Run the README's curl until the average covers readings of both agents."""
    answered = [""]

    def covered() -> bool:
        out = answered[0] = subprocess.run(
            ["bash", "-c", command],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        try:
            body = json.loads(out)
        except json.JSONDecodeError:
            body = {}
        if not (body.get("estimate") and body.get("n", 0) >= 20):
            return False
        devices = subprocess.run(
            ["bash", "-c", command.replace("/average", "/devices")],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        return {"kitchen-1", "kitchen-2"} <= {d["name"] for d in json.loads(devices)["devices"]}

    wait_until(covered, timeout, "an average covering both agents")
    return answered[0]
