"""Two collectors on one PostgreSQL database, sharing the load through a shared
subscription: 200 devices at full speed for 60 s, no deadlock, every reading stored once.
Real Mosquitto, two real servers, the real simulator."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg

from tests.server.metrics_check import metric_samples
from tools.testbed.broker import Mosquitto, fleet_command
from tools.testbed.server import Server, create, stats, verify, wait_until

DEVICES, SECONDS = 200, 60


def deadlocks(database_url: str) -> int:
    """PostgreSQL's own count of deadlocks it broke in this database."""
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def stored_by(server: Server) -> float:
    samples = metric_samples(server.http.get("/metrics").text)
    return samples[("zeal_collector_readings_total", ())]


def test_two_collectors_share_200_devices_at_full_speed_without_deadlock(
    postgres_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    servers = [
        Server(postgres_url, broker, tmp_path / f"server{i}.log", collector_id=f"collector-{i}")
        for i in (1, 2)
    ]
    for server in servers:
        server.env["ZEAL_SHARE_GROUP"] = "zeal"
    try:
        for server in servers:
            server.start()
        create(servers[0])
        before = deadlocks(postgres_url)
        fleet = subprocess.run(
            fleet_command(
                broker.url,
                tmp_path / "sim",
                *("--devices", str(DEVICES), "--rate", "0", "--batch", "10"),
                *("--duration", str(SECONDS), "--log-level", "WARNING"),
            ),
            capture_output=True,
            text=True,
            timeout=SECONDS + 120,
            check=False,
        )
        assert fleet.returncode == 0, fleet.stderr
        found = re.search(r"(\d+) readings in (\d+) batches, (\d+) acknowledged", fleet.stdout)
        assert found, fleet.stdout
        readings, batches, acked = map(int, found.groups())
        assert acked == readings > 0
        wait_until(
            lambda: stats(servers[1])["readings"] >= readings, 120, f"{readings} readings stored"
        )
        final = stats(servers[0])
        shares = [stored_by(server) for server in servers]
    finally:
        for server in servers:
            server.stop()
    print(f"{readings} readings in {batches} batches; stored by each collector: {shares}")
    assert final["readings"] == readings
    assert final["messages"] == batches  # each batch stored once: no duplicate counted twice
    assert sum(shares) == readings
    assert min(shares) > 0.1 * readings, shares  # both collectors took a share
    assert deadlocks(postgres_url) == before
    logs = "".join(server.log.read_text() for server in servers)
    assert "deadlock" not in logs.lower()
    checked = verify(postgres_url)
    assert "verify: OK" in checked, checked
