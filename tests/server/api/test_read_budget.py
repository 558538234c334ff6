"""Heavy reads take a slot or get 429 (zeal_server.api.costs), through the real app."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tools.testbed.appstate import state
from zeal_server.api import deps
from zeal_server.api.costs import REFUSED, client_of, heavy_kind
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

TOKEN = "operator-token-0123456789"
READ = "read-token-0123456789abcdef"


@pytest.mark.parametrize(
    ("path", "query", "kind"),
    [
        ("/api/v1/streams", {}, None),
        ("/api/v1/streams/t", {}, None),
        ("/api/v1/streams/t/config", {}, None),
        ("/api/v1/lorawan/bindings", {}, None),
        ("/metrics", {}, None),
        ("/api/v1/streams/t/average", {}, "average"),
        ("/api/v1/streams/t/average", {"estimator": "bayes"}, "average"),
        (
            "/api/v1/streams/t/average",
            {"estimator": "bayes", "model": "binary"},
            "bayes over codes",
        ),
        ("/api/v1/streams/t/average", {"exclude": "implausible"}, "exclusion"),
        ("/api/v1/streams/t/series", {"interval_seconds": "3600"}, "series"),
        ("/api/v1/streams/t/series", {"interval_seconds": "60"}, "fine series"),
        ("/api/v1/streams/t/series", {}, "fine series"),
        ("/api/v1/streams/t/compare", {"group_a": "x:1"}, "compare"),
        ("/api/v1/preview/compare", {}, "compare planner"),
        ("/api/v1/preview/device", {"streams": "a,b"}, "planner"),
        ("/api/v1/preview", {"lower": "0"}, None),
        ("/api/v1/preview", {"devices": "500", "interval_seconds": "3600"}, "planner"),
        ("/api/v1/preview", {"devices": "500"}, "planner"),
        ("/api/v1/streams/t/devices", {"limit": "100"}, "device page"),
        ("/api/v1/streams/t/devices", {"limit": "1000"}, "device page"),
        ("/api/v1/streams/t/export", {}, "export"),
        ("/api/v1/streams/t/stats", {}, "stream figures"),
        ("/api/v1/streams/t/groups", {}, "groups"),
    ],
)
def test_what_counts_as_costly(path: str, query: dict[str, str], kind: str | None) -> None:
    """Every read of a stream's data (its cost grows with the window or the fleet), and a
    planner for a fleet; not the reads of a stream's definition. Before: exports,
    averages, hourly series, stats, groups and pages of up to 100 devices were light."""
    assert heavy_kind(path, query) == kind


def served(tmp_path: Path, **tokens: str) -> Iterator[TestClient]:
    """A server with one slot per heavy kind (ZEAL_HEAVY_READS=1), the operator token and
    `tokens`, and a stream `temps`."""
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'zeal.sqlite'}",
            "ZEAL_MQTT_URL": "off",
            "ZEAL_HEAVY_READS": "1",
            "ZEAL_OPERATOR_TOKEN": TOKEN,
            **tokens,
        }
    )
    with TestClient(create_app(settings)) as c:
        body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
        assert c.post("/api/v1/streams", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        yield c


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from served(tmp_path)


def test_past_the_slots_a_heavy_read_gets_429_and_a_light_one_is_served(
    client: TestClient,
) -> None:
    """With ZEAL_HEAVY_READS=1 and the slot taken by this client: its next heavy read waits
    for it (SLOT_WAIT), then is 429 with Retry-After ("of this client"); another client's
    (a token) too ("at once");
    light reads are served; once the slot is free the heavy read is served, and the
    refusals are counted in /metrics by kind."""
    planner = (
        "/api/v1/preview?lower=0&upper=50&epsilon=1&devices=500&interval=3600&reading_every=60"
    )
    before = REFUSED["planner"]
    reads = state(client).reads
    reads.take("address:testclient", "planner")
    mine = client.get(planner)
    assert (mine.status_code, mine.headers["Retry-After"]) == (429, "2")
    assert "of this client" in mine.json()["detail"]
    other = client.get(planner, headers={"Authorization": f"Bearer {TOKEN}"})
    assert other.status_code == 429
    assert "at once" in other.json()["detail"]
    assert client.get("/api/v1/streams").status_code == 200
    assert client.get("/api/v1/streams/temps").status_code == 200
    reads.give_back("address:testclient")
    assert client.get(planner).status_code == 200
    assert client.get(planner).status_code == 200  # the slot was given back
    assert REFUSED["planner"] - before == 2
    metrics = client.get("/metrics").text
    assert 'zeal_http_heavy_reads_refused_total{kind="planner"}' in metrics


def test_a_heavy_read_waits_for_a_slot_that_frees_meanwhile(client: TestClient) -> None:
    """The slot is given back while a heavy read waits for it (within SLOT_WAIT): that read
    is served, not refused, and nothing is counted as refused."""
    planner = (
        "/api/v1/preview?lower=0&upper=50&epsilon=1&devices=500&interval=3600&reading_every=60"
    )
    before = REFUSED["planner"]
    reads = state(client).reads
    reads.take("address:testclient", "planner")
    freed = threading.Timer(0.3, reads.give_back, args=("address:testclient",))
    freed.start()
    assert client.get(planner).status_code == 200
    freed.join()
    assert REFUSED["planner"] == before


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[TestClient]:
    """A server with a read token (and ZEAL_HEAVY_READS=1)."""
    yield from served(tmp_path, ZEAL_READ_TOKEN=READ)


def test_one_token_spelt_with_other_white_space_is_one_client(guarded: TestClient) -> None:
    """The read token holds the slot: the same token with two spaces after Bearer, or in
    another case of the scheme, is the same client (429 "of this client"); a token that is
    not the server's is refused before any slot is taken (403), and one missing is 401.
    Before: the slot was keyed on the raw header, so one token posed as 8 clients."""
    reads = state(guarded).reads
    plain = client_of(f"Bearer {READ}", "testclient", [READ])
    reads.take(plain, "average")
    try:
        for spelt in (f"Bearer  {READ}", f"bearer {READ}  ", f"BEARER   {READ}"):
            answer = guarded.get("/api/v1/streams/temps/average", headers={"Authorization": spelt})
            assert answer.status_code == 429, spelt
            assert "of this client" in answer.json()["detail"]
        made_up = guarded.get(
            "/api/v1/streams/temps/average", headers={"Authorization": "Bearer not-the-token-1"}
        )
        assert made_up.status_code == 403
        assert guarded.get("/api/v1/streams/temps/average").status_code == 401
        light = guarded.get("/api/v1/streams", headers={"Authorization": f"Bearer {READ}"})
        assert light.status_code == 200
    finally:
        reads.give_back(plain)
    served = guarded.get(
        "/api/v1/streams/temps/average", headers={"Authorization": f"Bearer {READ}"}
    )
    assert served.status_code == 200


def test_a_costly_read_on_sqlite_is_stopped_at_its_time_limit(
    guarded: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the time limit spent at once (SQLite's progress handler called after every
    step), a costly read is interrupted and answered 503 with the reason; the connection
    goes back to the pool without the handler, so the next read is served. Before: SQLite
    had no time limit at all."""
    monkeypatch.setattr(deps, "STATEMENT_SECONDS", 0)
    monkeypatch.setattr(deps, "SQLITE_STEPS", 1)
    auth = {"Authorization": f"Bearer {READ}"}
    stopped = guarded.get("/api/v1/streams/temps/stats", headers=auth)
    assert stopped.status_code == 503
    assert "ran longer than 0 s and was cancelled" in stopped.json()["detail"]
    monkeypatch.undo()
    assert guarded.get("/api/v1/streams/temps/stats", headers=auth).status_code == 200
