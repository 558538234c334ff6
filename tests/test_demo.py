"""`make demo` from a fresh clone: reaches the served average, and Ctrl-C, SIGTERM or
SIGHUP leave nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tools.testbed.broker import Mosquitto, free_port
from tools.testbed.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = re.compile(r"dashboard: (http://\S+/)")
SERVED = re.compile(r"served average +[0-9.]+ degF .* true average +[0-9.]+ degF")
# One worker runs both files: they share fresh_clone's environment (and port 8000).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("fresh_clone")]


def processes_mentioning(text: str) -> list[str]:
    # -ww: inside pytest COLUMNS=80 would cut the command lines (and the paths in them)
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines()[1:] if text in line and "ps -ww" not in line]


#: How long a stopping demo may take at most: its 200 devices, server and broker stop in a
#: few seconds, but a machine with every core busy (stress-ng beside CI) stretched it past 60.
SHUTDOWN_SECONDS = 180


def test_make_demo_from_a_fresh_clone(fresh_clone: Path) -> None:
    """No broker at ZEAL_MQTT_URL: the demo starts one, prints the served average within
    3 minutes of `make demo` (its environment included when this test runs first in the
    shared clone), and SIGINT stops every process."""
    clone = fresh_clone
    env = {**os.environ, "ZEAL_MQTT_URL": f"mqtt://127.0.0.1:{free_port()}"}
    demo = subprocess.Popen(
        ["make", "demo"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(demo.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    started = time.monotonic()
    try:
        wait_until(lambda: serving(demo, lines), 180, "the demo serving")
        assert any("started mosquitto" in line for line in lines)
        url = next(m.group(1) for line in lines if (m := DASHBOARD.search(line)))
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"/dashboard/app.js" in response.read()
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        demo.wait(timeout=SHUTDOWN_SECONDS)
        gone = lambda: processes_mentioning(str(clone)) == []  # noqa: E731
        wait_until(gone, 30, f"no process of the demo left: {processes_mentioning(str(clone))}")
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for line in processes_mentioning(str(clone)):
            os.kill(int(line.split()[0]), signal.SIGKILL)
        demo.wait(timeout=30)
        reader.join(timeout=10)
        demo.stdout.close()  # type: ignore[union-attr]
    print(
        f"served average after {time.monotonic() - started:.0f} s: "
        f"{next(line for line in lines if SERVED.search(line)).strip()}"
    )


def close_demo(demo: subprocess.Popen[str]) -> None:
    """After the demo has stopped: its output read to the end, its pipe closed."""
    demo.wait(timeout=SHUTDOWN_SECONDS)
    _readers.pop(demo.pid).join(timeout=10)
    demo.stdout.close()  # type: ignore[union-attr]


#: The thread reading each running demo's output, by process id.
_readers: dict[int, threading.Thread] = {}


def sigint_as_in_a_terminal() -> None:
    """A terminal's foreground job takes Ctrl-C (SIGINT) at its default; under a test run
    started in the background (`cmd &` without job control) SIGINT is ignored, and a child
    inherits that, so the demo would not see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_demo_until_serving(clone: Path, broker_url: str) -> tuple[subprocess.Popen[str], list[str]]:
    """tools/demo.py of `clone` (with this environment's Python), until it serves averages."""
    demo = subprocess.Popen(
        [sys.executable, "tools/demo.py"],
        cwd=clone,
        env={**os.environ, "ZEAL_MQTT_URL": broker_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    lines: list[str] = []
    _readers[demo.pid] = threading.Thread(
        target=lambda: lines.extend(iter(demo.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    _readers[demo.pid].start()
    wait_until(lambda: serving(demo, lines), 120, "the demo serving")
    return demo, lines


def serving(demo: subprocess.Popen[str], lines: list[str]) -> bool:
    """The demo said it serves (and has not ended before)."""
    if any(SERVED.search(line) for line in lines):
        return True
    assert demo.poll() is None, "".join(lines[-30:])
    return False


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_the_demo_stops_everything_it_started_on_sighup_and_sigterm(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Closing the terminal (SIGHUP to the process group) or SIGTERM stops the demo, its
    server, its broker and its 200-device fleet, as Ctrl-C does."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    demo, lines = run_demo_until_serving(clone, f"mqtt://127.0.0.1:{free_port()}")
    port = next(m.group(1) for line in lines if (m := DASHBOARD.search(line))).split(":")[-1]
    port = port.strip("/")
    mine = [*processes_mentioning(str(clone)), *processes_mentioning(f"--port {port}")]
    assert len(mine) >= 3, mine  # demo, broker, fleet (and the server, by its port)
    try:
        os.killpg(demo.pid, sig)
        demo.wait(timeout=SHUTDOWN_SECONDS)

        def gone() -> bool:
            return processes_mentioning(str(clone)) + processes_mentioning(f"--port {port}") == []

        wait_until(gone, 30, "no process of the demo left")
        assert any("stopping the demo" in line for line in lines), "".join(lines[-20:])
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for line in processes_mentioning(str(clone)) + processes_mentioning(f"--port {port}"):
            os.kill(int(line.split()[0]), signal.SIGKILL)
        close_demo(demo)


def test_the_demo_withdraws_its_configuration_from_a_broker_that_outlives_it(
    tmp_path: Path,
) -> None:
    """On a broker it did not start, the demo's retained stream configuration is gone after
    the demo stops: a later agent cannot configure itself for a server that is gone."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    broker = Mosquitto(tmp_path / "broker").start()
    demo: subprocess.Popen[str] | None = None
    try:
        demo, _ = run_demo_until_serving(clone, broker.url)
        assert retained(broker.port, "zeal/v1/demo-temps/config") != b""
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=SHUTDOWN_SECONDS)
        assert retained(broker.port, "zeal/v1/demo-temps/config") == b""
    finally:
        if demo is not None:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
            close_demo(demo)
        broker.stop()


def retained(port: int, topic: str) -> bytes:
    """The retained message of a topic (b"" when there is none). The broker sends it while
    it handles the subscription; a sentinel published after the SUBACK comes behind it."""
    got: list[tuple[str, bytes]] = []
    sentinel = f"test/sentinel/{os.getpid()}/{time.monotonic_ns()}"
    subscribed = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.on_message = lambda c, u, m: got.append((m.topic, bytes(m.payload)))
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        client.subscribe([(topic, 1), (sentinel, 1)])
        assert subscribed.wait(30), "no SUBACK"
        client.publish(sentinel, b"", qos=1).wait_for_publish(30)
        wait_until(lambda: any(t == sentinel for t, _ in got), 30, "the sentinel")
    finally:
        client.disconnect()
        client.loop_stop()
    payloads = [p for t, p in got if t != sentinel]
    return payloads[0] if payloads else b""
