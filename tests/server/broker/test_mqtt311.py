"""MQTT 3.1.1 end to end (ZEAL_MQTT_PROTOCOL / --protocol), and what the agent does when a
3.1.1 broker acknowledges a publish its ACL denied. Real Mosquitto, real server and agent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tools.testbed.broker import Mosquitto, agent_status, run_agent, seattle_rows
from tools.testbed.server import (
    DeployBroker,
    Server,
    create,
    serve_collector,
    stats,
    wait_until,
)

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools


def run(tmp_path: Path, broker_url: str, device: str, *args: str, name: str = "agent") -> Any:
    rows = seattle_rows(tmp_path / "rows.csv", 120)
    return run_agent(broker_url, tmp_path / name, device, rows, *args)


def protocol_level(broker: Mosquitto, client_id: str) -> str:
    """What the broker logged of a client's protocol: p2 is MQTT 3.1.1, p5 MQTT v5."""
    found = re.findall(rf"as {re.escape(client_id)} \((p\d)", broker.log_tail(2000))
    assert found, broker.log_tail()
    return found[-1]


def test_the_agent_and_the_collector_speak_mqtt_3_1_1_end_to_end(
    broker: Mosquitto, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = Server(database, broker, tmp_path / "server.log", collector_id="c311")
    server.env["ZEAL_MQTT_PROTOCOL"] = "3.1.1"
    server.start()
    try:
        create(server)
        result = run(tmp_path, broker.url, "dev1", "--protocol", "3.1.1")
        assert result.returncode == 0, result.stderr
        wait_until(lambda: stats(server)["readings"] == 120, 30, "120 readings stored")
        average = server.http.get("/api/v1/streams/temps/average").json()
    finally:
        server.stop()
    assert average["n"] == 120
    assert protocol_level(broker, "c311") == "p2"
    assert "MQTT 3.1.1: a broker acknowledges a publish its ACL denies" in result.stderr
    # The agent (client id zeal-...) spoke 3.1.1 too, and nothing spoke v5.
    assert re.search(r"as zeal-\S+ \(p2", broker.log_tail(2000)), broker.log_tail()
    assert not re.search(r"\(p5", broker.log_tail(2000)), broker.log_tail()


def test_a_publish_the_acl_denies_stays_in_the_outbox_under_v5_but_not_under_3_1_1(
    tmp_path: Path,
) -> None:
    """The documented limit of 3.1.1: Mosquitto acknowledges a denied publish (PUBACK has no
    reason code), so the agent counts the batch as sent. Under v5 the same agent gets
    'Not authorized' and keeps it."""
    broker = DeployBroker(tmp_path / "broker").start()
    server = serve_collector(broker, tmp_path)
    try:
        create(server)
        credentials = ("--username", "dev1", "--password", "pw-dev1")
        # dev1's login may write only zeal/v1/+/dev1/up: as device dev2 it is denied.
        v5 = run(tmp_path, broker.url, "dev2", *credentials, name="v5")
        v311 = run(tmp_path, broker.url, "dev2", *credentials, "--protocol", "3.1.1", name="v311")
        stored = stats(server)["readings"]
    finally:
        server.stop()
        broker.stop()
    assert stored == 0
    assert "broker refused batch" in v5.stderr
    assert "Not authorized" in v5.stderr
    [kept] = agent_status(tmp_path / "v5")
    assert kept["outbox_batches"] == 2, kept
    assert v311.returncode == 0, v311.stderr
    assert "broker refused" not in v311.stderr
    [gone] = agent_status(tmp_path / "v311")
    assert gone["outbox_batches"] == 0, gone
    assert gone["sent_batches"] == 2, gone
