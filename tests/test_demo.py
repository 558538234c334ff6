"""`make demo` from a fresh clone: reaches the served average, and Ctrl-C leaves nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.mqtt_helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = re.compile(r"dashboard: (http://\S+/)")
SERVED = re.compile(r"served average +[0-9.]+ F .* true average +[0-9.]+ F")
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines()[1:] if text in line and "ps -eo" not in line]


def test_make_demo_from_a_fresh_clone(tmp_path: Path) -> None:
    """No broker at ZEAL_MQTT_URL: the demo starts one, prints the served average within
    3 minutes of `make demo` (environment included), and SIGINT stops every process."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "ZEAL_MQTT_URL": f"mqtt://127.0.0.1:{free_port()}"}
    demo = subprocess.Popen(
        ["make", "demo"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(demo.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < 180 and not any(SERVED.search(line) for line in lines):
            assert demo.poll() is None, "".join(lines[-30:])
            time.sleep(1)
        assert any(SERVED.search(line) for line in lines), "".join(lines[-30:])
        assert any("started mosquitto" in line for line in lines)
        url = next(m.group(1) for line in lines if (m := DASHBOARD.search(line)))
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"/dashboard/app.js" in response.read()
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        demo.wait(timeout=60)
        time.sleep(2)
        assert processes_mentioning(str(clone)) == []
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for line in processes_mentioning(str(clone)):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    print(
        f"served average after {time.monotonic() - started:.0f} s: "
        f"{next(line for line in lines if SERVED.search(line)).strip()}"
    )
