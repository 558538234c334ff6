"""A device's cap across streams end to end: a real Mosquitto, the real server under its
default settings (a device cap of 8 epsilon a day), the real agent. A device sending one
reading an hour of one day into three streams at epsilon 1 while ignoring its ledger has 8
stored in all and the rest refused as device_cap; an honest agent running the three
streams together sends nothing the collector refuses, split evenly or by shares."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import publish_all, wait_until
from tests.server.ingest.homes import STREAMS, totals
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, agent_status
from zeal import Zeal, encode_batch
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal_server import store
from zeal_server.store.db import make_engine, session_factory

pytestmark = pytest.mark.integration

#: The environment with the agent's default device cap (the suite lifts it, tests/conftest.py).
DEFAULTS = {k: v for k, v in os.environ.items() if k != "ZEAL_DEVICE_MAX_EPSILON_PER_DAY"}


def yesterday_hours() -> list[int]:
    """The start of every hour of yesterday (UTC, computed when the test runs)."""
    day = day_of(int(time.time() * 1000)) - 1
    return [day * DAY_MS + h * HOUR_MS for h in range(24)]


def flags(client: TestClient, stream: str, device: str) -> list[str]:
    devices = client.get(f"/api/v1/streams/{stream}/devices").json()["devices"]
    return next(d["flags"] for d in devices if d["name"] == device)


def test_a_device_ignoring_its_ledger_stores_at_most_its_cap_across_three_streams(
    client: TestClient, broker: Mosquitto
) -> None:
    """One reading an hour of yesterday into each of three streams at epsilon 1 (72 in
    all; each stream's policy allows 8): 8 stored (the device hour rule lets the first
    stream's reading of each hour in, until the first stream's policy is spent), the other
    streams' 48 refused as device_cap and flagged on the device's rows, the first stream's
    last 16 as over_budget; one all at once is covered by test_device_cap.py."""
    params = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=8.0)
    for hour, start in enumerate(yesterday_hours()):  # as such a device sends: hour by hour
        messages = []
        for k, stream in enumerate(STREAMS):
            payload = encode_batch(
                params,
                stream=stream,
                device="rogue",
                sequence=hour,
                timestamps=[start + k],
                codes=params.perturb([50.0]),
            )
            messages.append((f"zeal/v1/{stream}/rogue/up", payload))
        publish_all(broker.port, messages)
        wait_until(
            lambda h=hour: (
                sum(totals(client, "rogue")[1].values()) + totals(client, "rogue")[0] == 3 * (h + 1)
            ),
            timeout=60,
            what=f"hour {hour}'s batches settled",
        )
    stored, rejects = totals(client, "rogue")
    assert (stored, rejects) == (8, {"device_cap": 48, "over_budget": 16})
    assert flags(client, STREAMS[0], "rogue") == ["over_budget"]
    for stream in STREAMS[1:]:
        assert "device_cap" in flags(client, stream, "rogue")
    budget = client.get("/api/v1/budgets/devices/rogue").json()
    assert (budget["max_epsilon_per_day"], budget["source"]) == (8.0, "default")
    assert budget["streams"] == list(STREAMS)


def run_agent(tmp_path: Path, broker: Mosquitto, device: str, *extra: str) -> dict[str, Any]:
    """The real agent, the three streams in one process, each reading its own file of one
    reading every third hour of yesterday, the streams' hours apart (TIMESTAMP_MS,VALUE
    lines; 8 readings each): the device hour rule allows one reading an hour across them."""
    folder = tmp_path / device
    folder.mkdir()
    for k, stream in enumerate(STREAMS):
        hours = list(enumerate(yesterday_hours()))[k::3]
        lines = "".join(f"{start},{40 + h}\n" for h, start in hours)
        (folder / f"{stream}.txt").write_text(lines)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeal_edge",
            "run",
            *("--stream", ",".join(STREAMS)),
            *("--device", device),
            *("--source", f"cmd:cat {folder}/{{stream}}.txt"),
            *("--broker", broker.url),
            *("--data-dir", str(folder / "data")),
            *("--batch", "5", "--batch-seconds", "1"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=DEFAULTS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "share of the device cap reached" in result.stderr
    return {s["stream"]: s for s in agent_status(folder / "data")}


@pytest.mark.parametrize(
    ("shares", "expected"), [((), [2, 2, 2]), (("--shares", "3,3,2"), [3, 3, 2])]
)
def test_an_honest_agent_of_three_streams_sends_nothing_the_collector_refuses(
    client: TestClient,
    broker: Mosquitto,
    tmp_path: Path,
    shares: tuple[str, ...],
    expected: list[int],
) -> None:
    """Evenly, each stream may spend 8/3 epsilon: 2 readings each (6 of the 8); with
    shares 3,3,2 all 8. Either way every reading sent is stored."""
    status = run_agent(tmp_path, broker, "home", *shares)
    assert [status[s]["sent_readings"] for s in STREAMS] == expected
    assert [status[s]["skipped_for_policy"] for s in STREAMS] == [8 - n for n in expected]
    wait_until(
        lambda: totals(client, "home")[0] == sum(expected), timeout=60, what="readings stored"
    )
    assert totals(client, "home") == (sum(expected), {})


def test_a_cap_set_by_another_process_applies_once_the_collector_sees_it_changed(
    client: TestClient, broker: Mosquitto, database_url: str
) -> None:
    """The collector keeps each device's cap cached and reads only the counter of cap
    changes every 2 s (store.versions): a cap lowered to 2 by another process (its own
    engine and transaction, as a second server would) is seen at the next poll, and from
    then on the device stores 2 readings of the day in all, the rest refused as device_cap."""
    params = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=8.0)
    hours = yesterday_hours()

    def send(hour: int) -> None:
        payload = encode_batch(params, stream="humidity", device="moved", sequence=hour,
                               timestamps=[hours[hour]], codes=params.perturb([50.0]))  # fmt: skip
        publish_all(broker.port, [("zeal/v1/humidity/moved/up", payload)])
        wait_until(
            lambda: (
                sum(totals(client, "moved")[1].values()) + totals(client, "moved")[0] == hour + 1
            ),
            timeout=60,
            what=f"hour {hour}'s batch settled",
        )

    send(0)  # stored under the default cap of 8, which the collector now holds cached
    collector = state(client).collector
    engine = make_engine(database_url)
    try:
        with session_factory(engine)() as session, session.begin():
            store.set_device_cap(session, "moved", 2.0)
        with session_factory(engine)() as session:
            changed = store.caps_version(session)
    finally:
        engine.dispose()
    wait_until(
        lambda: collector.writer._caps_version == changed, timeout=30, what="the change seen"
    )
    for hour in range(1, 6):
        send(hour)
    assert totals(client, "moved") == (2, {"device_cap": 4})
