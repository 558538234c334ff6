"""The dedup horizon: a copy of a batch whose first reading is behind the import window is
refused (too_old), never stored twice, whatever import window the collector that receives
it has; and the gaps in a device's sequences behind it are counted missing, exactly the
batches withheld (SQLite and PostgreSQL)."""

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
from tools.testbed.appstate import state
from zeal import encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store import retention, sequences
from zeal_server.store.models import Device, Stream

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
    with state(client).sessions() as session, session.begin():
        return ingest.add(session, TOPIC, payload, received_ms)


def housekeep(client: TestClient, now_ms: int, max_age_ms: int) -> None:
    with state(client).sessions() as session, session.begin():
        streams = store.list_streams(session)
        retention.housekeep(session, streams, now_ms, max_age_ms=max_age_ms)


def counted(client: TestClient) -> tuple[int, int]:
    """(missing, late) of the device."""
    with state(client).sessions() as session:
        row = session.execute(select(func.sum(Device.missing), func.sum(Device.late))).one()
        return int(row[0] or 0), int(row[1] or 0)


def test_a_copy_after_the_prune_is_refused_never_stored_twice(client: TestClient) -> None:
    """With a one-minute import window: a copy within it is a duplicate; once the batch's
    first reading is behind the horizon a copy is refused too_old, even
    by a collector without an import window; newer batches are stored as before."""
    create(client)
    first = batch(0, NOW - 30_000)
    assert add(client, first, NOW, 60_000).status == "stored"
    assert add(client, first, NOW + 1_000, 60_000).status == "duplicate"
    housekeep(client, NOW + 20_000, 60_000)  # horizon NOW - 40 s: the batch is still inside
    assert add(client, first, NOW + 21_000, 60_000).status == "duplicate"
    before = client.get("/api/v1/streams/temps/average").json()

    housekeep(client, NOW + 40_000, 60_000)  # horizon NOW - 20 s: behind it
    assert counted(client) == (0, 0)
    with state(client).sessions() as session:
        assert session.scalar(select(Stream.horizon_ms)) == NOW - 20_000
    for max_age in (60_000, None, 10**12):  # whatever window the receiving collector has
        outcome = add(client, first, NOW + 41_000, max_age)
        assert (outcome.status, outcome.reason) == ("rejected", "too_old")
    assert client.get("/api/v1/streams/temps/average").json() == before
    assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 5

    assert add(client, batch(1, NOW + 35_000), NOW + 41_000, 60_000).status == "stored"
    assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 10
    housekeep(client, NOW - 10**9, 60_000)  # a collector whose clock is far behind
    with state(client).sessions() as session:
        assert session.scalar(select(Stream.horizon_ms)) == NOW - 20_000  # never moves back


def test_a_prune_waits_for_a_transaction_that_read_the_horizon(postgres_url: str) -> None:
    """PostgreSQL: an ingest transaction holds its stream row share-locked from reading the
    horizon to its commit, so a prune that moves the horizon waits for it: the copy that
    follows is refused. (Without the lock, the ingest could store a batch from a gap the
    prune counts missing meanwhile, behind a horizon it did not see.)"""
    with contextmanager(operator_client)(postgres_url) as client:
        create(client)
        sessions = state(client).sessions
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
                    sequences.prune(session, stream.id, NOW)
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
        outcome = add(client, payload, NOW + 1_000, None)
        assert (outcome.status, outcome.reason) == ("rejected", "too_old")
        assert client.get("/api/v1/streams/temps/stats").json()["stored_readings"] == 5


def test_missing_counts_exactly_the_sequences_withheld(client: TestClient) -> None:
    """Sequences 0 to 11 but 3, 6, 7 and 10 sent; 6 comes last (late). Nothing is missing
    while the import window can still bring the rest; once the horizon passes the device's
    newest batch, the withheld ones are: 3, 7 and 10. A copy of one of them is then refused."""
    create(client)
    withheld = {3, 6, 7, 10}
    for sequence in range(12):
        if sequence not in withheld:
            outcome = add(client, batch(sequence, NOW + sequence * MINUTE), NOW, None)
            assert outcome.status == "stored"
    assert counted(client) == (0, 0)
    assert add(client, batch(6, NOW + 6 * MINUTE), NOW, None).status == "stored"
    assert counted(client) == (0, 1)
    housekeep(client, NOW + 60 * MINUTE, 50 * MINUTE)  # horizon NOW + 10 min: before 11
    assert counted(client) == (0, 1)
    housekeep(client, NOW + 62 * MINUTE, 50 * MINUTE)  # horizon NOW + 12 min: past them all
    assert counted(client) == (3, 1)
    outcome = add(client, batch(7, NOW + 7 * MINUTE), NOW + 62 * MINUTE, None)
    assert (outcome.status, outcome.reason) == ("rejected", "too_old")
    housekeep(client, NOW + 70 * MINUTE, 50 * MINUTE)
    assert counted(client) == (3, 1)  # counted once


def test_a_gap_the_head_runs_far_past_is_counted_before_the_horizon(client: TestClient) -> None:
    """The out-of-order window is WINDOW sequences: a gap further below the head than that
    is given up at once (sequences 1 to 44 below 300); the rest when the horizon passes."""
    create(client)
    assert add(client, batch(0, NOW), NOW, None).status == "stored"
    assert add(client, batch(300, NOW + MINUTE), NOW, None).status == "stored"
    assert counted(client) == (300 - sequences.WINDOW, 0)
    housekeep(client, NOW + 62 * MINUTE, 60 * MINUTE)
    assert counted(client) == (299, 0)
