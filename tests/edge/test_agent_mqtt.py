"""The edge agent against real Mosquitto brokers: delivery, outages, crashes, budget, simulator."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.helpers import signed
from tools.testbed.broker import (
    Mosquitto,
    Subscriber,
    agent_status,
    agent_status_text,
    free_port,
    publish_retained,
)
from tools.testbed.wait import wait_until
from zeal import Zeal, decode_batch
from zeal.mqtt.streamconfig import config_document
from zeal_edge.agent import UNSERVED_WAIT

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[2] / "data" / "seattle-temps.csv"
PARAMS = Zeal(lower=0, upper=110, epsilon=1)


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(config_document("temps", PARAMS)))
    return path


@pytest.fixture
def collector(broker: Mosquitto) -> Iterator[Subscriber]:
    """What stands in for the collector: a persistent subscription to every device's data.
    Without one the broker answers a publish "no matching subscribers" and drops it, and
    the agent keeps the batch and sends it again until one subscribes."""
    stand_in = Subscriber(broker.port)
    yield stand_in
    stand_in.close()


def first_rows(tmp_path: Path, n: int) -> tuple[Path, list[float]]:
    """A CSV with the first n Seattle readings (date,temp), and those readings."""
    with DATA.open(newline="") as handle:
        rows = list(csv.DictReader(handle))[:n]
    path = tmp_path / f"seattle-{n}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["date", "temp"])
        writer.writeheader()
        writer.writerows(rows)
    return path, [float(r["temp"]) for r in rows]


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_agent_left_behind() -> Iterator[None]:
    """Whatever a test asserts, the agents it started do not outlive it."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def start_agent(
    data_dir: Path, broker_url: str, *args: str, stdin: int | None = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "zeal_edge",
        "run",
        "--stream",
        "temps",
        "--device",
        "dev1",
        "--broker",
        broker_url,
        "--data-dir",
        str(data_dir),
        *args,
    ]
    proc = subprocess.Popen(
        command,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _started.append(proc)
    return proc


def read_until(agent: subprocess.Popen[str], text: str) -> str:
    """The agent's log up to and including its first line holding `text` (read as it comes:
    the agent is waited for, not the clock)."""
    assert agent.stderr is not None
    said: list[str] = []
    for line in iter(agent.stderr.readline, ""):
        said.append(line)
        if text in line:
            return "".join(said)
    raise AssertionError(f"the agent ended without saying {text!r}: {''.join(said)[-3000:]}")


def unconfirmed(data_dir: Path) -> int:
    """Batches in the agent's outbox (a confirmed one is deleted); 0 before it exists."""
    try:
        with sqlite3.connect(data_dir / "outbox.sqlite") as conn:
            return int(conn.execute("SELECT count(*) FROM batches").fetchone()[0])
    except sqlite3.OperationalError:  # not made yet, or the agent is making its tables
        return 0


def batches_by_sequence(messages: list[tuple[str, bytes]]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for topic, payload in messages:
        assert topic == "zeal/v1/temps/dev1/up"
        out.setdefault(
            decode_batch(payload, PARAMS, stream="temps", device="dev1").sequence, []
        ).append(payload)
    return out


def codes_received(messages: list[tuple[str, bytes]]) -> int:
    return sum(
        len(decode_batch(p[0], PARAMS, stream="temps", device="dev1"))
        for p in batches_by_sequence(messages).values()
    )


def test_replay_of_1000_readings_arrives_exactly(tmp_path: Path, broker: Mosquitto) -> None:
    """The agent waits for the retained config, then delivers exactly 1,000 decodable codes."""
    csv_path, readings = first_rows(tmp_path, 1000)
    sub = Subscriber(broker.port)
    agent = start_agent(
        tmp_path / "agent",
        broker.url,
        "--source",
        f"csv:{csv_path}",
        "--batch",
        "60",
        "--batch-seconds",
        "1",
    )
    said = read_until(agent, "waiting for stream parameters")
    assert not sub.settled()  # nothing leaves before a configuration
    publish_retained(
        broker.port,
        "zeal/v1/temps/config",
        json.dumps(signed(config_document("temps", PARAMS))).encode(),
    )
    _, err = agent.communicate(timeout=60)
    err = said + err
    assert agent.returncode == 0, err
    assert "waiting for stream parameters on zeal/v1/temps/config" in err
    got = sub.wait_for(lambda m: codes_received(m) >= 1000)
    sub.close()
    batches = batches_by_sequence(got)
    assert sorted(batches) == list(range(17))
    codes = np.concatenate(
        [
            decode_batch(b[0], PARAMS, stream="temps", device="dev1").codes
            for _, b in sorted(batches.items())
        ]
    )
    assert codes.size == 1000
    estimate = PARAMS.estimate_mean(codes)
    assert abs(estimate.mean - np.mean(readings)) <= 5 * estimate.std_error
    assert str(readings[0]) not in err  # no raw reading in the log


def test_broker_outage_loses_nothing_and_resends_the_same_bytes(
    tmp_path: Path, broker: Mosquitto, params_file: Path
) -> None:
    """Broker stopped mid-run and restarted: every batch arrives; copies are byte-identical."""
    csv_path, _ = first_rows(tmp_path, 1000)
    sub = Subscriber(broker.port)
    agent = start_agent(
        tmp_path / "agent",
        broker.url,
        "--source",
        f"csv:{csv_path}",
        "--speedup",
        str(3600 * 200),
        "--batch",
        "20",
        "--batch-seconds",
        "0.5",
        "--params",
        str(params_file),
    )
    sub.wait_for(lambda m: len(m) >= 1)  # the first batch arrived before the outage
    broker.stop()
    # The source keeps producing: batches pile up in the outbox while no broker answers.
    wait_until(lambda: unconfirmed(tmp_path / "agent") >= 5, 60, "batches piled up")
    broker.start()
    _, err = agent.communicate(timeout=90)
    assert agent.returncode == 0, err
    assert "disconnected from" in err
    got = sub.wait_for(lambda m: len(batches_by_sequence(m)) >= 50, timeout=30)
    sub.close()
    batches = batches_by_sequence(got)
    missing = sorted(set(range(50)) - set(batches))
    assert not missing, (missing, err[-3000:], broker.log_tail())
    assert sorted(batches) == list(range(50))
    assert all(len(set(copies)) == 1 for copies in batches.values())
    assert (
        sum(
            len(decode_batch(c[0], PARAMS, stream="temps", device="dev1")) for c in batches.values()
        )
        == 1000
    )


def test_sigkill_with_unsent_batches_then_restart_sends_each_once(
    tmp_path: Path, params_file: Path
) -> None:
    """Batches committed while no broker answers survive SIGKILL and are sent once on restart."""
    csv_path, _ = first_rows(tmp_path, 300)
    port = free_port()
    data_dir = tmp_path / "agent"
    agent = start_agent(
        data_dir,
        f"mqtt://127.0.0.1:{port}",
        "--source",
        f"csv:{csv_path}",
        "--batch",
        "30",
        "--batch-seconds",
        "0.2",
        "--params",
        str(params_file),
    )
    wait_until(lambda: unconfirmed(data_dir) >= 10, 30, "10 batches in the outbox")
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=10)
    with sqlite3.connect(data_dir / "outbox.sqlite") as conn:
        rows = conn.execute("SELECT sequence, payload FROM batches").fetchall()
    stored = {s: bytes(p) for s, p in rows}
    assert len(stored) == 10, (stored.keys(), agent.stderr.read() if agent.stderr else "")

    broker = Mosquitto(tmp_path / "broker", port=port).start()
    try:
        sub = Subscriber(port)
        again = start_agent(
            data_dir,
            broker.url,
            "--source",
            f"csv:{csv_path}",
            "--batch",
            "30",
            "--params",
            str(params_file),
        )
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0, err
        got = sub.settled()  # all it sent, and nothing sent twice after
        sub.close()
    finally:
        broker.stop()
    batches = batches_by_sequence(got)
    assert sorted(batches) == list(range(10)), (sorted(batches), err[-3000:], broker.log_tail())
    assert all(len(copies) == 1 for copies in batches.values())  # none sent twice
    assert all(batches[s][0] == stored[s] for s in stored)  # the very bytes committed before


def test_budget_cap_stops_the_eleventh_reading(
    tmp_path: Path, broker: Mosquitto, params_file: Path
) -> None:
    """Cap of 10 readings' epsilon: 10 codes are sent, the 11th is not, status says why."""
    sub = Subscriber(broker.port)
    data_dir = tmp_path / "agent"
    agent = start_agent(
        data_dir,
        broker.url,
        "--source",
        "stdin",
        "--batch",
        "1",
        "--batch-seconds",
        "0.1",
        "--params",
        str(params_file),
        "--budget-cap",
        "10",
        "--budget-window-seconds",
        "86400",
        stdin=subprocess.PIPE,
    )
    _, err = agent.communicate("\n".join(["50.0"] * 11) + "\n", timeout=60)
    assert agent.returncode == 0, err
    assert "privacy budget cap reached" in err
    got = sub.settled()  # the agent has exited: all it sent is before the sentinel
    sub.close()
    assert codes_received(got) == 10
    assert len(got) == 10
    status = agent_status_text(data_dir)
    assert "10.000000 epsilon spent in the last 86400 s (cap 10.000000" in status
    assert "budget remaining  0.000000 epsilon" in status
    assert "BUDGET EXHAUSTED  1 reading(s) not perturbed or sent" in status
    assert "confirmed         10 batches, 10 readings" in status


def test_simulator_runs_many_devices_with_their_own_sequences(
    tmp_path: Path, broker: Mosquitto, params_file: Path
) -> None:
    """simulate: 25 devices x 120 readings arrive as 2 batches each, sequences per device."""
    sub = Subscriber(broker.port)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeal_edge",
            "simulate",
            "--devices",
            "25",
            "--source",
            f"csv:{DATA}",
            "--stream",
            "temps",
            "--broker",
            broker.url,
            "--params",
            str(params_file),
            "--rate",
            "0",
            "--readings",
            "120",
            "--data-dir",
            str(tmp_path / "sim"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "3000 readings in 50 batches, 3000 acknowledged" in result.stdout
    got = sub.wait_for(lambda m: len(m) >= 50, timeout=15)
    sub.close()
    seen: dict[str, set[int]] = {}
    for topic, payload in got:
        device = topic.split("/")[3]
        batch = decode_batch(payload, PARAMS, stream="temps", device=device)
        assert len(batch) == 60
        assert batch.periodic
        seen.setdefault(device, set()).add(batch.sequence)
    assert len(seen) == 25
    assert all(s == {0, 1} for s in seen.values())


def test_bad_settings_fail_fast_with_a_clear_message(tmp_path: Path) -> None:
    """Invalid settings exit with status 2 and say which setting is wrong."""
    for args, message in (
        (["--source", "csv:/nonexistent.csv"], "No such file"),
        (["--source", "bogus"], "unknown source 'bogus'"),
        (["--source", "stdin", "--batch", "0"], "--batch='0' is invalid"),
        (["--source", "stdin", "--broker", "http://x"], "must look like mqtt://host:port"),
        (["--source", "stdin", "--device", "a/b"], "device name 'a/b' is invalid"),
    ):
        command = [
            sys.executable,
            "-m",
            "zeal_edge",
            "run",
            "--stream",
            "temps",
            "--data-dir",
            str(tmp_path / "agent"),
            *args,
        ]
        if "--device" not in args:
            command += ["--device", "dev1"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr, proc.stderr


def test_a_second_agent_with_the_same_device_id_gets_a_clear_error(
    tmp_path: Path, broker: Mosquitto, params_file: Path, collector: Subscriber
) -> None:
    """Two agents, two data directories, one device id: the second exits with status 3 and
    says the device is running elsewhere; the first is never knocked off the broker."""
    first = start_agent(
        tmp_path / "one",
        broker.url,
        "--source",
        "stdin",
        "--params",
        str(params_file),
        stdin=subprocess.PIPE,
    )
    read_until(first, "connected to")
    second = start_agent(
        tmp_path / "two",
        broker.url,
        "--source",
        "stdin",
        "--params",
        str(params_file),
        stdin=subprocess.PIPE,
    )
    try:
        _, err = second.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        second.kill()
        _, err = second.communicate()
        pytest.fail(f"the second agent kept running:\n{err[-3000:]}")
    assert second.returncode == 3, err
    assert "device dev1 of stream temps is already running" in err, err
    assert first.poll() is None
    _, first_err = first.communicate("50\n" * 3, timeout=30)
    assert first.returncode == 0, first_err
    assert "disconnected" not in first_err, first_err


def test_nan_and_inf_cells_are_skipped_and_counted_and_the_rest_is_sent(
    tmp_path: Path, broker: Mosquitto, params_file: Path
) -> None:
    """A CSV with NaN, inf and -inf cells among 10 rows: those 3 rows are skipped, named in
    the log and counted in the status; the 7 other readings are sent in the same batch."""
    csv_path = tmp_path / "cells.csv"
    cells = ["50", "nan", "51", "inf", "52", "-inf", "53", "54", "55", "56"]
    csv_path.write_text(
        "date,temp\n" + "".join(f"2010/01/01 {i:02d}:00,{c}\n" for i, c in enumerate(cells))
    )
    sub = Subscriber(broker.port)
    data_dir = tmp_path / "agent"
    agent = start_agent(
        data_dir,
        broker.url,
        "--source",
        f"csv:{csv_path}",
        "--batch",
        "60",
        "--batch-seconds",
        "1",
        "--params",
        str(params_file),
    )
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    for row in (3, 5, 7):  # the header is row 1
        assert f"row {row}: column 'temp' is not a finite number; skipped" in err, err
    got = sub.wait_for(lambda m: codes_received(m) >= 7, timeout=15)
    sub.close()
    assert codes_received(got) == 7
    assert len(batches_by_sequence(got)) == 1
    assert agent_status(data_dir)[0]["skipped_invalid"] == 3


def test_readings_outside_the_range_are_counted_and_said_once_per_side(
    tmp_path: Path, broker: Mosquitto, params_file: Path, collector: Subscriber
) -> None:
    """On a 0..110 stream, readings of 200 and -50 are sent as the range's ends (as before),
    and now counted by side in the status and logged the first time on each side. Before:
    nothing said it."""
    csv_path = tmp_path / "wide.csv"
    cells = ["50", "200", "-50", "300", "51", "-1"]
    csv_path.write_text("temp\n" + "".join(f"{c}\n" for c in cells))
    data_dir = tmp_path / "agent"
    agent = start_agent(
        data_dir,
        broker.url,
        *("--source", f"csv:{csv_path}", "--batch", "3", "--batch-seconds", "1"),
        *("--params", str(params_file)),
    )
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    for side, end in (("below", "lower"), ("above", "upper")):
        said = f"readings {side} its range [0, 110] are sent as its {end} end"
        assert err.count(said) == 1, err
    (status,) = agent_status(data_dir)
    assert (status["clipped_below_range"], status["clipped_above_range"]) == (2, 2)
    text = agent_status_text(data_dir)
    assert "2 reading(s) below the stream's range, 2 above it" in text, text


def test_an_unreachable_broker_is_said_and_unconfirmed_batches_are_reported_on_exit(
    tmp_path: Path, params_file: Path
) -> None:
    """No broker: the log names its address and the cause, the batch is 'queued' (not
    'sent'), and Ctrl-C says how many batches and readings are left unconfirmed."""
    port = free_port()
    agent = start_agent(
        tmp_path / "agent",
        f"mqtt://127.0.0.1:{port}",
        *("--source", "stdin", "--batch", "5", "--params", str(params_file)),
        stdin=subprocess.PIPE,
    )
    assert agent.stdin is not None
    agent.stdin.write("50\n" * 5)
    agent.stdin.flush()
    # The presence check gives the broker 5 s, then the agent goes on offline and queues.
    said = read_until(agent, "queued (1 batch awaiting the broker")
    agent.send_signal(signal.SIGINT)
    _, err = agent.communicate(timeout=30)
    err = said + err
    assert agent.returncode == 0, err
    assert (
        f"cannot connect to the broker at mqtt://127.0.0.1:{port}: [Errno 111] Connection refused"
        in err
    ), err
    assert "batch #0: 5 readings" in err
    assert f"queued (1 batch awaiting the broker; not connected to mqtt://127.0.0.1:{port})" in err
    assert "stopping with 1 batches (5 readings) not confirmed by the broker" in err
    assert "sent" not in err.replace("sent on the next start", "")


def test_an_agent_whose_client_id_is_used_twice_says_so_and_stops_fighting(
    tmp_path: Path, broker: Mosquitto, params_file: Path
) -> None:
    """A client that keeps connecting with the agent's own client id (a copy of its data
    directory running elsewhere): the agent says so after 3 lost connections and waits
    60 s instead of knocking the other one off every second."""
    agent = start_agent(
        tmp_path / "agent",
        broker.url,
        "--source",
        "stdin",
        "--params",
        str(params_file),
        stdin=subprocess.PIPE,
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(agent.stderr.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    ).start()
    wait_until(lambda: any("connected to" in line for line in lines), 30, "the agent connected")
    with sqlite3.connect(tmp_path / "agent" / "outbox.sqlite") as db:
        (instance,) = db.execute("SELECT instance FROM namespaces").fetchone()
    twin = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"zeal-edge-temps-dev1-{instance[:8]}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    twin.reconnect_delay_set(min_delay=1, max_delay=1)
    twin.connect("127.0.0.1", broker.port)
    twin.loop_start()
    try:
        said = lambda: any("3 times" in line for line in lines)  # noqa: E731
        with contextlib.suppress(AssertionError):  # said below, with the log
            wait_until(said, 30, "the agent's word on the twin")
        assert any(
            "closed this agent's connection 3 times within a minute" in line
            and "is a copy of this data directory running elsewhere" in line
            for line in lines
        ), "".join(lines[-20:])
        connected = sum("connected to" in line for line in lines)
        # Time is what is tested: the agent holds off 60 s after the third lost connection,
        # so within these 5 s (the twin reconnects every second) it must not connect again.
        time.sleep(5)
        assert sum("connected to" in line for line in lines) == connected  # no fight
    finally:
        twin.disconnect()
        twin.loop_stop()
        agent.kill()
        agent.wait()


def test_a_stream_no_server_serves_is_said_and_its_entry_can_be_forgotten(
    tmp_path: Path, broker: Mosquitto, collector: Subscriber
) -> None:
    """A misspelt stream (temp, while a server retains temps) ends the agent with exit
    status 2 naming the streams served, instead of waiting forever; `zeal-edge forget`
    removes the entry the run left in `zeal-edge status`. With --wait the agent waits and
    takes the stream once it is created. Before: waiting for stream parameters, forever."""
    config = json.dumps(signed(config_document("temps", PARAMS, server="zs-1"))).encode()
    publish_retained(broker.port, "zeal/v1/temps/config", config)
    data_dir = tmp_path / "agent"
    typo = [sys.executable, "-m", "zeal_edge", "run", "--stream", "temp", "--device", "dev1"]
    typo += ["--broker", broker.url, "--data-dir", str(data_dir), "--source", "stdin"]
    ended = subprocess.run(typo, capture_output=True, text=True, timeout=120, check=False)
    assert ended.returncode == 2, ended.stderr
    assert "no server at" in ended.stderr, ended.stderr
    assert "serves stream 'temp'; the streams served there: temps" in ended.stderr
    assert "stopping: nothing was sent" in ended.stderr  # not "every batch was confirmed"
    assert [s["stream"] for s in agent_status(data_dir)] == ["temp"]
    edge = [sys.executable, "-m", "zeal_edge"]
    forgot = subprocess.run(
        [*edge, "forget", "temp/dev1", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert forgot.returncode == 0, forgot.stderr
    assert agent_status(data_dir) == []
    unknown = subprocess.run(
        [*edge, "forget", "temp/dev1", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert unknown.returncode == 1
    assert "no entry 'temp/dev1' here" in unknown.stderr

    waiting = subprocess.Popen(
        [*typo, "--wait"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _started.append(waiting)
    assert waiting.stderr is not None
    while "waiting for stream parameters" not in waiting.stderr.readline():
        assert waiting.poll() is None
    time.sleep(UNSERVED_WAIT + 2)  # past the point where it would have ended without --wait
    assert waiting.poll() is None
    publish_retained(
        broker.port,
        "zeal/v1/temp/config",
        json.dumps(signed(config_document("temp", PARAMS, server="zs-1"))).encode(),
    )
    _, err = waiting.communicate("50\n" * 3, timeout=60)
    assert waiting.returncode == 0, err
