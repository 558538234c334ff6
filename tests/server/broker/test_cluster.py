"""A real cluster under faults: 3 NATS nodes (JetStream, replicas 3, MQTT on every node),
2 collectors pulling from one durable consumer into PostgreSQL, 100 simulated devices
publishing MQTT 3.1.1 to different nodes. One node and one collector are SIGKILLed
mid-stream and restarted: every reading is stored exactly once. The same run with a
collector that acknowledges before it commits loses readings."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import nats
import psycopg
import pytest
from fastapi.testclient import TestClient
from nats.js.api import ConsumerInfo, StreamState
from nats.js.errors import ServiceUnavailableError
from paho.mqtt.enums import MQTTProtocolVersion

from tests.server.helpers import publish_all, settings, stalled, zeal_server
from tests.server.metrics_check import metric_samples
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, fleet_command, free_port
from tools.testbed.nats import NatsCluster, move_leaders
from tools.testbed.server import (
    Server,
    batches,
    create,
    stats,
    stream_body,
    verify,
    wait_until,
)
from zeal.mqtt.topics import data_topic
from zeal_server.app import create_app
from zeal_server.broker.jetstream import MQTT_STREAM
from zeal_server.settings import ServerSettings

# Three NATS nodes electing leaders, and timed stalls: alone on the machine (see serial).
pytestmark = [pytest.mark.integration, pytest.mark.serial]

NODES = 3
DEVICES = (34, 33, 33)  # 100 devices, each simulator publishing to its own node
# Of publishing: 5 readings a second per device, a batch a second. Collector 2 is back
# about 16 s in, and its first JetStream request can then time out once (5 s, 4 of 20
# trials on NATS 2.15.1, the cluster still recovering the killed node) before it pulls.
SECONDS = 32
#: The kill comes once this many readings are stored (a quarter of the run), the killed
#: node and collector stay down DOWN_FOR seconds.
KILL_AFTER, DOWN_FOR = 4_000, 5.0
KILLED = 2  # the node killed (and the simulator publishing to it)
CONSUMER = "zeal-collectors"
BUGGY = Path(__file__).with_name("ack_before_commit.py")
COUNTED = ("zeal_collector_messages_total", "zeal_collector_rejected_messages_total")


@dataclass
class Trial:
    published: int  # readings the simulators saw acknowledged by their nodes
    batches: int
    stored: int
    messages: int
    shares: list[float]
    verify: str
    logs: str
    jetstream: str  # the stream's and the consumer's state at the end (what NATS kept)
    by_node: dict[str, int]  # batches stored, by the node their simulator published to


def stall(database_url: str, seconds: float) -> threading.Thread:
    """Hold the lock the collectors' writes need for `seconds` (a slow database at the
    moment of the kill: the collector then holds fetched messages it has not stored)."""
    held = threading.Event()

    def hold() -> None:
        url = database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as conn:
            conn.execute("LOCK TABLE device_periods IN ACCESS EXCLUSIVE MODE")
            held.set()
            time.sleep(seconds)  # time is the scenario: a database that stalls this long

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return thread


def holding(server: Server) -> bool:
    """The collector holds fetched messages it has not stored (and so not acknowledged)."""
    samples = metric_samples(server.http.get("/metrics").text)
    return samples.get(("zeal_collector_unacknowledged_messages", ()), 0) > 0


def run_trial(postgres_url: str, tmp_path: Path, *, buggy_second: bool = False) -> Trial:
    cluster = NatsCluster(tmp_path / "nats", NODES).start()
    servers = [
        Server(
            postgres_url,
            SimpleNamespace(url=cluster.mqtt_url(i)),  # type: ignore[arg-type]
            tmp_path / f"collector{i}.log",
            collector_id=f"collector-{i}",
        )
        for i in range(2)
    ]
    for server in servers:
        server.env.update(
            ZEAL_NATS_URL=cluster.nats_url,
            ZEAL_NATS_ACK_WAIT="6",
            ZEAL_MQTT_PROTOCOL="3.1.1",
        )
    # Collector 2 (the one killed) talks to nodes 1 and 2 only: on node 3, killed with it,
    # its acknowledgements would die with the node, and the deliberate bug would lose
    # nothing in the runs where nats-py happened to pick node 3.
    servers[1].env["ZEAL_NATS_URL"] = ",".join(cluster.nats_url.split(",")[:2])
    if buggy_second:
        servers[1].launcher = [sys.executable, str(BUGGY)]
    fleets: list[subprocess.Popen[str]] = []
    try:
        for server in servers:
            server.start()
        create(servers[0])
        pulling = "pulls from JetStream"
        wait_until(lambda: all(pulling in s.log.read_text() for s in servers), 60, "JetStream")
        # The node killed below leads the stream that holds the data and the collectors'
        # consumer: its loss costs both an election.
        asyncio.run(move_leaders(cluster.nats_url, MQTT_STREAM, CONSUMER, f"n{KILLED}"))
        for node, devices in enumerate(DEVICES):
            fleets.append(
                subprocess.Popen(
                    fleet_command(
                        cluster.mqtt_url(node),
                        tmp_path / f"sim{node}",
                        *("--devices", str(devices), "--device-prefix", f"node{node}"),
                        *("--rate", "5", "--batch", "5", "--duration", str(SECONDS)),
                        *("--protocol", "3.1.1", "--log-level", "WARNING"),
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        wait_until(lambda: stats(servers[0])["readings"] >= KILL_AFTER, 120, "the run under way")
        locked = stall(postgres_url, 2.0)
        wait_until(lambda: holding(servers[1]), 10, "messages fetched and not stored")
        cluster.kill_node(KILLED)
        servers[1].kill()
        locked.join()
        time.sleep(DOWN_FOR)  # time is the scenario: how long the node and collector stay down
        cluster.start_node(KILLED)
        servers[1].start()
        published = batches = 0
        for fleet in fleets:
            out, err = fleet.communicate(timeout=SECONDS + 150)
            assert fleet.returncode == 0, err[-2000:]
            found = re.search(r"(\d+) readings in (\d+) batches, (\d+) acknowledged", out)
            assert found, out
            readings, count, acked = map(int, found.groups())
            assert acked == readings, out
            published, batches = published + readings, batches + count

        # What was acknowledged by no collector comes again after ZEAL_NATS_ACK_WAIT. Wait
        # until all is stored, or NATS has nothing left to give (what is missing then is
        # lost for good: the deliberate bug's case).
        def settled() -> bool:
            stored = stats(servers[0])["readings"]
            return stored >= published or backlog(cluster.nats_url) == 0

        with contextlib.suppress(AssertionError):  # the assertions below say what is missing
            wait_until(settled, 60, "all stored, or no message left unacknowledged")
        # Time is what is tested: longer than the ack wait, a redelivery would show as a
        # duplicate.
        time.sleep(8)
        final = stats(servers[0])
        metrics = [metric_samples(s.http.get("/metrics").text) for s in servers]
        shares = [m[("zeal_collector_readings_total", ())] for m in metrics]
        state = jetstream_state(cluster.nats_url)
        outcomes = [
            {labels[0][1]: n for (name, labels), n in m.items() if name in COUNTED and n}
            for m in metrics
        ]
        state += f"; the collectors' counts {outcomes}"
    finally:
        for fleet in fleets:
            if fleet.poll() is None:
                fleet.kill()
        for server in servers:
            server.stop()
        cluster.stop()
    return Trial(
        published=published,
        batches=batches,
        stored=final["readings"],
        messages=final["messages"],
        shares=shares,
        verify=verify(postgres_url),
        logs="\n".join(s.log.read_text()[-3000:] for s in servers),
        jetstream=state,
        by_node=stored_by_node(postgres_url),
    )


def stored_by_node(database_url: str) -> dict[str, int]:
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT substr(d.name, 1, 5), sum(d.batches) FROM devices d GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return {name: int(count) for name, count in rows}


async def jetstream(servers: str, tries: int = 20) -> tuple[StreamState, ConsumerInfo]:
    """What NATS's MQTT stream holds, and where the collectors' consumer stands. Asked
    again while JetStream answers 503 ("temporarily unavailable": the restarted node
    rejoining; a diagnostic run ended on it)."""
    client = await nats.connect(servers=servers.split(","))
    try:
        js = client.jetstream()
        for _ in range(tries - 1):
            with contextlib.suppress(ServiceUnavailableError):
                return await _jetstream_state(js)
            await asyncio.sleep(0.5)
        return await _jetstream_state(js)
    finally:
        await client.close()


async def _jetstream_state(js: Any) -> tuple[StreamState, ConsumerInfo]:
    stream = (await js.stream_info(MQTT_STREAM)).state
    return stream, await js.consumer_info(MQTT_STREAM, CONSUMER)


def backlog(servers: str) -> int:
    """Messages of the collectors' consumer not yet delivered or not yet acknowledged."""
    info = asyncio.run(jetstream(servers))[1]
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


def jetstream_state(servers: str) -> str:
    stream, consumer = asyncio.run(jetstream(servers))
    return (
        f"stream messages {stream.messages} (last {stream.last_seq}); consumer delivered "
        f"{consumer.delivered.stream_seq if consumer.delivered else None}, ack floor "
        f"{consumer.ack_floor.stream_seq if consumer.ack_floor else None}, ack pending "
        f"{consumer.num_ack_pending}, pending {consumer.num_pending}, redelivered "
        f"{consumer.num_redelivered}"
    )


def test_a_nats_cluster_with_two_collectors_survives_a_node_and_a_collector_killed(
    postgres_url: str, tmp_path: Path
) -> None:
    trial = run_trial(postgres_url, tmp_path)
    print(trial)
    assert trial.published > 0
    assert trial.stored == trial.published, (trial.jetstream, trial.by_node, trial.logs)
    assert trial.messages == trial.batches  # each batch stored exactly once
    assert "verify: OK" in trial.verify, trial.verify
    # Each collector stored a share (the second: after its restart).
    assert min(trial.shares) > 0, (trial.shares, trial.logs)


def test_the_same_run_with_a_collector_that_acknowledges_before_commit_loses_readings(
    postgres_url: str, tmp_path: Path
) -> None:
    trial = run_trial(postgres_url, tmp_path, buggy_second=True)
    print(trial)
    assert trial.stored < trial.published, trial
    assert "verify: OK" in trial.verify, trial.verify  # what was stored is consistent


def test_on_a_nats_deployment_names_nats_cannot_carry_are_refused(tmp_path: Path) -> None:
    """NATS maps an MQTT topic's levels to subject tokens, which '.' separates: a stream or
    device name with a '.' is refused at creation (422, saying why); elsewhere it is fine."""
    url = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    plain = settings(url)
    on_nats = replace(plain, nats_servers=("nats://127.0.0.1:4222",))
    for config, expected in ((on_nats, 422), (plain, 201)):
        with TestClient(create_app(config, collector=False)) as client:
            made = client.post("/api/v1/streams", json=stream_body("site.a"))
            assert made.status_code == expected, made.text
            if expected == 422:
                assert "cannot contain '.' on a NATS deployment" in made.text
            assert client.post("/api/v1/streams", json=stream_body("sitea")).status_code == 201
            enrolled = client.put("/api/v1/streams/sitea/devices/dev.1")
            assert enrolled.status_code == (422 if expected == 422 else 201), enrolled.text
        (tmp_path / "zeal.sqlite").unlink()


def test_without_its_jetstream_the_collector_is_not_ready_and_says_why(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """NATS unreachable (nothing listens on its port), the MQTT broker up: /readyz is 503
    with jetstream "down" and the cause, and /metrics says 0."""
    config = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'zeal.sqlite'}",
            "ZEAL_MQTT_URL": broker.url,
            "ZEAL_COLLECTOR_ID": "no-jetstream",
            "ZEAL_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        }
    )
    with TestClient(create_app(config)) as client:
        collector: Any = state(client).collector
        wait_until(lambda: collector.source("jetstream").last_error is not None, 20, "a NATS error")
        wait_until(lambda: collector.broker_connected, 10, "the MQTT connection")
        ready = client.get("/readyz")
        samples = metric_samples(client.get("/metrics").text)
    assert ready.status_code == 503
    assert samples[("zeal_collector_jetstream_connected", ())] == 0
    assert "NATS nats://127.0.0.1:" in collector.source("jetstream").last_error


def test_a_database_stall_longer_than_the_ack_wait_costs_no_redelivery(tmp_path: Path) -> None:
    """ZEAL_NATS_ACK_WAIT 5 s, the database locked for 14 s while 200 messages arrive: the
    collector keeps extending the wait of what it holds, over one NATS connection, so
    JetStream redelivers nothing and each message is stored once, none as a duplicate."""
    cluster = NatsCluster(tmp_path / "nats").start()
    database = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = Server(database, cluster, tmp_path / "server.log", collector_id="stall")  # type: ignore[arg-type]
    server.env.update(
        ZEAL_NATS_URL=cluster.nats_url, ZEAL_NATS_ACK_WAIT="5", ZEAL_MQTT_PROTOCOL="3.1.1"
    )
    try:
        server.start()
        params = create(server)
        wait_until(lambda: "pulls from JetStream" in server.log.read_text(), 30, "JetStream")
        messages = [
            (data_topic("temps", f"d{d}"), payload)
            for d in range(4)
            for payload in batches(params, "temps", f"d{d}", 50)
        ]
        with stalled(database, 14.0):
            publish_all(cluster.mqtt_ports[1], messages, protocol=MQTTProtocolVersion.MQTTv311)
            # Time is what is tested: the database stalls past two ack waits (5 s) while the
            # collector holds the messages; none may come again.
            time.sleep(12)
        wait_until(lambda: stats(server)["messages"] == len(messages), 30, "all stored")
        samples = metric_samples(server.http.get("/metrics").text)
        redelivered = asyncio.run(jetstream(cluster.nats_url))[1].num_redelivered
        # NATS keeps only QoS 1 messages in $MQTT_msgs: of two batches published on one
        # connection, the first at QoS 0, only the second (at QoS 1) reaches the collector.
        late = [(data_topic("temps", "d8"), p) for p in batches(params, "temps", "d8", 2)]
        publish_all(cluster.mqtt_ports[1], late, MQTTProtocolVersion.MQTTv311, qos=[0, 1])
        wait_until(lambda: stats(server)["messages"] == len(messages) + 1, 30, "the QoS 1 one")
    finally:
        server.stop()
        cluster.stop()
    # One NATS connection throughout: a dropped one loses every acknowledgement of what was
    # fetched on it (the fetch's own timeout once escaped as asyncio's TimeoutError). Before
    # the first pull a young cluster may time out creating the consumer; that is retried.
    log = server.log.read_text()
    assert log.count("pulls from JetStream") == 1, log[-3000:]
    pulling = log[log.index("pulls from JetStream") :]
    assert "retrying" not in pulling, pulling[-3000:]
    assert "reconnected to NATS" not in pulling, pulling[-3000:]
    assert samples[("zeal_collector_messages_total", (("outcome", "stored"),))] == len(messages)
    assert samples[("zeal_collector_messages_total", (("outcome", "duplicate"),))] == 0
    assert redelivered == 0
    with sqlite3.connect(tmp_path / "zeal.sqlite") as lite:
        stored = lite.execute(
            "SELECT seq_floor, seq_head, batches FROM devices WHERE name = 'd8'"
        ).fetchall()
    # The QoS 1 batch (1) alone; its QoS 0 predecessor (0) never arrived: a gap at 0.
    assert stored == [(0, 1, 1)]


def test_the_command_line_refuses_the_same_names_on_a_nats_deployment(tmp_path: Path) -> None:
    create = ("streams", "create", "site.a", "--lower", "0", "--upper", "1", "--epsilon", "1")
    create += ("--local",)  # over HTTP, the API refuses it: the test above
    database = {"ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'zeal.sqlite'}"}
    on_nats = {**database, "ZEAL_MQTT_URL": "mqtt://127.0.0.1:1", "ZEAL_NATS_URL": "nats://n:4222"}
    refused = zeal_server(*create, env=on_nats)
    assert refused.returncode == 2
    assert "cannot contain '.' on a NATS deployment" in refused.stderr
    assert zeal_server(*create, env=database).returncode == 0


async def filter_consumer(servers: str, subject: str) -> None:
    """Make the collectors' consumer what an earlier release made: filtered to `subject`."""
    client = await nats.connect(servers=servers.split(","))
    try:
        js = client.jetstream()
        config = (await js.consumer_info(MQTT_STREAM, CONSUMER)).config
        await js.add_consumer(MQTT_STREAM, replace(config, filter_subject=subject))
    finally:
        await client.close()


def test_messages_on_other_topics_are_acknowledged_and_counted_not_stored(
    tmp_path: Path,
) -> None:
    """The consumer takes all of $MQTT_msgs (a filtered one was several times slower with
    two collectors): QoS 1 messages on other topics, between data batches, are acknowledged
    and counted as skipped, not refused at the door. A consumer an earlier release filtered
    is widened to every subject (">") in place, losing no data published while no collector
    ran, nor after. (Updating the filter away instead broke it on NATS 2.15.1: it
    delivered nothing more, and the stream dropped what came.)"""
    cluster = NatsCluster(tmp_path / "nats").start()
    database = f"sqlite:///{tmp_path / 'zeal.sqlite'}"
    server = Server(database, cluster, tmp_path / "server.log", collector_id="skip")  # type: ignore[arg-type]
    server.env.update(ZEAL_NATS_URL=cluster.nats_url, ZEAL_MQTT_PROTOCOL="3.1.1")
    v311 = MQTTProtocolVersion.MQTTv311
    try:
        server.start()
        params = create(server)
        wait_until(lambda: "pulls from JetStream" in server.log.read_text(), 30, "JetStream")
        server.stop()
        asyncio.run(filter_consumer(cluster.nats_url, "$MQTT.msgs.zeal.v1.*.*.up"))
        data = [(data_topic("temps", "d1"), p) for p in batches(params, "temps", "d1", 8)]
        others = [
            ("zeal/v1/temps/d1/presence", b"{}"),
            ("zeal/v1/temps/d1/notice", b"{}"),
            ("zeal/v1/temps/d1/up/extra", b"not a batch"),
            ("elsewhere/entirely", b"x"),
        ]
        publish_all(cluster.mqtt_ports[0], data[:3], protocol=v311)  # while none runs
        server.start()
        wait_until(lambda: stats(server)["messages"] == 3, 30, "the first data stored")
        before = metric_samples(server.http.get("/metrics").text)
        publish_all(cluster.mqtt_ports[0], others + data[3:6], protocol=v311)
        wait_until(lambda: stats(server)["messages"] == 6, 30, "the data stored")
        publish_all(cluster.mqtt_ports[1], data[6:], protocol=v311)  # through another node
        wait_until(lambda: stats(server)["messages"] == len(data), 30, "the data stored")
        wait_until(lambda: backlog(cluster.nats_url) == 0, 30, "everything acknowledged")
        samples = metric_samples(server.http.get("/metrics").text)
        consumer = asyncio.run(jetstream(cluster.nats_url))[1]
    finally:
        server.stop()
        cluster.stop()
    assert consumer.config.filter_subject == ">"
    skipped = ("zeal_collector_jetstream_skipped_total", ())
    assert samples[skipped] - before[skipped] == len(others)
    assert samples[("zeal_collector_messages_total", (("outcome", "stored"),))] == len(data)
    rejected = [n for (name, _), n in samples.items() if name.startswith("zeal_collector_rej")]
    assert sum(rejected) == 0, samples
