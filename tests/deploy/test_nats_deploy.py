"""deploy/nats: the cluster profile's nats.conf and users.conf.example, run by the real
nats-server (three nodes, addresses rewritten to loopback ports, MQTT over TLS with the
certificates of deploy/tls/make-certs): the configuration is valid, the collector logs in
with its login, a device writes only its own data topic and finds its stream's
configuration on any node, and a plain MQTT connection gets no CONNACK."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tools.testbed.broker import run_agent, seattle_rows
from tools.testbed.nats import DEPLOY, NatsCluster, deploy_config, nats_server
from tools.testbed.server import Server, create, stats, wait_until

pytestmark = pytest.mark.integration

USERS = (DEPLOY / "users.conf.example").read_text()


def test_nats_server_finds_the_deploy_configuration_valid(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path, users=USERS)
    for node in range(cluster.size):
        path = tmp_path / f"check{node}.conf"
        path.write_text(deploy_config(node, cluster))
        checked = subprocess.run(
            [nats_server(), "-t", "-c", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "NATS_NAME": f"nats{node + 1}"},
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
        assert "is valid" in checked.stdout + checked.stderr


def agent(cluster: NatsCluster, node: int, device: str, tmp_path: Path) -> str:
    """`zeal-edge run` as dev1 (its login) through `node`, 120 readings; its stderr."""
    return run_agent(
        cluster.mqtt_url(node),
        tmp_path / f"agent-{device}",
        device,
        seattle_rows(tmp_path / "rows.csv", 120),
        *("--protocol", "3.1.1", "--username", "dev1", "--ca", str(cluster.ca)),
        ZEAL_MQTT_PASSWORD="change-me-dev1",
    ).stderr


def test_a_device_on_any_node_reaches_the_collector_through_the_deploy_cluster(
    tmp_path: Path,
) -> None:
    cluster = NatsCluster(tmp_path / "nats", users=USERS).start()
    server = Server(
        f"sqlite:///{tmp_path / 'zeal.sqlite'}",
        cluster,  # type: ignore[arg-type]
        tmp_path / "server.log",
        collector_id="zeal-collector",
    )
    server.env.update(
        ZEAL_MQTT_URL=cluster.mqtt_url(0),
        ZEAL_MQTT_CA=str(cluster.ca),
        ZEAL_MQTT_PROTOCOL="3.1.1",
        ZEAL_MQTT_USERNAME="zeal-collector",
        ZEAL_MQTT_PASSWORD="change-me-collector",
        ZEAL_NATS_URL=cluster.nats_url,
    )
    try:
        server.start()
        wait_until(lambda: "pulls from JetStream" in server.log.read_text(), 30, "JetStream")
        create(server)
        # dev1 on node 3 finds the configuration the collector published on node 1.
        own = agent(cluster, 2, "dev1", tmp_path)
        wait_until(lambda: stats(server)["readings"] == 120, 30, "dev1's readings")
        # dev1's login as device dev2: NATS denies the publish; nothing is stored.
        other = agent(cluster, 1, "dev2", tmp_path)
        after = stats(server)
        # An MQTT 3.1.1 CONNECT in clear to a node's listener gets no CONNACK.
        with socket.create_connection(("127.0.0.1", cluster.mqtt_ports[0]), timeout=30) as raw:
            raw.sendall(b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x0a\x00\x02ab")
            try:
                plain = raw.recv(64)
            except OSError:
                plain = b""
    finally:
        server.stop()
        cluster.stop()
    assert "stream parameters: Zeal(" in own, own  # the configuration, on another node
    assert after["readings"] == 120, (after, other[-2000:])
    assert not plain.startswith(b"\x20"), plain
    # Like Mosquitto, NATS acknowledges a 3.1.1 publish it denies (docs/edge-agent.md):
    # the agent saw both batches confirmed, and they are gone from its outbox.
    # (One line per confirmation, or one for both: "2 batches, #0 to #1".)
    assert re.search(
        r"confirmed by the broker: (batch #1|\d+ batches, #\d+ to #1)$", other, re.M
    ), other
