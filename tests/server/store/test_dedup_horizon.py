"""The dedup horizon: a batch's dedup row is kept while a copy of the batch could still be
accepted and deleted once its first reading is behind the import window; a copy that comes
later is refused (too_old), never stored twice, whatever import window the collector that
receives it has (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from tests.server.helpers import PARAMS, create, operator_client
from zeal import encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store import dedup, retention
from zeal_server.store.models import BatchSeen, Stream

MINUTE = 60_000
NOW = (store.now_ms() // MINUTE) * MINUTE
TOPIC = "zeal/v1/temps/dev0/up"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def batch(sequence: int, first_ms: int, n: int = 5) -> bytes:
    codes = PARAMS.perturb(np.full(n, 50.0), rng=np.random.default_rng(sequence))
    return encode_batch(
        PARAMS,
        stream="temps",
        device="dev0",
        sequence=sequence,
        codes=codes,
        timestamps=first_ms + 1000 * np.arange(n),
    )


def add(client: TestClient, payload: bytes, received_ms: int, max_age_ms: int | None) -> Any:
    ingest = Ingest(max_age_ms=max_age_ms)
    with client.app.state.sessions() as session, session.begin():  # type: ignore[attr-defined]
        return ingest.add(session, TOPIC, payload, received_ms)


def housekeep(client: TestClient, now_ms: int, max_age_ms: int) -> None:
    with client.app.state.sessions() as session, session.begin():  # type: ignore[attr-defined]
        streams = store.list_streams(session)
        retention.housekeep(session, streams, now_ms, max_age_ms=max_age_ms)


def dedup_rows(client: TestClient) -> int:
    with client.app.state.sessions() as session:  # type: ignore[attr-defined]
        return int(session.scalar(select(func.count()).select_from(BatchSeen)) or 0)


def test_a_copy_after_the_prune_is_refused_never_stored_twice(client: TestClient) -> None:
    """With a one-minute import window: a copy within it is a duplicate; once the batch's
    first reading is behind the horizon its row goes, and a copy is refused too_old, even
    by a collector without an import window; newer batches are stored as before."""
    create(client)
    first = batch(0, NOW - 30_000)
    assert add(client, first, NOW, 60_000).status == "stored"
    assert add(client, first, NOW + 1_000, 60_000).status == "duplicate"
    housekeep(client, NOW + 20_000, 60_000)  # horizon NOW - 40 s: the batch is still inside
    assert dedup_rows(client) == 1
    assert add(client, first, NOW + 21_000, 60_000).status == "duplicate"
    before = client.get("/api/v1/streams/temps/average").json()

    housekeep(client, NOW + 40_000, 60_000)  # horizon NOW - 20 s: behind it
    assert dedup_rows(client) == 0
    with client.app.state.sessions() as session:  # type: ignore[attr-defined]
        assert session.scalar(select(Stream.horizon_ms)) == NOW - 20_000
    for max_age in (60_000, None, 10**12):  # whatever window the receiving collector has
        outcome = add(client, first, NOW + 41_000, max_age)
        assert (outcome.status, outcome.reason) == ("rejected", "too_old")
    assert client.get("/api/v1/streams/temps/average").json() == before
    assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 5

    assert add(client, batch(1, NOW + 35_000), NOW + 41_000, 60_000).status == "stored"
    assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 10
    housekeep(client, NOW - 10**9, 60_000)  # a collector whose clock is far behind
    with client.app.state.sessions() as session:  # type: ignore[attr-defined]
        assert session.scalar(select(Stream.horizon_ms)) == NOW - 20_000  # never moves back


def test_a_prune_waits_for_a_transaction_that_read_the_horizon(postgres_url: str) -> None:
    """PostgreSQL: an ingest transaction holds its stream row share-locked from reading the
    horizon to its commit, so a prune that moves the horizon waits for it, then deletes
    the row it wrote: the copy that follows is refused. (Without the lock, the ingest could
    check an old horizon, the prune delete the batch's row meanwhile, and a copy be stored
    again.)"""
    with contextmanager(operator_client)(postgres_url) as client:
        create(client)
        sessions = client.app.state.sessions  # type: ignore[attr-defined]
        payload = batch(0, NOW - 30_000)
        with sessions() as ingesting:
            ingesting.begin()
            assert Ingest().add(ingesting, TOPIC, payload, NOW).status == "stored"
            pid = ingesting.scalar(text("SELECT pg_backend_pid()"))
            done = threading.Event()

            def prune() -> None:
                with sessions() as session, session.begin():
                    stream = session.scalar(select(Stream))
                    assert stream is not None
                    dedup.prune(session, stream.id, NOW)
                done.set()

            pruner = threading.Thread(target=prune)
            pruner.start()
            with sessions() as watcher:  # the pruner waits on the lock the ingest holds
                for _ in range(600):
                    blocked = watcher.scalar(
                        text("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON "
                             "a.pid = l.pid WHERE NOT l.granted AND :pid = ANY("
                             "pg_blocking_pids(a.pid))"),
                        {"pid": pid},
                    )  # fmt: skip
                    if blocked:
                        break
                    watcher.rollback()
                    done.wait(0.05)
            assert blocked
            assert not done.is_set()
            ingesting.commit()
        pruner.join(timeout=30)
        assert done.is_set()
        assert dedup_rows(client) == 0  # the row the ingest wrote went with the prune
        outcome = add(client, payload, NOW + 1_000, None)
        assert (outcome.status, outcome.reason) == ("rejected", "too_old")
        assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 5
