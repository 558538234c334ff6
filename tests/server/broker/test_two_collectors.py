"""Two collectors on one PostgreSQL database, sharing the load through a shared
subscription: 200 devices at full speed for 60 s, no deadlock, every reading stored once.
Real Mosquitto, two real servers, the real simulator."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import settings
from tests.server.metrics_check import metric_samples
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, fleet_command
from tools.testbed.server import Server, create, stats, stream_body, verify, wait_until
from zeal import encode_batch
from zeal.mqtt.streamconfig import params_from_config
from zeal.mqtt.topics import data_topic
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.store import rawsql

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

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


@pytest.mark.serial  # full speed for 60 s: the machine to itself
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


def test_two_transactions_meeting_the_same_devices_in_opposite_orders_do_not_deadlock(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving that deadlocks rows locked in arrival order, forced: with both devices
    enrolled and one row per statement, collector A books dev1's day, then waits (at most
    3 s) until collector B has booked its first ledger row before it goes on to dev2's. In
    arrival order B's first is dev2's: B then holds dev2's row and waits for dev1's while A
    waits for dev2's, and PostgreSQL breaks the cycle by failing one. In key order B's first
    is dev1's: B waits for A's commit, A goes on after 3 s, and both store."""
    monkeypatch.setattr(rawsql, "MAX_ROWS", 1)
    with TestClient(create_app(settings(postgres_url), collector=False)) as client:
        client.post("/api/v1/streams", json=stream_body())
        sessions = state(client).sessions
        params = params_from_config(
            json.dumps(client.get("/api/v1/streams/temps/config").json()), stream="temps"
        )
        now = int(time.time() * 1000)

        def message(device: str, sequence: int) -> tuple[str, bytes, int]:
            payload = encode_batch(
                params,
                stream="temps",
                device=device,
                sequence=sequence,
                codes=params.perturb(np.full(5, 50.0), rng=np.random.default_rng(sequence)),
                timestamps=now + 1000 * np.arange(5),
            )
            return (data_topic("temps", device), payload, now)

        b_started = threading.Event()
        a_paused = threading.Event()
        outcomes: dict[str, Any] = {}

        class Paused(rawsql.Raw):
            """Collector A: after its first ledger row, waits (at most 3 s) for B."""

            waited = False

            def _run(self, session: Any, sql: str, values: Any) -> list[Any]:
                done = super()._run(session, sql, values)
                if "device_periods" in sql and not self.waited:
                    self.waited = True
                    a_paused.set()
                    b_started.wait(3)
                return done

        class Signalling(rawsql.Raw):
            """Collector B: says when it has booked its first ledger row (in key order
            that never happens before A commits: B waits for dev1's row)."""

            def _run(self, session: Any, sql: str, values: Any) -> list[Any]:
                done = super()._run(session, sql, values)
                if "device_periods" in sql:
                    b_started.set()
                return done

        with sessions() as session, session.begin():  # known devices: no wait on their rows
            stream = store.stream_by_name(session, "temps")
            assert stream is not None
            for name in ("dev1", "dev2"):
                store.enroll(session, stream, name)

        def collector(raw: rawsql.Raw) -> Ingest:
            made = Ingest()
            made._raw = raw
            return made

        def run(name: str, ingest: Ingest, messages: list[Any]) -> None:
            try:
                with sessions() as session, session.begin():
                    outcomes[name] = [o.status for o in ingest.add_many(session, messages)]
            except Exception as exc:  # the test reports it
                outcomes[name] = exc

        first = threading.Thread(
            target=run, args=("A", collector(Paused()), [message("dev1", 0), message("dev2", 0)])
        )
        first.start()
        assert a_paused.wait(30)  # A holds dev1's rows and waits
        second = threading.Thread(
            target=run,
            args=("B", collector(Signalling()), [message("dev2", 1), message("dev1", 1)]),
        )
        second.start()
        first.join(30)
        second.join(30)
        stored = client.get("/api/v1/streams/temps/stats").json()["readings"]
    assert outcomes == {"A": ["stored", "stored"], "B": ["stored", "stored"]}, outcomes
    assert stored == 20
