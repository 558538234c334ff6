"""The rejects table stays bounded whatever names a client invents, and that bound never costs
the accounting of what exists: a real stream's reject counts and its devices' over_budget
flags (zeal_server.ingest.rejectkeys), on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.ingest.rejectkeys import MAX_REJECT_ROWS
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Reject

OPERATOR = "operator-token-0123456789"
#: Four readings a UTC hour at epsilon 1.
PARAMS = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=40)


def batch(device: str, sequence: int, readings: int, now: int) -> tuple[str, bytes, int]:
    stamps = now - 1000 * np.arange(readings)[::-1]
    codes = np.random.default_rng(sequence).integers(0, 8, readings)
    payload = encode_batch(
        PARAMS, stream="temps", device=device, sequence=sequence, timestamps=stamps, codes=codes
    )
    return f"zeal/v1/temps/{device}/up", payload, now


@pytest.mark.slow
def test_150000_rejects_under_invented_names_leave_a_real_streams_accounting_right(
    database_url: str,
) -> None:
    """Devices d1 and d2 of stream temps store a batch each; d1 then runs past the policy.
    A client then makes 150,000 rejects under invented stream names (12,000 on PostgreSQL,
    for time) and 12,000 under
    invented device names of temps. Afterwards d2 runs past the policy and d1 sends a
    batch with a wrong fingerprint. /stats counts every reject of temps, /devices flags
    both devices over_budget, and the table holds at most one pool of each kind.
    Before: beyond 10,000 rows everything new counted under `*`, /stats lost the stream's
    rejects and d2's over_budget flag never appeared."""
    # Each invented name costs a stream lookup and an upsert: about 0.2 ms on SQLite, 1 ms
    # on PostgreSQL. PostgreSQL's run stops at 12,000, past the pool's cap of 10,000, which
    # is what the SQL of its recount must get right there.
    invented = 150_000 if database_url.startswith("sqlite") else 12_000
    engine = make_engine(database_url)
    migrate(engine)
    sessions = session_factory(engine)
    now = int(time.time() * 1000) // 3_600_000 * 3_600_000 + 60_000  # room in the hour
    with sessions() as session, session.begin():
        store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=40
        )
    ingest = Ingest()

    def add(messages: list[tuple[str, bytes, int]]) -> list[str]:
        with sessions() as session, session.begin():
            return [o.reason or o.status for o in ingest.add_many(session, messages)]

    assert add([batch("d1", 0, 2, now), batch("d2", 0, 2, now)]) == ["stored", "stored"]
    assert add([batch("d1", 1, 3, now)]) == ["over_budget"]
    for start in range(0, invented, 5_000):
        with sessions() as session, session.begin():
            for i in range(start, min(start + 5_000, invented)):
                ingest.reject(session, f"invented-{i}", "x", "unknown_stream", when=now)
    for start in range(0, 12_000, 4_000):
        with sessions() as session, session.begin():
            for i in range(start, start + 4_000):
                ingest.reject(session, "temps", f"stranger-{i}", "not_enrolled", when=now)
    assert add([batch("d2", 1, 3, now)]) == ["over_budget"]
    foreign = encode_batch(
        Zeal(lower=0, upper=100, epsilon=1),
        stream="temps",
        device="d1",
        sequence=2,
        timestamps=[now],
        codes=[5],
    )
    assert add([("zeal/v1/temps/d1/up", foreign, now)]) == ["fingerprint_mismatch"]

    with sessions() as session:
        rows = session.scalar(select(func.count()).select_from(Reject))
        starred = session.scalar(select(func.sum(Reject.count)).where(Reject.stream == "*"))
    assert rows is not None
    assert rows <= 2 * MAX_REJECT_ROWS + 10
    assert starred == invented - MAX_REJECT_ROWS
    settings = ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off", "ZEAL_OPERATOR_TOKEN": OPERATOR}
    )
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {OPERATOR}"
        stats = client.get("/api/v1/streams/temps/stats?efficiency=false").json()
        devices = client.get("/api/v1/streams/temps/devices").json()["devices"]
    assert stats["rejects"] == {
        "over_budget": 2,
        "not_enrolled": 12_000,
        "fingerprint_mismatch": 1,
    }
    assert {d["name"]: "over_budget" in d["flags"] for d in devices} == {"d1": True, "d2": True}
    engine.dispose()
