"""The collector's writer thread tells a database outage from a bug: the first is retried
with backoff and nothing is acknowledged meanwhile, the second stops the writer loudly and
fails the liveness probe (the broker keeps what was not acknowledged).

Unit tests of the writer: the ingest layer below it is replaced by a function that fails
as told; the database, the app and /livez are real."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from tests.server.helpers import settings
from tools.testbed.appstate import state
from tools.testbed.fakepaho import FakeClient
from zeal_server.app import create_app
from zeal_server.broker.collector import Collector
from zeal_server.broker.inbox import Inbox, Received
from zeal_server.broker.wiring import transaction_max
from zeal_server.broker.writer import tally
from zeal_server.ingest.groups import Outcome
from zeal_server.settings import ServerSettings


@pytest.fixture
def client(tmp_path: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings(f"sqlite:///{tmp_path / 'z.sqlite'}"))) as c:
        yield c


def writer(client: TestClient, tmp_path: Any) -> tuple[Collector, FakeClient]:
    """A collector that is never started, on a fake MQTT client that records its
    acknowledgements; one message queued."""
    server = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": "sqlite://",
            "ZEAL_DATA_DIR": str(tmp_path),
            "ZEAL_MQTT_URL": "mqtt://127.0.0.1:1",
            "ZEAL_COLLECTOR_ID": "zeal-collector-writer-test",  # no identity file to hold
        }
    )
    fake = FakeClient()
    sessions = state(client).sessions
    collector = Collector(server, sessions, mqtt_client=fake)
    collector.queue.put(Received("zeal/v1/temps/a/up", b"\x02", 7, 1, 0, collector.mqtt))
    return collector, fake


def acked(fake: FakeClient) -> list[int]:
    """The mids the collector acknowledged to the (fake) broker."""
    return [mid for mid, _qos in fake.acked]


def test_a_bug_in_the_writer_stops_it_loudly_and_fails_liveness_and_readiness(
    client: TestClient, tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    collector, fake = writer(client, tmp_path)

    def bug(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug in ingest")

    collector.writer.ingest.add_many = bug  # type: ignore[method-assign]
    assert client.get("/livez").status_code == 200
    state(client).collector = collector
    assert client.get("/livez").status_code == 200  # the writer has not met the bug yet
    with caplog.at_level(logging.ERROR, logger="zeal_server.broker.writer"):
        collector.writer._write_loop()  # returns: the writer thread would end here
    assert collector.writer_error == "ZeroDivisionError: a bug in ingest"
    assert acked(fake) == []  # the broker redelivers it to the restarted server
    assert collector.writer.database_ok  # not mistaken for a database outage
    record = next(r for r in caplog.records if "writer stopped" in r.getMessage())
    assert record.exc_info is not None  # with its traceback
    answer = client.get("/livez")
    assert (answer.status_code, answer.json()) == (503, {"status": "writer stopped"})
    ready = client.get("/readyz")  # what Compose's health check asks
    assert (ready.status_code, ready.json()["writer"]) == (503, "down")
    state(client).collector = None


def test_a_database_error_is_retried_and_nothing_is_acknowledged_meanwhile(
    client: TestClient, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector, fake = writer(client, tmp_path)
    real = collector.writer.ingest.add_many
    failures = [OperationalError("INSERT …", {}, Exception("database is locked"))]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    collector.writer.ingest.add_many = flaky  # type: ignore[method-assign]
    collector.writer._backoff = 0.01
    pending = collector.queue.take(10)
    assert collector.writer._commit(pending) == "retry"
    assert (acked(fake), collector.writer.database_ok) == ([], False)
    assert collector.writer.last_error == "database: Exception: database is locked"
    assert collector.writer._commit(pending) == "stored"
    assert (acked(fake), collector.writer.database_ok, collector.writer_error) == ([7], True, None)
    assert collector.rejected_by == {"unknown_stream": 1}  # stored as a reject, acknowledged


#: The source of messages the inbox and the tally only carry along.
ANY_SOURCE: Any = object()


def received(n: int) -> Received:
    return Received("zeal/v1/temps/a/up", b"\x02", n, 1, 0, ANY_SOURCE)


def test_the_inbox_hands_messages_over_in_order_at_most_batch_max_at_a_time() -> None:
    inbox = Inbox(100)
    assert inbox.take(10, wait=0.01) == []  # nothing came
    for n in range(25):
        assert inbox.put(received(n))
    first = inbox.take(10, gather=0.01)
    rest = inbox.take(100, gather=0.01)
    assert [m.mid for m in first] == list(range(10))
    assert [m.mid for m in rest] == list(range(10, 25))
    assert inbox.empty()


@pytest.mark.parametrize(
    ("database", "nats", "expected"),
    [
        ("sqlite:///z.sqlite", "", 20_000),  # SQLite works in-process: the whole window
        ("sqlite:///z.sqlite", "nats://127.0.0.1:4222", 10_000),  # JetStream asks for more
        ("postgresql+psycopg://127.0.0.1/test", "", 10_000),
        ("postgresql+psycopg://127.0.0.1/test", "nats://127.0.0.1:4222", 10_000),
    ],
)
def test_a_transaction_leaves_half_the_window_to_the_source_unless_sqlite_works_beside_paho(
    database: str, nats: str, expected: int
) -> None:
    env = {"ZEAL_DATABASE_URL": database, "ZEAL_MQTT_URL": "mqtt://127.0.0.1:1"}
    if nats:
        env["ZEAL_NATS_URL"] = nats
    assert transaction_max(ServerSettings.from_env(env)) == expected
    env["ZEAL_COLLECTOR_INFLIGHT"] = "11"
    assert transaction_max(ServerSettings.from_env(env)) == (11 if expected == 20_000 else 5)


def test_a_full_inbox_holds_the_network_thread_until_the_writer_takes_some() -> None:
    """More than its size came (the broker sent more than Receive Maximum): put waits for
    room, says it had to (counted as queue_full), and loses nothing; the writer's take
    lets it go on."""
    inbox = Inbox(3)
    for n in range(3):
        assert inbox.put(received(n))
    outcome: list[bool] = []
    late = threading.Thread(target=lambda: outcome.append(inbox.put(received(3))))
    late.start()
    late.join(0.3)
    assert late.is_alive()  # waiting for room
    assert inbox.qsize() == 3
    taken = inbox.take(2, gather=0.01)
    late.join(5)
    assert not late.is_alive()
    assert outcome == [False]
    assert [m.mid for m in taken + inbox.take(10, gather=0.01)] == [0, 1, 2, 3]


def test_what_start_up_made_is_frozen_for_the_garbage_collector_while_the_app_runs(
    tmp_path: Any,
) -> None:
    """Full collections skip the objects the server started with (api.create_app freezes
    them: bench/message_cost.py measured a third of the writer's time in collections
    walking them), and they are handed back to the collector at shutdown."""
    gc.unfreeze()
    with TestClient(create_app(settings(f"sqlite:///{tmp_path / 'f.sqlite'}"))):
        assert gc.get_freeze_count() > 10_000  # modules, classes, SQLAlchemy's metadata, ...
    assert gc.get_freeze_count() == 0


def test_a_committed_rounds_figures_count_every_outcome_and_single_out_resets_and_rejects() -> None:
    """tally, on a round of only stored messages and on a mixed one: the counts by status,
    the readings stored, the arrival times of the stored messages, and the resets and
    rejects with their messages (a duplicate needs nothing more)."""
    stored = [Outcome("stored", None, "temps", "a", 3, k) for k in range(4)]
    reset = Outcome("stored", None, "temps", "b", 2, 0, True, 9)
    messages = [Received("zeal/v1/temps/a/up", b"", k, 1, 1000 + k, ANY_SOURCE) for k in range(5)]
    statuses, lags, unusual = tally(messages, [*stored, reset])
    assert statuses == {"stored": 5, "readings": 14}
    assert lags == [1000, 1001, 1002, 1003, 1004]
    assert unusual == [(messages[4], reset)]
    mixed = [
        stored[0],
        Outcome("duplicate", None, "temps", "a", 0, 1),
        Outcome("rejected", "too_old", "temps", "c", sequence=4),
        reset,
        Outcome("rejected", "bad_topic"),
    ]
    statuses, lags, unusual = tally(messages, mixed)
    assert statuses == {"stored": 2, "duplicate": 1, "rejected": 2, "readings": 5}
    assert lags == [1000, 1003]
    assert unusual == [(messages[2], mixed[2]), (messages[3], reset), (messages[4], mixed[4])]
