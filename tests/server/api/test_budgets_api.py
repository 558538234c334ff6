"""The device cap's API: the default, caps given to devices and tags, a device's cap and
spend today, bad values refused with the field and nothing changed; and the planner for a
device running several streams (/preview/device)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import OPERATOR, settings
from zeal import Zeal, encode_batch
from zeal.policy import HOUR_MS
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    """A server with the default device cap (the tests' servers lift it, NO_DEVICE_CAP)."""
    default = settings(
        database_url, ZEAL_OPERATOR_TOKEN=OPERATOR, ZEAL_DEVICE_MAX_EPSILON_PER_DAY=""
    )
    assert default.device_max_epsilon_per_day == 8.0
    with TestClient(create_app(default)) as c:
        c.headers["Authorization"] = f"Bearer {OPERATOR}"
        yield c


def make_streams(client: TestClient) -> None:
    for name, epsilon in (("humidity", 1), ("temperature", 0.5)):
        body = {"name": name, "lower": 0, "upper": 100, "epsilon": epsilon}
        assert client.post("/api/v1/streams", json=body).status_code == 201


def test_caps_for_devices_and_tags_are_set_shown_and_removed(client: TestClient) -> None:
    make_streams(client)
    assert client.get("/api/v1/budgets").json() == {
        "default_max_epsilon_per_day": 8.0,
        "devices": [],
        "tags": [],
    }
    assert client.put("/api/v1/streams/humidity/devices/flat-1").status_code == 201
    tags = {"tags": {"site": "north"}}
    assert client.put("/api/v1/streams/humidity/devices/flat-1/tags", json=tags).status_code == 200
    answer = client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_day": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["tags"] == [{"tag": "site:north", "max_epsilon_per_day": 3.0}]
    shown = client.get("/api/v1/budgets/devices/flat-1").json()
    assert shown == {
        "device": "flat-1",
        "max_epsilon_per_day": 3.0,
        "source": "tag",
        "tag": "site:north",
        "spent_today": 0.0,
        "remaining_today": 3.0,
        "streams": ["humidity"],
        "others_spent_today": {},
    }
    own = client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_day": 2.5}).json()
    assert (own["max_epsilon_per_day"], own["source"]) == (2.5, "device")
    assert client.get("/api/v1/budgets").json()["devices"] == [
        {"device": "flat-1", "max_epsilon_per_day": 2.5}
    ]
    back = client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_day": None})
    assert back.json()["source"] == "tag"
    client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_day": None})
    assert client.get("/api/v1/budgets/devices/flat-1").json()["source"] == "default"


def test_bad_caps_are_refused_and_change_nothing(client: TestClient) -> None:
    make_streams(client)
    client.put("/api/v1/budgets/devices/d1", json={"max_epsilon_per_day": 4})
    for value in (0, -1, 1e9, "lots", True):
        answer = client.put("/api/v1/budgets/devices/d1", json={"max_epsilon_per_day": value})
        assert answer.status_code == 422, (value, answer.text)
        assert answer.json()["detail"][0]["loc"][-1] == "max_epsilon_per_day"
    for tag in ("no-colon", ":value"):
        answer = client.put(f"/api/v1/budgets/tags/{tag}", json={"max_epsilon_per_day": 1})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["path", "tag"]
    answer = client.put("/api/v1/budgets/devices/bad name", json={"max_epsilon_per_day": 1})
    assert answer.status_code == 422
    assert client.get("/api/v1/budgets").json()["devices"] == [
        {"device": "d1", "max_epsilon_per_day": 4.0}
    ]
    assert client.get("/api/v1/budgets/devices/nobody").status_code == 404
    assert client.put("/api/v1/budgets/devices/d2", json={}).status_code == 422
    unauthorized = TestClient(client.app)
    denied = unauthorized.put("/api/v1/budgets/devices/d1", json={"max_epsilon_per_day": 9})
    assert denied.status_code == 401


def test_spend_today_counts_every_stream(client: TestClient) -> None:
    """Readings of today in two streams: the device's spend is their epsilon summed."""
    make_streams(client)
    now = store.now_ms()
    start = now - now % 86_400_000
    ingest = Ingest(device_max_epsilon_per_day=8.0)
    with client.app.state.sessions() as session, session.begin():  # type: ignore[attr-defined]
        for stream, epsilon in (("humidity", 1.0), ("temperature", 0.5)):
            params = Zeal(lower=0, upper=100, epsilon=epsilon, max_epsilon_per_day=8.0)
            payload = encode_batch(
                params,
                stream=stream,
                device="home",
                sequence=0,
                timestamps=[start + HOUR_MS * k for k in range(2)],
                codes=params.perturb(np.array([20.0, 30.0])),
            )
            outcome = ingest.add(session, f"zeal/v1/{stream}/home/up", payload, now)
            assert outcome.status == "stored", outcome
    shown = client.get("/api/v1/budgets/devices/home").json()
    assert (shown["spent_today"], shown["remaining_today"]) == (3.0, 5.0)
    assert shown["streams"] == ["humidity", "temperature"]


def test_the_device_planner_answers_per_stream(client: TestClient) -> None:
    make_streams(client)
    query = {
        "streams": "humidity,temperature",
        "devices": 100,
        "reading_every_seconds": 600,
        "interval_seconds": 3600,
    }
    out = client.get("/api/v1/preview/device", params=query).json()
    assert out["device_max_epsilon_per_day"] == 8.0
    got = [
        (s["stream"], s["share_epsilon"], s["readings_per_day"], s["binds"]) for s in out["streams"]
    ]
    assert got == [("humidity", 4.0, 4, "device cap"), ("temperature", 4.0, 8, "device cap")]
    assert out["spent_per_day"] == 8.0
    assert all(s["windows"]["std_error"] > 0 for s in out["streams"])
    loose = client.get("/api/v1/preview/device", params=query | {"device_max_epsilon_per_day": 100})
    assert [s["binds"] for s in loose.json()["streams"]] == ["policy", "policy"]
    for bad, field in (
        ({"streams": "humidity,nowhere"}, "streams"),
        ({"shares": "1"}, "shares"),
        ({"shares": "1,x"}, "shares"),
        ({"shares": "1,-2"}, "shares"),
    ):
        answer = client.get("/api/v1/preview/device", params=query | bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["detail"][0]["loc"][-1] == field


def test_the_stream_preview_plans_it_with_a_devices_other_streams(client: TestClient) -> None:
    """/preview with with_streams: the stream being planned and the device's existing
    streams, under the device cap split evenly (3 streams of 8: 2.666666 each)."""
    make_streams(client)
    query = {
        "lower": 400,
        "upper": 2000,
        "epsilon": 2,
        "max_epsilon_per_day": 8,
        "reading_every_seconds": 600,
        "devices": 100,
        "interval_seconds": 3600,
        "with_streams": "humidity,temperature",
    }
    out = client.get("/api/v1/preview", params=query).json()["device"]
    got = [(s["stream"], s["share_epsilon"], s["readings_per_day"]) for s in out["streams"]]
    assert got == [
        ("(this stream)", 2.666666, 1),
        ("humidity", 2.666666, 2),
        ("temperature", 2.666666, 5),
    ]
    assert (
        client.get("/api/v1/preview", params=query | {"shares": "2,1,1"}).json()["device"][
            "streams"
        ][0]["readings_per_day"]
        == 2
    )
    assert client.get("/api/v1/preview", params={**query, "devices": None}).status_code == 422
    nowhere = client.get("/api/v1/preview", params=query | {"with_streams": "nowhere"})
    assert nowhere.status_code == 422
