"""What the device-cap tests share: a database of three streams under the default policy,
and the real server on a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import postgres_database, wait_until
from tests.server.ingest.homes import STREAMS
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Stream


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


@pytest.fixture
def client(database_url: str, broker: Mosquitto) -> Iterator[TestClient]:
    """The real server with its default settings on the broker; readings of yesterday are
    accepted (backfill 3 days), and the three streams under the default policy."""
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": database_url,
            "ZEAL_MQTT_URL": broker.url,
            "ZEAL_BACKFILL_SECONDS": str(3 * 86_400),
        }
    )
    assert settings.device_max_epsilon_per_day == 8.0
    with TestClient(create_app(settings)) as c:
        wait_until(lambda: state(c).collector.broker_connected, what="collector")
        for name in STREAMS:
            body = {"name": name, "lower": 0, "upper": 100, "epsilon": 1}
            created = c.post("/api/v1/streams", json=body)
            assert created.status_code == 201, created.text
            assert created.json()["max_epsilon_per_day"] == 8.0
        yield c
