"""Field mistakes that used to lose data or budget silently, with a real broker and server:
a reset outbox, two servers on one machine, a stream created by another process, a stream
that is deleted under a running agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.server.helpers import (
    agent_command,
    create_stream,
    save_config,
    server_app,
    stats,
    wait_until,
)
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, agent_status
from tools.testbed.server import Server, stream_body
from zeal import encode_batch
from zeal.mqtt.streamconfig import params_from_config

pytestmark = pytest.mark.integration
CREATE = ["--lower", "0", "--upper", "110", "--epsilon", "1"]


def run_agent(
    data_dir: Path, broker: Mosquitto, params: Path, readings: int, *, stream: str = "temps"
) -> subprocess.CompletedProcess[str]:
    """An agent that sends `readings` readings from stdin in batches of 10, then exits."""
    return subprocess.run(
        agent_command(
            data_dir, broker, params, "--batch", "10", "--batch-seconds", "1", stream=stream
        ),
        input="".join(f"{40 + i % 30}\n" for i in range(readings)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_agent_whose_data_dir_was_deleted_stores_all_its_new_readings(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """Run, delete the data directory, run again: the second run starts its sequence numbers
    at 0 again, and every reading of both runs is stored (40 of 40), the reset counted."""
    agent_dir = tmp_path / "agent"
    with TestClient(server_app(database_url, broker)) as client:
        create_stream(client)
        wait_until(lambda: state(client).collector.broker_connected, what="collector")
        params = save_config(client, tmp_path / "params.json")
        for _ in range(2):
            shutil.rmtree(agent_dir, ignore_errors=True)
            result = run_agent(agent_dir, broker, params, 20)
            assert result.returncode == 0, result.stderr
        try:
            wait_until(lambda: stats(client)["readings"] == 40, timeout=20, what="40 readings")
        finally:
            got = stats(client)
        assert (got["readings"], got["messages"]) == (40, 4)
        assert got["sequence_resets"] == 2
        assert got["duplicates"] == 0
        device = client.get("/api/v1/streams/temps/devices").json()["devices"][0]
        assert (device["readings"], device["sequence_resets"]) == (40, 2)


def test_a_stream_created_by_the_cli_gets_its_retained_config_within_5_s(
    database_url: str, broker: Mosquitto
) -> None:
    """A stream written to the database by another process while the server runs (another
    server on the same database, or `zeal-server streams create --local`): the running
    collector retains the new stream's configuration on the broker within 5 s."""
    got: dict[str, tuple[float, bytes]] = {}
    listener = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    listener.on_message = lambda c, u, m: got.setdefault(m.topic, (time.monotonic(), m.payload))
    listener.connect("127.0.0.1", broker.port)
    listener.subscribe("zeal/v1/+/config", qos=1)
    listener.loop_start()
    try:
        with TestClient(server_app(database_url, broker)) as client:
            wait_until(lambda: state(client).collector.broker_connected, what="collector")
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "zeal_server",
                    "streams",
                    "create",
                    "cli-temps",
                    *CREATE,
                    "--local",
                ],
                env={**os.environ, "ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off"},
                capture_output=True,
                text=True,
                check=False,
            )
            created = time.monotonic()
            assert result.returncode == 0, result.stderr
            # A device that had the configuration at once (--params) sends right away: the
            # collector looks the stream up again instead of rejecting it as unknown.
            params = params_from_config(client.get("/api/v1/streams/cli-temps/config").json())
            batch = encode_batch(
                params,
                stream="cli-temps",
                device="d1",
                sequence=0,
                timestamps=[int(time.time() * 1000)],
                codes=params.perturb(np.array([50.0])),
            )
            listener.publish("zeal/v1/cli-temps/d1/up", batch, qos=1).wait_for_publish(5)
            wait_until(lambda: "zeal/v1/cli-temps/config" in got, timeout=10, what="config")
            arrived, payload = got["zeal/v1/cli-temps/config"]
            print(f"retained configuration after {arrived - created:.2f} s")
            assert arrived - created <= 5.0
            assert json.loads(payload) == client.get("/api/v1/streams/cli-temps/config").json()
            wait_until(
                lambda: stats(client, "cli-temps")["readings"] == 1, timeout=10, what="the batch"
            )
            assert stats(client, "cli-temps")["rejects"] == {}
    finally:
        listener.disconnect()
        listener.loop_stop()


def test_an_agent_stops_within_one_batch_once_its_stream_is_deleted(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """The operator deletes the stream (CLI, another process) while an agent sends: the agent
    privatizes at most one more batch, exits with status 3 saying why, and `zeal-edge
    status` shows it halted; started again it refuses at once, until `zeal-edge resume`."""
    agent_dir = tmp_path / "agent"
    with TestClient(server_app(database_url, broker)) as client:
        create_stream(client)
        wait_until(lambda: state(client).collector.broker_connected, what="collector")
        params = save_config(client, tmp_path / "params.json")
        agent = subprocess.Popen(
            agent_command(agent_dir, broker, params, "--batch", "5", "--batch-seconds", "0.5"),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert agent.stdin is not None
        try:
            agent.stdin.write("50\n" * 5)
            agent.stdin.flush()
            wait_until(lambda: stats(client)["readings"] == 5, timeout=20, what="first batch")
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "zeal_server",
                    "streams",
                    "delete",
                    "temps",
                    "--confirm",
                    "temps",
                    "--local",  # the server runs in this process: its database, directly
                ],
                env={**os.environ, "ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off"},
                capture_output=True,
                text=True,
                check=False,
            )
            assert result.returncode == 0, result.stdout + result.stderr

            def feed() -> None:  # a sensor that keeps producing: a batch a second
                for _ in range(30):
                    try:
                        agent.stdin.write("50\n" * 5)  # type: ignore[union-attr]
                        agent.stdin.flush()  # type: ignore[union-attr]
                    except (BrokenPipeError, ValueError, OSError):
                        return
                    time.sleep(1.0)  # time is the scenario: a sensor read once a second

            threading.Thread(target=feed, daemon=True).start()
            err = agent.stderr.read() if agent.stderr else ""  # until the agent exits
            code = agent.wait(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            for pipe in (agent.stdin, agent.stderr):
                if pipe is not None:
                    pipe.close()
    assert code == 3, err[-3000:]
    assert "temps" in err
    assert "deleted" in err or "no longer" in err, err[-3000:]
    record = agent_status(agent_dir)[0]
    assert record["halted"] is not None
    # Batch 0 was stored; after the deletion at most one more batch was privatized.
    assert record["next_sequence"] <= 2, record
    # Started again with the same configuration, it refuses before privatizing anything.
    again = subprocess.run(
        agent_command(agent_dir, broker, params, "--batch", "1"),
        input="50\n" * 5,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 3, again.stderr
    assert "no longer accepted by its server" in again.stderr
    after = agent_status(agent_dir)[0]
    assert after["next_sequence"] == record["next_sequence"]
    resumed = subprocess.run(
        [sys.executable, "-m", "zeal_edge", "resume", "--data-dir", str(agent_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "halt cleared" in resumed.stdout


def test_two_servers_on_one_machine_run_side_by_side(broker: Mosquitto, tmp_path: Path) -> None:
    """Two `zeal-server serve` with their default settings in two directories of one machine,
    one broker: neither takes the other's MQTT session (one connect each in 10 s, no
    takeover in the broker's log), each stores all of its own stream's readings, and the
    agents are not stopped by the server that does not know their stream."""
    servers = []
    for name in ("north", "south"):
        home = tmp_path / name
        home.mkdir()
        servers.append(
            Server(None, broker, tmp_path / f"{name}.log", collector_id=None, cwd=home).start()
        )
    try:
        began = time.monotonic()
        results = []
        for name, server in zip(("north", "south"), servers, strict=True):
            assert server.http.post("/api/v1/streams", json=stream_body(name)).status_code == 201
            params = save_config(server.http, tmp_path / f"{name}.json", name)
            results.append(run_agent(tmp_path / f"agent-{name}", broker, params, 30, stream=name))
        for result in results:
            assert result.returncode == 0, result.stderr
        for name, server in zip(("north", "south"), servers, strict=True):

            def readings(server: Server = server, name: str = name) -> int:
                path = f"/api/v1/streams/{name}/stats?efficiency=false"
                return int(server.http.get(path).json()["readings"])

            wait_until(lambda readings=readings: readings() == 30, timeout=20, what=name)
        # Time is what is tested: 10 s in, no collector has knocked another off the broker.
        time.sleep(max(0.0, began + 10 - time.monotonic()))
        for server in servers:
            health = server.http.get("/healthz").json()
            assert health["broker"] == "ok", health
            assert health["collector"]["connects"] == 1, health
    finally:
        for server in servers:
            server.stop()
    assert "already connected" not in (broker.directory / "mosquitto.log").read_text()
