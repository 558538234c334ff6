"""Reliability and security: implausible timestamps, a device clock stepping back,
a full disk under the SQLite store, and tokens on every route and never in the log."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import NO_DEVICE_CAP
from tests.server.metrics_check import metric_samples
from tools.testbed.broker import Mosquitto, Subscriber
from tools.testbed.flood import FLOOD_MESSAGES, flood_trial, limit_packet_size
from tools.testbed.server import Server, create_temps, start_fleet, stream_body, verify, wait_for
from tools.testbed.wait import wait_until
from zeal import Zeal, decode_batch, encode_batch
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings, SettingsError

pytestmark = pytest.mark.integration  # real brokers, servers or outside tools

PARAMS = Zeal(lower=0, upper=110, epsilon=1, payload_bits=6, max_epsilon_per_day=1e6)
DAY_MS = 86_400_000


def batch(device: str, sequence: int, start_ms: int, n: int = 10) -> bytes:
    codes = PARAMS.perturb(np.full(n, 50.0), rng=np.random.default_rng(sequence))
    return encode_batch(
        PARAMS,
        stream="temps",
        device=device,
        sequence=sequence,
        codes=codes,
        timestamps=start_ms + 1000 * np.arange(n),
    )


def test_implausible_timestamps_are_rejected_with_a_reason(database_url: str) -> None:
    """Beyond arrival + ZEAL_MAX_FUTURE_SECONDS (10 min), before arrival −
    ZEAL_MAX_AGE_SECONDS (7 days), before the stream existed (beyond ZEAL_BACKFILL_SECONDS):
    rejected and counted; nothing stored. A batch within the tolerances, including one
    stepping back a little, is stored."""
    settings = ServerSettings.from_env({"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off"})
    limits = (settings.max_future_seconds, settings.max_age_seconds, settings.backfill_seconds)
    assert limits == (600, 7 * 86_400, 300)
    with TestClient(create_app(settings)) as client:
        body = stream_body(payload_bits=6)
        assert client.post("/api/v1/streams", json=body).status_code == 201
        app: Any = client.app
        ingest = Ingest(
            max_future_ms=600_000, max_age_ms=7 * DAY_MS, backfill_ms=300_000, max_buckets=1440
        )
        now = store.now_ms()
        cases = [
            ("a day ahead", "a", 0, now + DAY_MS, "future_timestamp"),
            ("11 minutes ahead", "a", 1, now + 660_000, "future_timestamp"),
            ("last year", "b", 0, now - 365 * DAY_MS, "too_old"),
            ("an hour before the stream", "c", 0, now - 3_600_000, "before_stream"),
            ("now", "d", 0, now, None),
            ("stepped back 2 min", "d", 1, now - 120_000, None),
            ("almost 10 minutes ahead", "e", 0, now + 600_000 - 10_000, None),
        ]
        for label, device, sequence, start_ms, reason in cases:
            payload = batch(device, sequence, start_ms)
            with app.state.sessions() as session, session.begin():
                outcome = ingest.add(session, f"zeal/v1/temps/{device}/up", payload, now)
            if reason is None:
                assert outcome.status == "stored", (label, outcome)
            else:
                assert (outcome.status, outcome.reason) == ("rejected", reason), label
        stats = client.get("/api/v1/streams/temps/stats").json()
        assert stats["rejects"] == {"future_timestamp": 2, "too_old": 1, "before_stream": 1}
        assert (stats["readings"], stats["messages"]) == (30, 3)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ZEAL_MAX_FUTURE_SECONDS", "-1"),
        ("ZEAL_BACKFILL_SECONDS", "soon"),
        ("ZEAL_MAX_AGE_SECONDS", "1e9"),
        ("ZEAL_MAX_BUCKETS_PER_BATCH", "0"),
    ],
)
def test_bad_timestamp_limits_are_refused(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        ServerSettings.from_env({"ZEAL_MQTT_URL": "off", name: value})


class SteppingClock:
    """A device clock that steps back 2 minutes once (an NTP correction, say)."""

    def __init__(self) -> None:
        self.back = 0.0

    def __call__(self) -> float:
        return time.time() - self.back


class Readings:
    """300 readings, 5 ms apart; the device clock steps back after the 150th."""

    description = "300 readings"

    def __init__(self, clock: SteppingClock) -> None:
        self.clock = clock

    def __iter__(self) -> Iterator[Any]:
        from zeal_edge.sources import Reading

        for i in range(300):
            if i == 150:
                self.clock.back = 120.0
            time.sleep(0.005)  # time is the scenario: a sensor read every 5 ms by the clock
            yield Reading(40.0 + i % 30, None, i + 1)


def test_agent_clock_stepping_back_loses_and_duplicates_nothing(
    database_url: str, broker: Mosquitto, tmp_path: Path
) -> None:
    """An agent whose clock steps back 2 minutes mid-run: sequence numbers do not depend on
    the clock, so all 10 batches arrive and are stored once, the later ones stamped earlier."""
    from zeal.mqtt.brokerurl import parse_broker_url
    from zeal_edge.agent import Agent
    from zeal_edge.options import AgentOptions

    settings = ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": broker.url, "ZEAL_COLLECTOR_ID": "c"}
        | NO_DEVICE_CAP  # the stream's policy is raised (stream_body)
    )
    watcher = Subscriber(broker.port)
    try:
        with TestClient(create_app(settings)) as client:
            body = stream_body(payload_bits=6)
            assert client.post("/api/v1/streams", json=body).status_code == 201
            config = client.get("/api/v1/streams/temps/config").json()
            params_file = tmp_path / "params.json"
            params_file.write_text(json.dumps(config))
            options = AgentOptions(
                stream="temps",
                device="dev1",
                data_dir=tmp_path / "agent",
                batch=30,
                interval=3600,
                params_file=params_file,
                max_epsilon_per_day=1e6,  # the policy of stream_body
                device_max_epsilon_per_day=None,  # and no device cap (NO_DEVICE_CAP)
            )
            clock = SteppingClock()
            agent = Agent(options, parse_broker_url(broker.url), clock=clock)
            assert agent.run(lambda offset: Readings(clock), linger=False) == 0
            got = wait_for_stats(client, 300)
            assert (got["messages"], got["readings"]) == (10, 300)
            assert got["rejects"] == {}
        sent = watcher.wait_for(lambda m: len(m) >= 10)
    finally:
        watcher.close()
    batches = {}
    for _topic, payload in sent:
        b = decode_batch(payload, PARAMS_OF(config), stream="temps", device="dev1")
        batches.setdefault(b.sequence, b)
    assert sorted(batches) == list(range(10))
    firsts = [int(batches[s].timestamps.min()) for s in range(10)]
    assert any(later < earlier for earlier, later in itertools.pairwise(firsts))


def PARAMS_OF(config: dict[str, Any]) -> Zeal:
    from zeal.mqtt.streamconfig import params_from_config

    return params_from_config(config)


def wait_for_stats(client: TestClient, readings: int, timeout: float = 30) -> dict[str, Any]:
    body: dict[str, Any] = {}

    def reached() -> bool:
        body.update(client.get("/api/v1/streams/temps/stats").json())
        return bool(body["readings"] >= readings)

    with contextlib.suppress(AssertionError):  # the caller says what is missing
        wait_until(reached, timeout, f"{readings} readings")
    return body


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs: a disk that can really fill up (needs root, as CI and this machine)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs for the disk-full test: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte with one file."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


def test_sqlite_disk_full_is_reported_and_nothing_unstored_is_acknowledged(
    small_disk: Path, broker: Mosquitto, tmp_path: Path
) -> None:
    """The SQLite store's disk fills up mid-run: the collector logs a clear error, /healthz
    answers 503 naming it, nothing is acknowledged unstored; when space returns, it catches
    up and every batch is stored once."""
    url = f"sqlite:///{small_disk}/zeal.sqlite"
    server = Server(url, broker, tmp_path / "server.log").start()
    try:
        create_temps(server)
        filler = fill(small_disk)
        fleet = start_fleet(broker, tmp_path, 50, 300)  # 5 batches of 60 per device, 15 s
        answers: list[httpx.Response] = []

        def failing() -> bool:
            answers.append(server.http.get("/healthz"))
            return answers[-1].status_code == 503

        with contextlib.suppress(AssertionError):
            wait_until(failing, 30, "a 503")
        assert answers[-1].status_code == 503, "the full disk never showed in /healthz"
        health = answers[-1].json()
        assert health["database"] == "failing in the collector"
        assert "full" in (health["collector"]["last_error"] or "")
        stored_while_full = server.stats()
        held = unacknowledged(server)
        # Messages keep arriving and are held, unacknowledged: none of them is stored.
        wait_until(lambda: unacknowledged(server) >= held + 10, 60, "more messages held")
        assert server.stats() == stored_while_full  # nothing more stored, so nothing acked
        os.remove(filler)
        _out, err = fleet.communicate(timeout=180)
        assert fleet.returncode == 0, err
        got = wait_for(server, {"messages": 250, "readings": 15_000})
        assert got == {"messages": 250, "readings": 15_000}, server.log.read_text()[-3000:]
        assert server.http.get("/healthz").status_code == 200
    finally:
        server.stop()
    log = server.log.read_text()
    assert "database or disk is full" in log
    assert "verify: OK" in verify(url)


def unacknowledged(server: Server) -> float:
    samples = metric_samples(server.http.get("/metrics").text)
    return samples.get(("zeal_collector_unacknowledged_messages", ()), 0.0)


OPERATOR = "operator-token-for-reliability-0001"
READER = "reader-token-for-reliability-0002"


def test_every_route_is_guarded_and_tokens_never_logged(broker: Mosquitto, tmp_path: Path) -> None:
    """Every route in the OpenAPI document (reads and writes) answers 401 without a token and
    403 with a wrong one; the server's log, with access logging on, never holds a token."""
    server = Server(f"sqlite:///{tmp_path}/z.sqlite", broker, tmp_path / "server.log")
    server.env.update({"ZEAL_OPERATOR_TOKEN": OPERATOR, "ZEAL_READ_TOKEN": READER})
    server.start()
    try:
        good = {"Authorization": f"Bearer {OPERATOR}"}
        body = stream_body()
        assert server.http.post("/api/v1/streams", json=body, headers=good).status_code == 201
        spec = server.http.get("/openapi.json").json()
        checked = 0
        for path, operations in spec["paths"].items():
            if path in ("/healthz", "/livez", "/readyz"):
                continue  # open on purpose, for probes: their status only without a token
            concrete = path.replace("{name}", "temps").replace("{device}", "sim-00000")
            for method in operations:
                for headers, status in (
                    ({}, 401),
                    ({"Authorization": "Bearer wrong-token-wrong-token"}, 403),
                    ({"Authorization": f"Basic {OPERATOR}"}, 401),
                ):
                    answer = server.http.request(
                        method.upper(),
                        concrete,
                        headers=headers,
                        json={} if method != "get" else None,
                    )
                    assert answer.status_code == status, (method, path, headers, answer.text)
                checked += 1
        assert checked >= 14  # every route, reads and writes
        # A reader can read but not write.
        reader = {"Authorization": f"Bearer {READER}"}
        assert server.http.get("/api/v1/streams", headers=reader).status_code == 200
        assert server.http.post("/api/v1/streams", json=body, headers=reader).status_code == 403
    finally:
        server.stop()
    log = server.log.read_text()
    assert "GET /openapi.json" in log  # access lines are there ...
    assert OPERATOR not in log  # ... but never a token
    assert READER not in log
    assert "wrong-token-wrong-token" not in log


def test_a_flooding_device_is_shed_counted_and_stores_nothing(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """One device floods garbage and 256 KB messages on its own topic (all the broker's ACL
    lets it reach) while 400 devices send 600,000 readings, twice: every reading of the others
    is stored, nothing of the flood is, the flood is counted, and it costs the collector no
    more decodes than its reject budget allows (the rest is shed at the door).

    How much the flood slows the others is a timing, measured by bench/flood.py in
    `make reliability` (limit 20 %); here it is only printed."""
    from zeal_server.broker.door import REJECT_BURST, REJECT_RATE

    limit_packet_size(broker)
    server = Server(f"sqlite:///{tmp_path}/z.sqlite", broker, tmp_path / "server.log").start()
    try:
        trial = flood_trial(server, broker, tmp_path, pairs=2)
    finally:
        server.stop()
    print(trial.summary())
    assert trial.flooded >= 2 * FLOOD_MESSAGES  # a count each flooded run reaches
    assert trial.readings == trial.sent  # the others' all, exactly once; the flood's none
    # The flood reached the collector past the reject budget's bursts (QoS 0: how much of it
    # reaches the collector depends on the machine), and what was past the budget was shed.
    assert sum(trial.rejects.values()) > len(trial.loud) * REJECT_BURST
    assert trial.rejects.get("rate_limited", 0) > 0
    # Each flooded run may spend a full bucket, then REJECT_RATE a second.
    budget = len(trial.loud) * REJECT_BURST + REJECT_RATE * trial.flood_seconds
    assert 0 < trial.decoded_rejects <= budget, (trial.decoded_rejects, budget)


def test_reject_budget_sheds_a_flooding_topic_and_forgives_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 rejects in a burst, then 10 a second; other topics are never touched; a topic that
    stops misbehaving is heard again within about 10 s, however long it flooded."""
    from zeal_server.broker import door

    now = [1000.0]
    monkeypatch.setattr(door.time, "monotonic", lambda: now[0])
    budget = door.RejectBudget()
    evil, good = "zeal/v1/t/evil/up", "zeal/v1/t/good/up"
    for _ in range(100):
        assert budget.allows(evil)
        budget.spend(evil)
    assert not budget.allows(evil)
    assert budget.allows(good)
    for _ in range(100_000):  # a long flood, shed at the door (each still spends)
        budget.spend(evil)
    now[0] += 10.0
    assert not budget.allows(evil)
    now[0] += 0.2
    assert budget.allows(evil)


def test_reject_budget_is_per_device_and_its_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device that varies the stream level (all the ACL lets it choose) spends one budget;
    a million distinct devices leave at most MAX_KEYS buckets; the log throttle lets at most
    LOG_LINES_PER_MINUTE reject lines through a minute, whatever the keys."""
    from zeal_server.broker import door

    now = [1000.0]
    monkeypatch.setattr(door.time, "monotonic", lambda: now[0])
    budget = door.RejectBudget()
    for i in range(100):
        budget.spend(f"zeal/v1/s{i}/evil/up")
    assert not budget.allows("zeal/v1/another/evil/up")
    assert budget.allows("zeal/v1/s0/good/up")
    for i in range(200_000):
        budget.spend(f"zeal/v1/s/dev{i}/up")
    assert len(budget) == door.MAX_KEYS
    throttle = door.LogThrottle()
    passed = sum(throttle.ready(("bad_topic", f"s{i}/d"), now[0]) for i in range(10_000))
    assert passed == door.LOG_LINES_PER_MINUTE
    now[0] += 61
    assert throttle.ready(("bad_topic", "s0/d"), now[0])
