"""Crash safety with real processes: collector SIGKILL, PostgreSQL stopped mid-stream."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tools.testbed.broker import Mosquitto
from tools.testbed.server import Server, create_temps, start_fleet, stream_body, verify, wait_for
from tools.testbed.wait import wait_until

pytestmark = pytest.mark.integration


def test_collector_sigkill_five_times_loses_and_duplicates_nothing(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """SIGKILL the collector at 5 random points of a 60 s run of 100 devices (1,200
    readings each at 20/s): when the readings stored pass seeded random shares of the run
    (progress, not time, so a slow machine kills as often); after each restart it catches
    up. Stored equals sent, each batch once, and `zeal-server verify` finds every
    segment's sums equal to its readings."""
    server = Server(database_url, broker, tmp_path / "server.log").start()
    rng = random.Random(20261129)
    kills = sorted(int(rng.uniform(0.05, 0.85) * 120_000) for _ in range(5))
    try:
        create_temps(server)
        # Batches of 2: a round of 100 messages every 100 ms keeps messages in the
        # collector's hands at any moment, so a kill always catches some unacknowledged
        # (batches of 60 arrive in bursts every 3 s, and a kill between bursts tests little).
        fleet = start_fleet(broker, tmp_path, 100, 1200, batch=2)
        for k, point in enumerate(kills):
            wait_until(lambda p=point: stored(server) >= p, 120, f"kill {k + 1}'s point")
            server.kill()
            server.start()
        out, err = fleet.communicate(timeout=180)
        assert fleet.returncode == 0, err
        assert "120000 acknowledged" in out
        got = wait_for(server, {"messages": 60_000, "readings": 120_000})
        assert got == {"messages": 60_000, "readings": 120_000}, server.log.read_text()[-3000:]
    finally:
        server.stop()
    assert server.log.read_text().count("Uvicorn running") >= 6  # it really restarted 5 times
    assert "verify: OK" in verify(database_url)


def test_broker_restart_while_100_devices_publish(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """The broker stops for 3 s while 100 simulated devices publish. Agents resend what was not
    acknowledged, the collector reconnects, and every reading arrives exactly once."""
    server = Server(database_url, broker, tmp_path / "server.log").start()
    try:
        create_temps(server)
        fleet = start_fleet(broker, tmp_path, 100, 300)  # 5 batches of 60 per device, 15 s
        wait_until(lambda: stored(server) >= 6_000, 60, "a fifth of the run stored")
        broker.stop()
        wait_until(lambda: broker_down(server), 30, "the collector's word on the outage")
        broker.start()
        out, err = fleet.communicate(timeout=180)
        assert fleet.returncode == 0, err
        assert "30000 acknowledged" in out
        got = wait_for(server, {"messages": 500, "readings": 30_000})
        assert got == {"messages": 500, "readings": 30_000}, server.log.read_text()[-3000:]
        health = server.http.get("/healthz").json()
        assert health["broker"] == "ok"
        assert health["collector"]["connects"] >= 2  # it lost the broker and came back
    finally:
        server.stop()
    assert "verify: OK" in verify(database_url)


def _pg_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            version,
            "main",
            action,
            *(["-m", "fast"] if action == "stop" else []),
        ],
        check=True,
        capture_output=True,
    )


@pytest.mark.serial  # stops the PostgreSQL every other test uses
def test_postgresql_outage_is_waited_out(
    postgres_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """PostgreSQL stopped for 15 s mid-stream: /healthz says so, nothing is acknowledged
    unstored, and the collector catches up with everything once it is back."""
    database_url = postgres_url
    if not Path("/etc/postgresql").is_dir():
        pytest.fail("PostgreSQL cluster tools are not installed")
    server = Server(database_url, broker, tmp_path / "server.log").start()
    try:
        assert (
            server.http.post(
                "/api/v1/streams",
                json=stream_body(),
            ).status_code
            == 201
        )
        fleet = start_fleet(broker, tmp_path, 50, 600)  # 10 batches of 60 per device, 30 s
        wait_until(lambda: stored(server) >= 3_000, 60, "a tenth of the run stored")
        _pg_cluster("stop")
        statuses: set[int] = set()
        back = time.monotonic() + 15  # the outage's length is the scenario

        def watched() -> bool:
            statuses.add(server.http.get("/healthz").status_code)
            return time.monotonic() > back

        try:
            wait_until(watched, 60, "15 s of PostgreSQL stopped")
        finally:
            _pg_cluster("start")
        assert 503 in statuses
        _out, err = fleet.communicate(timeout=120)
        assert fleet.returncode == 0, err
        got = wait_for(server, {"messages": 500, "readings": 30_000})
        assert got == {"messages": 500, "readings": 30_000}, server.log.read_text()[-3000:]
        assert server.http.get("/healthz").status_code == 200
    finally:
        server.stop()
    assert "verify: OK" in verify(database_url)


def stored(server: Server) -> int:
    """Readings stored so far (0 while the server restarts)."""
    with contextlib.suppress(httpx.HTTPError, KeyError):
        return int(
            server.http.get("/api/v1/streams/temps/stats?efficiency=false").json()["readings"]
        )
    return 0


def broker_down(server: Server) -> bool:
    return bool(server.http.get("/healthz").json().get("broker") == "down")
