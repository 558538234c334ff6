"""GET /streams/{name}/rejects (SQLite and PostgreSQL): who sent a stream's rejected
messages, devices that never stored a reading among them, and an answer that stays bounded
when clients invent 100,000 names."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import T0, answered, create, feed, operator_client
from tools.testbed.appstate import state
from zeal_server.ingest import Ingest
from zeal_server.ingest.rejectkeys import MAX_REJECT_ROWS

URL = "/api/v1/streams/temps/rejects"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def garbage(client: TestClient, names: list[str], at: int) -> None:
    """One undecodable message under each name, in transactions of 10,000."""
    ingest = Ingest()
    sessions = state(client).sessions
    for first in range(0, len(names), 10_000):
        chunk = [
            (f"zeal/v1/temps/{n}/up", b"\x00garbage", at) for n in names[first : first + 10_000]
        ]
        with sessions() as session, session.begin():
            outcomes = ingest.add_many(session, chunk)
        assert all(o.status == "rejected" for o in outcomes), outcomes[0]


def test_a_sender_that_never_stored_is_named_with_its_reason(client: TestClient) -> None:
    create(client)
    feed(client, "d0", 0, np.full(3, 50.0), T0)
    garbage(client, ["evil-1", "evil-1", "d0"], T0 + 5000)
    out = answered(client, URL)
    reason = next(iter(answered(client, "/api/v1/streams/temps/stats")["rejects"]))
    assert [(s["device"], s["messages"], s["known"]) for s in out["senders"]] == [
        ("evil-1", 2, False),
        ("d0", 1, True),
    ]
    assert out["senders"][0]["reasons"] == {reason: 2}
    assert out["senders"][0]["last"].startswith("2026-01-01T00:00:05")
    assert (out["other_senders"], out["other_messages"]) == (0, 0)
    assert answered(client, URL, limit=1)["other_senders"] == 1
    assert client.get(URL, params={"limit": 0}).status_code == 422
    assert client.get("/api/v1/streams/nothing-here/rejects").status_code == 404


def test_invented_names_keep_the_answer_and_the_table_bounded(client: TestClient) -> None:
    """100,000 names, one garbage message each: 20 named, the rest summed, every message
    counted; the table holds at most its pool of names for the stream (the rest under
    "*")."""
    create(client)
    invented = [f"inv-{i:06d}" for i in range(100_000)]
    garbage(client, invented, T0)
    out = answered(client, URL)
    assert len(out["senders"]) == 20
    assert out["other_senders"] + 20 <= MAX_REJECT_ROWS + 1
    total = sum(answered(client, "/api/v1/streams/temps/stats")["rejects"].values())
    assert total == 100_000
    assert sum(s["messages"] for s in out["senders"]) + out["other_messages"] == total
    assert out["senders"][0]["device"] == "*"  # what the table's bound folded together
    assert out["senders"][0]["messages"] == 100_000 - MAX_REJECT_ROWS
