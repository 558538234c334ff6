"""Configurations and notices an agent can trust: a real `zeal-server serve`, real agents
reading from the broker, and an attacker who may publish on the configuration and notice
topics (a leaked collector login; here an anonymous client of a broker without ACLs). The
server signs what agents act on (zeal_server.store.signing); an agent acts only on what
verifies under its server's key (zeal_edge.trust)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tools.testbed.broker import Mosquitto, agent_status
from tools.testbed.server import Server, client, stats, wait_until
from zeal import Zeal
from zeal.mqtt.streamconfig import config_document, tombstone_document
from zeal.mqtt.topics import Notice
from zeal.signed import CONFIG_PURPOSE, NOTICE_PURPOSE, encode_field, signed_bytes
from zeal_server import store
from zeal_server.store.db import make_engine, session_factory

pytestmark = pytest.mark.integration

#: A stream whose devices send a reading every 0.2 s: its operator raised the policy.
RAISED = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 1e6}


class Agent:
    """`zeal-edge run` of device `device` from the broker's configuration, fed a reading
    every 0.2 s; its log in a file."""

    def __init__(
        self, broker: Mosquitto, data_dir: Path, *extra: str, device: str = "dev1"
    ) -> None:
        self.data_dir, self.device = data_dir, device
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = data_dir / "agent.log"
        self._output = self.log.open("a")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "zeal_edge", "run", "--stream", "temps"),
                *("--device", device, "--source", "stdin", "--broker", broker.url),
                *("--data-dir", str(data_dir), "--batch", "1", "--batch-seconds", "0.2"),
                *extra,
            ],
            stdin=subprocess.PIPE,
            stderr=self._output,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
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

    def said(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Its exit status and log, once it has exited by itself."""
        code = self.process.wait(timeout)
        self.kill()
        return code, self.said()

    def status(self) -> dict[str, Any]:
        return agent_status(self.data_dir)[0]

    def kill(self) -> None:
        self.done.set()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):  # a write the agent never read
                self.process.stdin.close()
        self._output.close()


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


def publish(broker: Mosquitto, topic: str, payload: bytes, *, retain: bool) -> None:
    forger = client(broker.port, None)
    forger.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)
    forger.disconnect()
    forger.loop_stop()


class Forger:
    """Signs with a key of its own (Ed25519, as the server does, but not the server's)."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = encode_field(raw)

    def sign(self, document: dict[str, Any], purpose: str) -> bytes:
        signed = {**document, "key": self.public}
        signed["signature"] = encode_field(self._key.sign(signed_bytes(signed, purpose)))
        return json.dumps(signed).encode()


def forgeries(genuine: dict[str, Any]) -> list[tuple[str, bytes, bool]]:
    """(what, payload, retained) on temps' configuration topic: every way the attacker of
    the hostile round tried, and more."""
    forger = Forger()
    greedy = config_document(
        "temps",
        Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e8),
        server=genuine["server"],
        created_ms=genuine["created_ms"],
    )
    tampered = {**genuine, "unit": "degC"}  # the server's signature, another document
    origin = {"server": genuine["server"], "created_ms": genuine["created_ms"]}
    tombstone = tombstone_document("temps", **origin, deleted_ms=genuine["created_ms"] + 1)
    return [
        ("empty, not retained", b"", False),
        ("empty, retained", b"", True),
        ("unsigned, policy 1e8", json.dumps(greedy).encode(), True),
        ("unsigned, another server", json.dumps({**genuine, "server": "zs-evil"}).encode(), True),
        ("the server's signature on another document", json.dumps(tampered).encode(), True),
        ("signed with the forger's key, policy 1e8", forger.sign(greedy, CONFIG_PURPOSE), True),
        ("a tombstone signed with the forger's key", forger.sign(tombstone, CONFIG_PURPOSE), True),
        ("a tombstone, unsigned", json.dumps(tombstone).encode(), True),
        ("not JSON", b"\xff{", False),
    ]


def forged_notices(server_id: str, device: str) -> list[bytes]:
    """Notices that the server no longer has the stream (its own id in them): unsigned,
    signed with the forger's key, empty."""
    notice = Notice(server_id, "temps", device, "unknown_stream", "deleted", 10**13, "0" * 16, 0)
    return [notice.to_json(), Forger().sign(notice.to_document(), NOTICE_PURPOSE), b""]


def test_forged_empty_and_foreign_messages_never_halt_a_fleet(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Five agents run; the attacker publishes on the configuration topic an empty message
    (retained and not), unsigned configurations (a policy of 1e8, another server's), the
    server's signature over another document, configurations and a tombstone signed with
    a key of its own, and on each device's notice topic unsigned, forged and empty
    `unknown_stream` notices. Every agent goes on sending (its readings keep being stored),
    none halts, each counted what it ignored, and none spent beyond the stream's policy.
    Before: one empty message on the configuration topic stopped 20 of 20 agents (exit 3),
    halted for good."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "server.log")
    server.start()
    agents: list[Agent] = []
    try:
        assert server.http.post("/api/v1/streams", json=RAISED).status_code == 201
        agents = [
            Agent(broker, tmp_path / f"agent{k}", "--max-epsilon-per-day", "1e6", device=f"d{k}")
            for k in range(5)
        ]

        def stored() -> dict[str, int]:
            listed = server.http.get("/api/v1/streams/temps/devices").json()
            return {d["name"]: d["readings"] for d in listed["devices"]}

        wait_until(lambda: len(stored()) == 5, 60, "a reading of every agent")
        genuine = retained_config(broker)
        assert genuine["signature"]
        assert genuine["key"]
        sent = 0
        for _what, payload, retain in forgeries(genuine):
            publish(broker, "zeal/v1/temps/config", payload, retain=retain)
            sent += 1
        for agent in agents:
            for payload in forged_notices(genuine["server"], agent.device):
                publish(broker, f"zeal/v1/temps/{agent.device}/notice", payload, retain=False)
        before = stored()
        wait_until(
            lambda: all(stored()[name] > before[name] + 3 for name in before),
            60,
            "every agent's readings stored after the forgeries",
        )
        wait_until(lambda: retained_config(broker) == genuine, 15, "the server's config again")
        for agent in agents:
            assert agent.process.poll() is None, agent.said()[-3000:]
            status = agent.status()
            assert status["halted"] is None
            assert status["server_key"] == genuine["key"]
            assert status["unverified_messages"] >= sent + 3, status
            assert status["epsilon_per_reading"] == 1.0
            assert "ignoring a message on zeal/v1/temps/config" in agent.said()
    finally:
        for agent in agents:
            agent.kill()
        server.stop()


def test_a_deleted_stream_halts_agents_that_wait_and_a_release_frees_them_without_a_visit(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Three agents with --on-halt wait (as the systemd unit runs them). The operator deletes
    the stream: its signed tombstone halts them, and they stay connected, reading nothing.
    Created anew (epsilon 2), it is another stream: they stay halted and nothing is stored
    in it. `zeal-server streams release temps` signs its configuration as released: every
    agent adopts it by itself (epsilon 2) and its readings are stored. Then a policy above
    their ceiling halts them (over_ceiling), and the policy set back frees them."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "server.log")
    server.start()
    agents: list[Agent] = []
    extra = ("--max-epsilon-per-day", "1e6", "--on-halt", "wait")
    try:
        assert server.http.post("/api/v1/streams", json=RAISED).status_code == 201
        agents = [Agent(broker, tmp_path / f"a{k}", *extra, device=f"d{k}") for k in range(3)]
        wait_until(lambda: stats(server)["devices"] == 3, 60, "every agent's first reading")
        deleted = server.http.delete("/api/v1/streams/temps", params={"confirm": "temps"})
        assert deleted.status_code == 200
        wait_until(lambda: all(a.status()["halted"] is not None for a in agents), 30, "every halt")
        # The tombstone, or the signed notice refusing a batch already on its way.
        reasons = {a.status()["halted"]["reason"] for a in agents}
        assert reasons <= {"stream_deleted", "unknown_stream"}, reasons
        assert all(a.process.poll() is None for a in agents)  # waiting, not exited
        anew = {**RAISED, "epsilon": 2}
        assert server.http.post("/api/v1/streams", json=anew).status_code == 201
        wait_until(lambda: retained_config(broker).get("epsilon") == 2, 15, "the new config")
        # A sentinel after it: once an agent counted it, it has seen the new configuration.
        counted = [a.status()["unverified_messages"] for a in agents]
        publish(broker, "zeal/v1/temps/config", b"sentinel", retain=False)
        wait_until(
            lambda: all(
                a.status()["unverified_messages"] > n for a, n in zip(agents, counted, strict=True)
            ),
            30,
            "the sentinel",
        )
        assert stats(server)["readings"] == 0  # nothing privatized for the new stream
        assert all(a.status()["halted"] is not None for a in agents)
        released = subprocess.run(
            [sys.executable, "-m", "zeal_server", "streams", "release", "temps"],
            env={**os.environ, "ZEAL_SERVER_URL": f"http://127.0.0.1:{server.port}"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert released.returncode == 0, released.stderr
        assert "released the agents halted on stream temps" in released.stdout
        wait_until(lambda: stats(server)["devices"] == 3, 60, "every agent on the new stream")
        for agent in agents:
            status = agent.status()
            assert status["halted"] is None
            assert status["epsilon_per_reading"] == 2.0
            assert "released; reading and sending again" in agent.said()
        # A policy above their ceiling (1e6) halts them; set back, it frees them.
        patch = server.http.patch("/api/v1/streams/temps", json={"max_epsilon_per_day": 2e6})
        assert patch.status_code == 200
        wait_until(
            lambda: (
                {(a.status()["halted"] or {}).get("reason") for a in agents} == {"over_ceiling"}
            ),
            30,
            "the ceiling's halt",
        )
        patch = server.http.patch("/api/v1/streams/temps", json={"max_epsilon_per_day": 1e6})
        assert patch.status_code == 200
        wait_until(lambda: all(a.status()["halted"] is None for a in agents), 30, "freed")
        readings = stats(server)["readings"]
        wait_until(lambda: stats(server)["readings"] > readings + 3, 60, "readings again")
        assert all(a.process.poll() is None for a in agents)
    finally:
        for agent in agents:
            agent.kill()
        server.stop()


def test_a_stream_deleted_and_created_anew_with_a_larger_epsilon_halts_the_agent(
    broker: Mosquitto, running: tuple[Server, Agent, str]
) -> None:
    """The operator (or whoever has the database) deletes the stream and creates one of the
    same name with epsilon 5 in one transaction, so the server's next sync publishes only
    the new configuration, signed with its key: the agent halts ("created anew") instead
    of switching, privatizes nothing at epsilon 5, and exits (--on-halt exit, the default).
    Started again, it refuses before privatizing anything; `zeal-edge resume` clears the
    halt and the pin, and the agent then adopts the new stream (an operator's decision; its
    spend this hour still counts against the policy). Before: it logged "switching" and
    went on at epsilon 5."""
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
    again = Agent(broker, agent.data_dir)
    code, err = again.wait()
    assert code == 3, err[-3000:]
    assert "zeal-edge resume" in err
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
