"""What the device-cap tests share: a database of three streams under the default policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.helpers import postgres_database
from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Stream

#: The three streams of one home's sensor.
STREAMS = ("humidity", "occupancy", "temperature")


def one_reading(
    stream: str, device: str, sequence: int, stamp: int, policy: float | None = 8.0
) -> bytes:
    """A batch of one reading stamped `stamp` at epsilon 1 under `policy` (epsilon a day)."""
    params = Zeal(lower=0, upper=100, epsilon=1, max_epsilon_per_day=policy)
    return encode_batch(
        params,
        stream=stream,
        device=device,
        sequence=sequence,
        timestamps=[stamp],
        codes=params.perturb([50.0]),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A session maker over a new database (SQLite, then PostgreSQL) holding STREAMS, each
    under the default stream policy (8 a day at epsilon 1), created at time 0 (readings of
    any past day are after their stream's creation)."""
    if request.param == "sqlite":
        url, database = f"sqlite:///{tmp_path / 'streams.sqlite'}", None
    else:
        database = postgres_database()
        url = next(database)
    engine = make_engine(url)
    migrate(engine)
    maker = session_factory(engine)
    with maker() as session, session.begin():
        for name in STREAMS:
            store.create_stream(session, name=name, lower=0, upper=100, epsilon=1)
        session.execute(Stream.__table__.update().values(created_ms=0))
    yield maker
    engine.dispose()
    if database is not None:
        next(database, None)
