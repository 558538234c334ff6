"""Hostile round 4, replayed against the fix: the deployment's broker config (zeal_retain and
the dynamic security plugin) on a real mosquitto, a real `zeal-server serve` (SQLite) whose
collector logs in as zeal-collector, devices provisioned the documented way (`zeal-server
devices provision`, which hands each its login and the server's key), real agents run with
that key and nothing else. The attacker holds the collector's login (deploy/.env leaks
first), connecting under an id the plugin allows it (zeal-collector:evil), or a device
login; it forges nothing, it re-publishes what the server itself signed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tools.testbed.broker import StdinAgent, agent_status
from tools.testbed.server import (
    USERS,
    DeployBroker,
    Server,
    client,
    serve,
    stream_body,
    wait_until,
)
from zeal import Zeal, encode_batch
from zeal.mqtt.streamconfig import config_document, params_from_config
from zeal.signed import CONFIG_PURPOSE, encode_field, signed_bytes

pytestmark = pytest.mark.integration
ADMIN = {"ZEAL_MQTT_ADMIN_USERNAME": "zeal-admin", "ZEAL_MQTT_ADMIN_PASSWORD": "pw-zeal-admin"}
SIMULATOR = "zeal-fleet-simulator"


class Deployment:
    """The broker, the server, and what the operator does from the command line."""

    def __init__(self, broker: DeployBroker, server: Server, database_url: str) -> None:
        self.broker, self.server, self.database_url = broker, server, database_url

    def zeal_server(self, *args: str) -> str:
        """`zeal-server ARGS` as the operator runs it on the server's host."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEAL_")}
        env |= {"ZEAL_MQTT_URL": self.broker.url, "ZEAL_DATABASE_URL": self.database_url}
        env |= {"ZEAL_SERVER_URL": f"http://127.0.0.1:{self.server.port}", **ADMIN}
        done = subprocess.run(
            [sys.executable, "-m", "zeal_server", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def provision(self, device: str) -> tuple[str, str]:
        """The device's password and the server's key, as `devices provision` prints them."""
        said = self.zeal_server("devices", "provision", device)
        password = re.search(r"^password: (\S+)$", said, flags=re.M)
        key = re.search(r"^server key: (\S+)$", said, flags=re.M)
        assert password, said
        assert key, said
        return password.group(1), key.group(1)

    def agent(self, tmp_path: Path, device: str, *extra: str) -> StdinAgent:
        """A provisioned device's agent on stream temps, given its login and the key."""
        password, key = self.provision(device)
        return StdinAgent(self.broker.url, tmp_path, device, password, "temps", *extra,
                          server_key=key)  # fmt: skip

    def readings(self, device: str) -> int:
        listed = self.server.http.get("/api/v1/streams/temps/devices").json()["devices"]
        return sum(d["readings"] for d in listed if d["name"] == device)

    def retained(self, stream: str = "temps") -> dict[str, Any]:
        """What a new subscriber finds retained on the stream's configuration topic."""
        got: list[bytes] = []
        listener = client(self.broker.port, "zeal-collector", "zeal-collector:listener")
        listener.on_message = lambda c, u, m: got.append(m.payload)
        listener.subscribe(f"zeal/v1/{stream}/config", qos=1)
        try:
            wait_until(lambda: got, 10, "the retained configuration")
        finally:
            listener.disconnect()
            listener.loop_stop()
        document: dict[str, Any] = json.loads(got[0])
        return document


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    broker = DeployBroker(tmp_path / "broker", users=(*USERS, SIMULATOR)).start()
    database_url = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = serve(
        database_url,
        broker,
        tmp_path,
        ZEAL_MQTT_USERNAME="zeal-collector",
        ZEAL_MQTT_PASSWORD="pw-zeal-collector",
        ZEAL_MQTT_LOGIN_PROPERTY="zeal-login",
        **ADMIN,
    ).start()
    try:
        assert server.http.post("/api/v1/streams", json=stream_body()).status_code == 201
        yield Deployment(broker, server, database_url)
    finally:
        server.stop()
        broker.stop()


class Attacker:
    """The collector's leaked login under an id of its own: it may retain configurations
    and publish on every device's notice topic."""

    def __init__(self, deployment: Deployment) -> None:
        self.mqtt = client(deployment.broker.port, "zeal-collector", "zeal-collector:evil")

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.mqtt.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def close(self) -> None:
        self.mqtt.disconnect()
        self.mqtt.loop_stop()


def still_sending(deployment: Deployment, agents: dict[str, StdinAgent], what: str) -> None:
    """Wait until every agent has had more readings stored, each still running, none
    halted."""
    before = {d: deployment.readings(d) for d in agents}
    wait_until(lambda: all(deployment.readings(d) > before[d] + 5 for d in agents), 60, what)
    for device, agent in agents.items():
        assert agent.process.poll() is None, agent.said()[-3000:]
        assert status(agent, device)["halted"] is None


def status(agent: StdinAgent, device: str) -> dict[str, Any]:
    found = agent_status(agent.log.parent / f"edge-{device}")
    return dict(found[0])


def ignored(agent: StdinAgent, device: str) -> dict[str, int]:
    return dict(status(agent, device)["ignored_signed"])


def signed_notices(deployment: Deployment) -> dict[str, bytes]:
    """Notices the server signs for the password-file device `evil`, as it receives them on
    its own notice topics: unknown_stream (junk on a stream that does not exist) and
    sequence_reset (its sequence 0 again with other content)."""
    got: dict[str, bytes] = {}
    subscribed = threading.Event()
    evil = client(deployment.broker.port, "evil")
    evil.on_message = lambda c, u, m: got.setdefault(  # a caps document has no reason
        json.loads(m.payload).get("reason", "caps"), m.payload
    )
    evil.on_subscribe = lambda *_: subscribed.set()
    evil.subscribe("zeal/v1/+/evil/notice", qos=1)
    params = params_from_config(deployment.retained())
    try:
        assert subscribed.wait(10)
        evil.publish("zeal/v1/nosuch/evil/up", b"junk", qos=1).wait_for_publish(10)
        now = int(time.time() * 1000)
        for k in range(2):  # sequence 0 twice, other readings each time
            batch = encode_batch(
                params,
                stream="temps",
                device="evil",
                sequence=0,
                timestamps=[now + k],
                codes=params.perturb([50.0]),
            )
            evil.publish("zeal/v1/temps/evil/up", batch, qos=1).wait_for_publish(10)
            wait_until(lambda k=k: deployment.readings("evil") == k + 1, 30, "evil's batch")
        wait_until(lambda: {"unknown_stream", "sequence_reset"} <= set(got), 30, "both notices")
    finally:
        evil.disconnect()
        evil.loop_stop()
    return got


def test_replayed_configurations_and_notices_change_nothing_for_running_agents(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Agents d1 and d2 run; the operator lowers the stream's policy (1e6 to 5e5) and they
    follow; d3 starts with a ceiling of 6e5 (below the old policy). The attacker retains the
    server's superseded configuration (policy 1e6) again, and re-publishes the server's
    signed unknown_stream and sequence_reset notices of another device (evil's, on stream
    nosuch and temps) on every agent's notice topic; the fleet simulator's login publishes
    garbage on d1's data topic, for which the server signs a notice to d1. Every agent
    keeps its configuration (policy 5e5) and keeps sending, none halts, each counts what it
    ignored (stale_config, notice_not_ours; d1 notice_not_sent), none counts a reject, and
    d1 never logs a batch it did not send. Before: the replay moved agents back to policy
    1e6 or halted d3 (over_ceiling), the foreign unknown_stream notice halted them, and
    d1 logged "rejected batch #None (bad_version) ... upgrade the agent"."""
    agents: dict[str, StdinAgent] = {}
    attacker = Attacker(deployment)
    try:
        for device in ("d1", "d2"):
            agents[device] = deployment.agent(tmp_path, device)
        wait_until(lambda: all(deployment.readings(d) > 0 for d in agents), 60, "d1, d2 stored")
        superseded = deployment.retained()
        assert superseded["max_epsilon_per_day"] == 1e6
        patched = deployment.server.http.patch(
            "/api/v1/streams/temps", json={"max_epsilon_per_day": 5e5}
        )
        assert patched.status_code == 200, patched.text
        wait_until(
            lambda: deployment.retained()["fingerprint"] != superseded["fingerprint"],
            30,
            "the lowered policy's configuration retained",
        )
        current = deployment.retained()
        agents["d3"] = deployment.agent(tmp_path, "d3", "--max-epsilon-per-day", "6e5")

        def following() -> bool:
            return all(
                status(a, d)["fingerprint"] == current["fingerprint"] for d, a in agents.items()
            )

        wait_until(following, 60, "every agent on the lowered policy")
        wait_until(lambda: deployment.readings("d3") > 0, 60, "d3 stored")
        # A batch on its way when the policy changed may have been refused: from here on,
        # nothing more is.
        rejected = {d: status(a, d)["server_rejects"] for d, a in agents.items()}
        stats = deployment.server.http.get("/api/v1/streams/temps/stats").json()
        mismatches = stats["rejects"].get("fingerprint_mismatch", 0)
        for _ in range(3):
            attacker.publish("zeal/v1/temps/config", json.dumps(superseded).encode(), retain=True)
        wait_until(
            lambda: all(ignored(a, d).get("stale_config", 0) >= 1 for d, a in agents.items()),
            60,
            "every agent ignored the superseded configuration",
        )
        notices = signed_notices(deployment)
        for device in agents:
            for payload in notices.values():
                attacker.publish(f"zeal/v1/temps/{device}/notice", payload)
        simulator = client(deployment.broker.port, SIMULATOR)
        simulator.publish("zeal/v1/temps/d1/up", b"\x7fgarbage", qos=1).wait_for_publish(10)
        simulator.disconnect()
        simulator.loop_stop()
        wait_until(
            lambda: all(ignored(a, d).get("notice_not_ours", 0) >= 2 for d, a in agents.items()),
            60,
            "every agent ignored another device's notices",
        )
        wait_until(lambda: ignored(agents["d1"], "d1").get("notice_not_sent", 0) >= 1, 60, "d1")
        still_sending(deployment, agents, "every agent's readings still stored")
        for device, agent in agents.items():
            now = status(agent, device)
            assert now["fingerprint"] == current["fingerprint"]
            assert now["policy_epsilon_per_day"] == 5e5
            assert now["server_rejects"] == rejected[device], now
            acted = [line for line in agent.said().splitlines() if "server rejected" in line]
            assert not [line for line in acted if "bad_version" in line]  # not d1's garbage
            assert "#None" not in agent.said()
            print(f"{device}: ignored {now['ignored_signed']}")
        rejects = deployment.server.http.get("/api/v1/streams/temps/stats").json()["rejects"]
        assert rejects.get("fingerprint_mismatch", 0) == mismatches  # none went back
    finally:
        attacker.close()
        for agent in agents.values():
            agent.kill()


def test_an_old_incarnations_release_replayed_leaves_agents_on_the_new_one(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The operator releases temps, deletes it and creates it anew; the agents (--on-halt
    wait, as the systemd unit runs them) halt, then follow the new incarnation once it is
    released. The attacker retains the old incarnation's signed release again: the agents
    ignore it (old_release), stay on the new one and keep sending; none halts. Before: they
    re-pinned the old origin, then halted stream_recreated when the server re-asserted the
    current configuration."""
    attacker = Attacker(deployment)
    agents = {d: deployment.agent(tmp_path, d, "--on-halt", "wait") for d in ("d1", "d2")}
    try:
        wait_until(lambda: all(deployment.readings(d) > 0 for d in agents), 60, "both stored")
        deployment.zeal_server("streams", "release", "temps")
        old_release = deployment.retained()
        assert old_release.get("released_ms") is not None
        deployment.zeal_server("streams", "delete", "temps", "--confirm", "temps")
        wait_until(
            lambda: all(status(a, d)["halted"] is not None for d, a in agents.items()),
            60,
            "both halted on the deletion",
        )
        created = deployment.server.http.post("/api/v1/streams", json=stream_body())
        assert created.status_code == 201
        deployment.zeal_server("streams", "release", "temps")
        new_release = deployment.retained()
        assert new_release["created_ms"] > old_release["created_ms"]
        wait_until(
            lambda: all(deployment.readings(d) > 0 for d in agents), 60, "both on the new one"
        )
        for _ in range(3):
            attacker.publish("zeal/v1/temps/config", json.dumps(old_release).encode(), retain=True)
        wait_until(
            lambda: all(ignored(a, d).get("old_release", 0) >= 1 for d, a in agents.items()),
            60,
            "the old release ignored",
        )
        still_sending(deployment, agents, "readings of the new incarnation still stored")
        for device, agent in agents.items():
            assert status(agent, device)["fingerprint"] == new_release["fingerprint"]
    finally:
        attacker.close()
        for agent in agents.values():
            agent.kill()


class Impostor:
    """The attacker's own key, signing configurations that pass an agent's ceilings (epsilon
    1, policy 8) with other parameters than the server's, under the server's name."""

    def __init__(self, genuine: dict[str, Any]) -> None:
        self._key = Ed25519PrivateKey.generate()
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        params = Zeal(lower=0, upper=10, epsilon=1, max_epsilon_per_day=8)
        document = config_document(
            "temps",
            params,
            server=genuine["server"],
            created_ms=genuine["created_ms"],
            revision=genuine["revision"] + 10**9,
        )
        document["key"] = encode_field(raw)
        sig = self._key.sign(signed_bytes(document, CONFIG_PURPOSE))
        self.payload = json.dumps({**document, "signature": encode_field(sig)}).encode()


def test_agents_given_their_key_adopt_the_real_configuration_while_an_attacker_retains_its_own(
    deployment: Deployment, tmp_path: Path
) -> None:
    """While the attacker re-retains a configuration signed with its own key every 0.1 s,
    four agents provisioned the documented way start: every one adopts the server's
    configuration (its key, its fingerprint) and its readings are stored. An agent given no
    key refuses to start, saying how to give it one. Before (trust on first use by
    default): 4 of 4 pinned the attacker's key."""
    genuine = deployment.retained()
    impostor = Impostor(genuine)
    attacker = Attacker(deployment)
    stop = threading.Event()

    def flood() -> None:
        while not stop.wait(0.1):
            attacker.publish("zeal/v1/temps/config", impostor.payload, retain=True)

    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    agents: dict[str, StdinAgent] = {}
    try:
        wait_until(lambda: deployment.retained()["key"] != genuine["key"], 10, "the flood")
        agents = {d: deployment.agent(tmp_path, d) for d in ("h1", "h2", "h3", "h4")}
        wait_until(lambda: all(deployment.readings(d) > 0 for d in agents), 90, "every agent")
        for device, agent in agents.items():
            now = status(agent, device)
            assert now["server_key"] == genuine["key"]
            assert now["fingerprint"] == genuine["fingerprint"]
            assert now["unverified_messages"] >= 1  # the attacker's, ignored
            assert agent.process.poll() is None
        keyless = subprocess.run(
            [
                *(sys.executable, "-m", "zeal_edge", "run", "--stream", "temps"),
                *("--device", "h5", "--source", "stdin", "--broker", deployment.broker.url),
                *("--username", "evil", "--data-dir", str(tmp_path / "keyless")),
            ],
            env={
                **{k: v for k, v in os.environ.items() if k != "ZEAL_TRUST_FIRST_USE"},
                "ZEAL_MQTT_PASSWORD": "pw-evil",
            },
            input="",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert keyless.returncode == 2, keyless.stderr[-2000:]
        assert "--server-key" in keyless.stderr
        assert "--trust-first-use" in keyless.stderr
    finally:
        stop.set()
        flooding.join(10)
        attacker.close()
        for agent in agents.values():
            agent.kill()


def test_a_rotated_key_is_followed_by_agents_given_the_old_one(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Agent d1 runs with the server's key; the operator runs `zeal-server key rotate` on the
    database. The running server signs with the new key within seconds, its configuration
    carrying the old key's endorsement: d1 trusts the new key from then on and keeps
    sending; d2, provisioned before the rotation (given the old key) and started after it,
    adopts the configuration and pins the new key too. The configuration as the old key
    signed it, published again, is refused by both (not signed by the key they trust)."""
    attacker = Attacker(deployment)
    old_config = deployment.retained()
    password, old_key = deployment.provision("d2")
    agents = {"d1": deployment.agent(tmp_path, "d1")}
    try:
        wait_until(lambda: deployment.readings("d1") > 0, 60, "d1 stored")
        new_key = deployment.zeal_server("key", "rotate").strip()
        assert new_key != old_key
        assert deployment.zeal_server("key").strip() == new_key
        wait_until(lambda: deployment.retained()["key"] == new_key, 30, "re-signed")
        assert deployment.retained()["endorsements"][0]["by"] == old_key
        agents["d2"] = StdinAgent(deployment.broker.url, tmp_path, "d2", password, "temps",
                                  server_key=old_key)  # fmt: skip
        for device, agent in agents.items():
            wait_until(
                lambda a=agent, d=device: status(a, d)["server_key"] == new_key,
                60,
                f"{device} on the new key",
            )
        counted = {d: status(a, d)["unverified_messages"] for d, a in agents.items()}
        attacker.publish("zeal/v1/temps/config", json.dumps(old_config).encode(), retain=True)
        wait_until(
            lambda: all(
                status(a, d)["unverified_messages"] > counted[d] for d, a in agents.items()
            ),
            60,
            "the old key's configuration refused",
        )
        still_sending(deployment, agents, "readings under the new key")
        assert "rotated its key" in agents["d1"].said()
    finally:
        attacker.close()
        for agent in agents.values():
            agent.kill()
