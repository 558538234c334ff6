"""Heavy reads take a slot or get 429 (zeal_server.api.costs), through the real app."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from zeal_server.api.costs import REFUSED, heavy_kind
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

TOKEN = "operator-token-0123456789"


@pytest.mark.parametrize(
    ("path", "query", "kind"),
    [
        ("/api/v1/streams", {}, None),
        ("/api/v1/streams/t/average", {}, None),
        ("/api/v1/streams/t/average", {"estimator": "bayes"}, None),
        (
            "/api/v1/streams/t/average",
            {"estimator": "bayes", "model": "binary"},
            "bayes over codes",
        ),
        ("/api/v1/streams/t/average", {"exclude": "implausible"}, "exclusion"),
        ("/api/v1/streams/t/series", {"interval_seconds": "3600"}, None),
        ("/api/v1/streams/t/series", {"interval_seconds": "60"}, "fine series"),
        ("/api/v1/streams/t/series", {}, "fine series"),
        ("/api/v1/streams/t/compare", {"group_a": "x:1"}, "compare"),
        ("/api/v1/preview/compare", {}, "compare planner"),
        ("/api/v1/preview", {"lower": "0"}, None),
        ("/api/v1/preview", {"devices": "500", "interval_seconds": "3600"}, "planner"),
        ("/api/v1/streams/t/devices", {"limit": "100"}, None),
        ("/api/v1/streams/t/devices", {"limit": "1000"}, "device page"),
    ],
)
def test_what_counts_as_heavy(path: str, query: dict[str, str], kind: str | None) -> None:
    assert heavy_kind(path, query) == kind


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'zeal.sqlite'}",
            "ZEAL_MQTT_URL": "off",
            "ZEAL_HEAVY_READS": "1",
            "ZEAL_OPERATOR_TOKEN": TOKEN,
        }
    )
    with TestClient(create_app(settings)) as c:
        body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
        assert c.post("/api/v1/streams", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        yield c


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
    reads = client.app.state.reads  # type: ignore[attr-defined]
    reads.take("address:testclient", "planner")
    mine = client.get(planner)
    assert (mine.status_code, mine.headers["Retry-After"]) == (429, "2")
    assert "of this client" in mine.json()["detail"]
    other = client.get(planner, headers={"Authorization": f"Bearer {TOKEN}"})
    assert other.status_code == 429
    assert "at once" in other.json()["detail"]
    assert client.get("/api/v1/streams").status_code == 200
    assert client.get("/api/v1/streams/temps/average").status_code == 200
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
    reads = client.app.state.reads  # type: ignore[attr-defined]
    reads.take("address:testclient", "planner")
    freed = threading.Timer(0.3, reads.give_back, args=("address:testclient",))
    freed.start()
    assert client.get(planner).status_code == 200
    freed.join()
    assert REFUSED["planner"] == before
