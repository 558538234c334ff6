"""Compaction by two collectors at once (PostgreSQL): a bucket's parts are merged once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from sqlalchemy.engine import Engine

from tools.testbed.wait import wait_until
from zeal import encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.db import make_engine, migrate, session_factory


def waiting_on_a_lock(engine: Engine) -> bool:
    """A session of this database waits for a lock (PostgreSQL's pg_stat_activity)."""
    with engine.connect() as conn:
        waiting = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).scalar()
    return bool(waiting)


def test_two_collectors_compacting_one_bucket_at_once_merge_its_parts_once(
    postgres_url: str,
) -> None:
    """Collector A merges a bucket's parts and holds its transaction open until collector B,
    compacting the same bucket meanwhile, waits for A's locks. B then finds the parts A
    merged gone, and merges nothing: every reading is in the segments once (before the parts
    were locked, B merged them a second time, and every reading of the bucket was in its
    segments twice: found by the two-collector test's verify)."""
    engine = make_engine(postgres_url)
    migrate(engine)
    sessions = session_factory(engine)
    now = store.now_ms()
    with sessions() as session, session.begin():
        stream = store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6
        )
        params = store.params_of(stream)
    ingest = Ingest()
    rng = np.random.default_rng(7)
    for sequence in range(6):  # six transactions: six raw parts of one bucket
        payload = encode_batch(
            params,
            stream="temps",
            device=f"d{sequence % 2}",
            sequence=sequence,
            timestamps=now - 600_000 + np.arange(5),
            codes=params.perturb(rng.uniform(0, 110, 5), rng=rng),
        )
        with sessions() as session, session.begin():
            outcome = ingest.add(session, f"zeal/v1/temps/d{sequence % 2}/up", payload, now)
        assert outcome.status == "stored"
    merged: dict[str, Any] = {}

    def collector_b() -> None:
        with sessions() as session, session.begin():
            row = store.stream_by_name(session, "temps")
            assert row is not None
            merged["B"] = store.compact(session, row)

    with sessions() as session, session.begin():
        row = store.stream_by_name(session, "temps")
        assert row is not None
        merged["A"] = store.compact(session, row)
        other = threading.Thread(target=collector_b)
        other.start()
        wait_until(lambda: waiting_on_a_lock(engine), 30, "B waiting for A's lock")
    other.join(30)
    with sessions() as session:
        row = store.stream_by_name(session, "temps")
        assert row is not None
        mismatches = store.verify(session, row)
    engine.dispose()
    assert merged == {"A": 1, "B": 0}
    assert mismatches == []
