"""Configurations an agent can trust: a real `zeal-server serve`, a real agent reading from
the broker, and an attacker who may retain configurations (a leaked collector login; here
an anonymous client of a broker without ACLs)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.testbed.broker import Mosquitto, agent_status
from tools.testbed.server import Server, client, stats, wait_until
from zeal import Zeal
from zeal.streamconfig import config_document
from zeal_server import store
from zeal_server.store.db import make_engine, session_factory

pytestmark = pytest.mark.integration


class Agent:
    """`zeal-edge run` from the broker's configuration, fed a reading every 0.2 s."""

    def __init__(self, broker: Mosquitto, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "zeal_edge", "run", "--stream", "temps"),
                *("--device", "dev1", "--source", "stdin", "--broker", broker.url),
                *("--data-dir", str(data_dir), "--batch", "1", "--batch-seconds", "0.2"),
            ],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.done = threading.Event()
        threading.Thread(target=self._feed, daemon=True).start()

    def _feed(self) -> None:
        assert self.process.stdin is not None
        while not self.done.wait(0.2):
            try:
                self.process.stdin.write("50\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Its exit status and standard error, once it has exited by itself."""
        assert self.process.stderr is not None
        err = self.process.stderr.read()
        code = self.process.wait(timeout)
        self.kill()
        return code, err

    def kill(self) -> None:
        self.done.set()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pipe in (self.process.stdin, self.process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write the agent never read
                    pipe.close()


@pytest.fixture
def running(broker: Mosquitto, tmp_path: Path) -> Iterator[tuple[Server, Agent, str]]:
    """A server whose stream temps has the default policy (8 epsilon a day at epsilon 1:
    one reading an hour), and an agent that has had its first reading stored."""
    url = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = Server(url, broker, tmp_path / "server.log").start()
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
    assert server.http.post("/api/v1/streams", json=body).status_code == 201
    agent = Agent(broker, tmp_path / "agent")
    try:
        wait_until(lambda: stats(server)["readings"] == 1, 30, "the agent's first reading")
        yield server, agent, url
    finally:
        agent.kill()
        server.stop()


def retained_config(broker: Mosquitto) -> dict[str, Any]:
    """The configuration the broker retains for temps now (a new subscriber's view)."""
    got: list[bytes] = []
    listener = client(broker.port, None)
    listener.on_message = lambda c, u, m: got.append(m.payload)
    listener.subscribe("zeal/v1/temps/config", qos=1)
    try:
        wait_until(lambda: got, 10, "the retained configuration")
    finally:
        listener.disconnect()
        listener.loop_stop()
    document: dict[str, Any] = json.loads(got[0])
    return document


def retain(broker: Mosquitto, document: dict[str, Any]) -> None:
    forger = client(broker.port, None)
    forger.publish(
        "zeal/v1/temps/config", json.dumps(document), qos=1, retain=True
    ).wait_for_publish(10)
    forger.disconnect()
    forger.loop_stop()


def test_a_forged_configuration_is_refused_or_halts_the_agent_and_the_server_retains_its_own(
    broker: Mosquitto, running: tuple[Server, Agent, str]
) -> None:
    """The forged-configuration attack: a configuration with the stream's own server id and creation
    time (copied from the retained one) but a policy of 1e8 epsilon a day is refused by the
    agent's ceiling (8), which keeps its adopted configuration; one from another server id
    with the stream's very parameters halts it (exit 3, saying which server). It spent no
    more than its policy; the server retains its own configuration again within seconds.
    Before: the agent adopted the foreign policy and spent 124 epsilon in a day."""
    server, agent, _ = running
    genuine = retained_config(broker)
    copied = config_document(
        "temps",
        Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e8),
        server=genuine["server"],
        created_ms=genuine["created_ms"],
    )
    retain(broker, copied)
    wait_until(lambda: retained_config(broker) == genuine, 15, "the server's config again")
    assert agent.process.poll() is None  # still running with what it adopted
    foreign = config_document(
        "temps",
        Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8),
        server="zs-evil",
        created_ms=genuine["created_ms"],
    )
    retain(broker, foreign)
    code, err = agent.wait()
    assert code == 3, err[-3000:]
    assert "exceeds this agent's ceiling 8 (--max-epsilon-per-day)" in err, err[-3000:]
    assert "foreign_server" in err
    assert "now comes from server zs-evil" in err
    wait_until(lambda: retained_config(broker) == genuine, 15, "the server's config again")
    status = agent_status(agent.data_dir)[0]
    assert status["halted"]["reason"] == "foreign_server"  # type: ignore[index]
    assert status["policy_epsilon_per_day"] == 8.0
    assert status["policy_spent_today"] <= 8.0  # type: ignore[operator]
    assert stats(server)["readings"] <= 8
    assert "configuration of another server (zs-evil)" in server.log.read_text()
    # Started again, it refuses before privatizing anything, until `zeal-edge resume`.
    again = Agent(broker, agent.data_dir)
    code, err = again.wait()
    assert code == 3, err[-3000:]
    assert "zeal-edge resume" in err


def test_a_stream_deleted_and_created_anew_with_a_larger_epsilon_halts_the_agent(
    broker: Mosquitto, running: tuple[Server, Agent, str]
) -> None:
    """The operator (or whoever has the database) deletes the stream and creates one of the
    same name with epsilon 5 in one transaction, so the server's next sync publishes only
    the new configuration: the agent halts ("created anew") instead of switching, and
    privatizes nothing at epsilon 5. `zeal-edge resume` clears the halt and the pin: the
    agent then adopts the new stream (an operator's decision; its spend this hour still
    counts against the policy). Before: it logged "switching" and went on at epsilon 5."""
    server, agent, url = running
    engine = make_engine(url)
    with session_factory(engine)() as session:
        old = store.stream_by_name(session, "temps")
        assert old is not None
        store.delete_stream(session, old)
        store.create_stream(session, name="temps", lower=0, upper=110, epsilon=5)
        session.commit()
    engine.dispose()
    code, err = agent.wait()
    assert code == 3, err[-3000:]
    assert "stream_recreated" in err
    assert "was created anew" in err
    assert "switching" not in err
    assert stats(server)["readings"] == 0  # the new stream's: nothing at epsilon 5
    status = agent_status(agent.data_dir)[0]
    assert status["epsilon_per_reading"] == 1.0
    resumed = subprocess.run(
        [sys.executable, "-m", "zeal_edge", "resume", "--data-dir", str(agent.data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "halt cleared (stream_recreated)" in resumed.stdout
    accepted = Agent(broker, agent.data_dir)

    def adopted() -> bool:
        now = agent_status(agent.data_dir)[0]
        return now["halted"] is None and now["epsilon_per_reading"] == 5.0

    try:
        wait_until(adopted, 30, "the new stream adopted after the resume")
    finally:
        accepted.kill()
