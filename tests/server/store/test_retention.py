"""Retention and deletion on SQLite and PostgreSQL: what must go goes, whole; what must stay
is exactly as it was (averages equal to the last bit, `verify` clean)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.server.helpers import OPERATOR, create, feed, settings
from tools.testbed.appstate import state
from zeal import encode_batch
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.broker.collector import Collector
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings
from zeal_server.store.models import Device, Segment

DAY = 86_400_000
NOW = (store.now_ms() // 60_000) * 60_000
DEVICES = ("a", "b", "c")


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(database_url, ZEAL_OPERATOR_TOKEN=OPERATOR))) as c:
        c.headers["Authorization"] = f"Bearer {OPERATOR}"
        yield c


def ten_days(client: TestClient) -> None:
    """Three devices, one batch of 30 readings a day each for the last ten days (distinct
    values per device), the older half compacted."""
    create(client)
    rng = np.random.default_rng(11)
    for day in range(10):
        for i, device in enumerate(DEVICES):
            readings = rng.uniform(10 * i, 10 * i + 40, size=30)
            feed(client, device, day, readings, NOW - (10 - day) * DAY + 3_600_000, rng=day)
    with state(client).sessions() as db, db.begin():
        stream = store.stream_by_name(db, "temps")
        assert stream is not None
        store.compact(db, stream, before_bucket=(NOW - 5 * DAY) // 60_000)


def average(client: TestClient, **query: Any) -> dict[str, Any]:
    answer = client.get("/api/v1/streams/temps/average", params=query)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def verify(client: TestClient) -> list[str]:
    with state(client).sessions() as db:
        stream = store.stream_by_name(db, "temps")
        assert stream is not None
        return store.verify(db, stream)


def iso(ms: int) -> str:
    return np.datetime_as_string(np.datetime64(ms, "ms"), unit="ms") + "Z"


def test_retention_deletes_whole_old_buckets_and_keeps_the_rest_exact(
    client: TestClient, database_url: str, tmp_path: Any
) -> None:
    """Retention 5 days applied by the collector's housekeeping: the buckets before the
    cutoff are gone (segment rows, dedup rows), the average of the kept window is the same
    to the last bit, verify passes, and an old batch sent again is refused too_old (the
    dedup horizon moved to the cutoff) instead of coming back."""
    ten_days(client)
    kept_window = {"start": iso(NOW - 5 * DAY)}
    before = average(client, **kept_window)
    everything = average(client)
    assert everything["n"] == 900
    assert before["n"] == 5 * 90  # days 5..9
    patched = client.patch("/api/v1/streams/temps", json={"retention_days": 5})
    assert patched.status_code == 200, patched.text
    assert patched.json()["retention_days"] == 5
    assert client.patch("/api/v1/streams/temps", json={"retention_days": 0}).status_code == 422

    server_settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": database_url,
            "ZEAL_DATA_DIR": str(tmp_path),
            "ZEAL_COLLECTOR_ID": "zeal-collector-retention-test",  # no identity file to hold
        }
    )
    collector = Collector(server_settings, state(client).sessions)
    # Its housekeeping, as its writer runs it every 30 s.
    collector.housekeep()

    after = average(client)
    assert after == {**before, "start": None}
    assert average(client, **kept_window) == before
    assert verify(client) == []
    with state(client).sessions() as db:
        oldest = db.scalar(select(func.min(Segment.first_bucket)))
        assert oldest is not None
        assert oldest * 60_000 >= NOW - 5 * DAY
        # every batch was stored: the horizon passed no gap
        assert db.scalar(select(func.sum(Device.missing))) == 0
    # An old batch sent again: refused by the retention, even without the import window.
    params = store.params_of(_stream(client))
    stale = encode_batch(
        params,
        stream="temps",
        device="a",
        sequence=0,
        codes=np.full(3, params.code_min, dtype=np.uint64),
        timestamps=NOW - 9 * DAY + np.arange(3),
    )
    with state(client).sessions() as db, db.begin():
        outcome = Ingest().add(db, "zeal/v1/temps/a/up", stale, NOW)
    assert (outcome.status, outcome.reason) == ("rejected", "too_old")
    assert average(client) == after
    assert (
        client.patch("/api/v1/streams/temps", json={"retention_days": None}).json()[
            "retention_days"
        ]
        is None
    )


def _stream(client: TestClient) -> Any:
    with state(client).sessions() as db:
        return store.stream_by_name(db, "temps")


def test_deleting_a_device_removes_its_readings_and_nothing_else(client: TestClient) -> None:
    """DELETE .../devices/b?confirm=b: b leaves every bucket (compacted segments and fresh
    parts alike), the average equals the one of a and c before (to the last bit, by
    group), verify passes; without the confirmation, or with another name, nothing
    happens (422)."""
    ten_days(client)
    for device in DEVICES:
        tags = client.put(f"/api/v1/streams/temps/devices/{device}/tags", json={"tags": {}})
        assert tags.status_code == 200
    client.put("/api/v1/streams/temps/devices/a/tags", json={"tags": {"keep": "yes"}})
    client.put("/api/v1/streams/temps/devices/c/tags", json={"tags": {"keep": "yes"}})
    kept = average(client, group="keep:yes")
    untouched = average(client)
    for confirm in (None, "a"):
        refused = client.delete(
            "/api/v1/streams/temps/devices/b",
            params={} if confirm is None else {"confirm": confirm},
        )
        assert refused.status_code == 422, refused.text
        assert "confirm=b" in refused.text
    assert average(client) == untouched
    assert client.delete("/api/v1/streams/temps/devices/zz?confirm=zz").status_code == 404

    deleted = client.delete("/api/v1/streams/temps/devices/b", params={"confirm": "b"})
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"stream": "temps", "device": "b", "readings": 300}
    assert average(client) == {**kept, "group": None}
    assert verify(client) == []
    names = [d["name"] for d in client.get("/api/v1/streams/temps/devices").json()["devices"]]
    assert names == ["a", "c"]
    export = client.get("/api/v1/streams/temps/export").text
    assert ",b," not in export
    assert export.count("\n") == 1 + 600


def test_deleting_a_stream_needs_its_name_as_confirmation(client: TestClient) -> None:
    """DELETE /streams/temps without confirm=temps is 422 and deletes nothing."""
    create(client)
    assert client.delete("/api/v1/streams/temps").status_code == 422
    assert client.delete("/api/v1/streams/temps?confirm=other").status_code == 422
    assert client.get("/api/v1/streams/temps").status_code == 200
    assert client.delete("/api/v1/streams/temps?confirm=temps").status_code == 200
