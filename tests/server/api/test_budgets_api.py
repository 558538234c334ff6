"""The device cap's API: the default, caps given to devices and tags, a device's cap and
spend today, bad values refused with the field and nothing changed; and the planner for a
device running several streams (/preview/device)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.server.helpers import OPERATOR, settings
from tools.testbed.appstate import state
from zeal import Zeal, encode_batch
from zeal.policy import HOUR_MS
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.store.ledger import prune as prune_ledger
from zeal_server.store.models import PrincipalDay

#: A device's or tag's caps over 30 and 365 days, none set.
NO_LONGER = {"max_epsilon_per_30_days": None, "max_epsilon_per_365_days": None}


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
        "default_max_epsilon_per_30_days": None,
        "default_max_epsilon_per_365_days": None,
        "devices": [],
        "tags": [],
    }
    assert client.put("/api/v1/streams/humidity/devices/flat-1").status_code == 201
    tags = {"tags": {"site": "north"}}
    assert client.put("/api/v1/streams/humidity/devices/flat-1/tags", json=tags).status_code == 200
    answer = client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_day": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["tags"] == [{"tag": "site:north", "max_epsilon_per_day": 3.0, **NO_LONGER}]
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
        "spent_last_7_days": 0.0,
        "spent_last_30_days": 0.0,
        "spent_last_365_days": 0.0,
        "spent_since_first_seen": 0.0,
        "first_seen": None,
        **NO_LONGER,
    }
    own = client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_day": 2.5}).json()
    assert (own["max_epsilon_per_day"], own["source"]) == (2.5, "device")
    assert client.get("/api/v1/budgets").json()["devices"] == [
        {"device": "flat-1", "max_epsilon_per_day": 2.5, **NO_LONGER}
    ]
    back = client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_day": None})
    assert back.json()["source"] == "tag"
    client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_day": None})
    assert client.get("/api/v1/budgets/devices/flat-1").json()["source"] == "default"


def test_bad_caps_are_refused_and_change_nothing(client: TestClient) -> None:
    make_streams(client)
    client.put("/api/v1/budgets/devices/d1", json={"max_epsilon_per_day": 4})
    for field in ("max_epsilon_per_day", "max_epsilon_per_30_days", "max_epsilon_per_365_days"):
        for value in (0, -1, 1e9, "lots", True):
            answer = client.put("/api/v1/budgets/devices/d1", json={field: value})
            assert answer.status_code == 422, (value, answer.text)
            assert answer.json()["detail"][0]["loc"][-1] == field
    for tag in ("no-colon", ":value"):
        answer = client.put(f"/api/v1/budgets/tags/{tag}", json={"max_epsilon_per_day": 1})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["path", "tag"]
    answer = client.put("/api/v1/budgets/devices/bad name", json={"max_epsilon_per_day": 1})
    assert answer.status_code == 422
    assert client.get("/api/v1/budgets").json()["devices"] == [
        {"device": "d1", "max_epsilon_per_day": 4.0, **NO_LONGER}
    ]
    assert client.get("/api/v1/budgets/devices/nobody").status_code == 404
    assert client.put("/api/v1/budgets/devices/d2", json={}).status_code == 422
    unauthorized = TestClient(client.app)
    denied = unauthorized.put("/api/v1/budgets/devices/d1", json={"max_epsilon_per_day": 9})
    assert denied.status_code == 401


def test_caps_over_30_and_365_days_are_set_one_by_one(client: TestClient) -> None:
    """Each horizon is set on its own: a field left out stays as it is, null removes it; a
    tag may cap a longer horizon only; a device's own cap wins over its tag's, horizon by
    horizon."""
    make_streams(client)
    assert client.put("/api/v1/streams/humidity/devices/flat-1").status_code == 201
    tags = {"tags": {"site": "north"}}
    assert client.put("/api/v1/streams/humidity/devices/flat-1/tags", json=tags).status_code == 200
    answer = client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_365_days": 400})
    assert answer.json()["tags"] == [
        {
            "tag": "site:north",
            "max_epsilon_per_day": None,
            "max_epsilon_per_30_days": None,
            "max_epsilon_per_365_days": 400.0,
        }
    ]
    own = client.put(
        "/api/v1/budgets/devices/flat-1",
        json={"max_epsilon_per_30_days": 100, "max_epsilon_per_day": 4},
    ).json()
    assert (own["max_epsilon_per_day"], own["source"]) == (4.0, "device")
    assert (own["max_epsilon_per_30_days"], own["max_epsilon_per_365_days"]) == (100.0, 400.0)
    kept = client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_day": None})
    assert (kept.json()["max_epsilon_per_day"], kept.json()["max_epsilon_per_30_days"]) == (
        8.0,
        100.0,
    )
    client.put("/api/v1/budgets/devices/flat-1", json={"max_epsilon_per_30_days": None})
    client.put("/api/v1/budgets/tags/site:north", json={"max_epsilon_per_365_days": None})
    assert client.get("/api/v1/budgets").json()["tags"] == []
    shown = client.get("/api/v1/budgets/devices/flat-1").json()
    assert (shown["max_epsilon_per_30_days"], shown["max_epsilon_per_365_days"]) == (None, None)


def test_spend_today_counts_every_stream(client: TestClient) -> None:
    """Readings of today in two streams, in hours of their own (the device hour rule): the
    device's spend is their epsilon summed."""
    make_streams(client)
    now = store.now_ms()
    start = now - now % 86_400_000
    ingest = Ingest(device_max_epsilon_per_day=8.0)
    with state(client).sessions() as session, session.begin():
        for i, (stream, epsilon) in enumerate((("humidity", 1.0), ("temperature", 0.5))):
            params = Zeal(lower=0, upper=100, epsilon=epsilon, max_epsilon_per_day=8.0)
            payload = encode_batch(
                params,
                stream=stream,
                device="home",
                sequence=0,
                timestamps=[start + HOUR_MS * (k + 2 * i) for k in range(2)],
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
    assert (out["device_max_epsilon_per_365_days"], out["spent_per_year"]) == (None, 8.0 * 365)
    # A yearly budget of 1,095 is 3 a day: 1.5 a stream, 1 humidity reading and 3 of
    # temperature a day; a device leaves more of its windows without a reading.
    yearly = client.get(
        "/api/v1/preview/device", params=query | {"device_max_epsilon_per_365_days": 1095}
    ).json()
    got = [
        (s["stream"], s["share_epsilon"], s["readings_per_day"], s["binds"])
        for s in yearly["streams"]
    ]
    assert got == [("humidity", 1.5, 1, "yearly cap"), ("temperature", 1.5, 3, "yearly cap")]
    assert (yearly["spent_per_day"], yearly["spent_per_year"]) == (2.5, 912.5)
    for before, after in zip(out["streams"], yearly["streams"], strict=True):
        assert after["windows"]["sent_per_day"] == after["readings_per_day"]
        assert after["windows"]["empty_share"] > before["windows"]["empty_share"]
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


def test_a_devices_account_over_7_30_365_days_and_its_life(client: TestClient) -> None:
    """Readings of one device in two streams on days 0 to 380 back: /budgets/devices/{d}
    gives each horizon's spend equal to the epsilon of the readings each stream's export
    holds in it, and its first day. Days folded into the lifetime total (the ledger's
    prune, as retention runs it) change none of the figures."""
    make_streams(client)
    now = store.now_ms()
    today = now // 86_400_000
    ago = (0, 3, 10, 40, 200, 380)
    ingest = Ingest(device_max_epsilon_per_day=8.0, max_age_ms=400 * 86_400_000)
    epsilons = {"humidity": 1.0, "temperature": 0.5}
    with state(client).sessions() as session, session.begin():
        for stream, epsilon in epsilons.items():
            params = Zeal(lower=0, upper=100, epsilon=epsilon, max_epsilon_per_day=8.0)
            for sequence, back in enumerate(ago):
                start = (today - back) * 86_400_000
                count, first = (2, 0) if stream == "humidity" else (1, 2)  # an hour each
                payload = encode_batch(
                    params,
                    stream=stream,
                    device="home",
                    sequence=sequence,
                    timestamps=[start + HOUR_MS * (first + k) for k in range(count)],
                    codes=params.perturb(np.full(count, 20.0)),
                )
                outcome = ingest.add(session, f"zeal/v1/{stream}/home/up", payload, now)
                assert outcome.status == "stored", (stream, back, outcome)

    def from_exports(days: int | None) -> float:
        """The epsilon of the readings stored in the last `days` UTC days (None: all)."""
        total = 0.0
        for stream, epsilon in epsilons.items():
            url = f"/api/v1/streams/{stream}/export"
            rows = client.get(url, params={"times": "epoch"}).text.splitlines()[1:]
            stamps = [int(r.split(",")[0]) for r in rows]
            total += epsilon * sum(
                1 for t in stamps if days is None or t // 86_400_000 > today - days
            )
        return total

    def account() -> dict[str, object]:
        shown = client.get("/api/v1/budgets/devices/home").json()
        return {k: v for k, v in shown.items() if k.startswith("spent") or k == "first_seen"}

    expected = {
        "spent_today": from_exports(1),
        "spent_last_7_days": from_exports(7),
        "spent_last_30_days": from_exports(30),
        "spent_last_365_days": from_exports(365),
        "spent_since_first_seen": from_exports(None),
        "first_seen": dt.date.fromordinal(
            dt.date(1970, 1, 1).toordinal() + today - 380
        ).isoformat(),
    }
    assert (expected["spent_today"], expected["spent_last_365_days"]) == (2.5, 12.5)
    assert account() == expected
    # The devices list shows the same account and sorts by it; /stats spreads it over the
    # stream's devices (a second device, two humidity readings of 40 days back).
    with state(client).sessions() as session, session.begin():
        params = Zeal(lower=0, upper=100, epsilon=1.0, max_epsilon_per_day=8.0)
        stamps = [(today - 40) * 86_400_000 + HOUR_MS * k for k in range(2)]
        codes = params.perturb(np.full(2, 20.0))
        payload = encode_batch(params, stream="humidity", device="flat", sequence=0,
                               timestamps=stamps, codes=codes)  # fmt: skip
        assert ingest.add(session, "zeal/v1/humidity/flat/up", payload, now).status == "stored"
    by_year = {"sort": "account_last_365_days", "descending": True}
    listed = client.get("/api/v1/streams/humidity/devices", params=by_year).json()
    assert [d["name"] for d in listed["devices"]] == ["home", "flat"]
    home = {f"spent_{k}": v for k, v in listed["devices"][0]["account"].items()}
    assert home == {k: v for k, v in expected.items() if k in home}
    assert listed["devices"][1]["account"] == {
        "last_7_days": 0.0, "last_30_days": 0.0, "last_365_days": 2.0, "since_first_seen": 2.0
    }  # fmt: skip
    ascending = client.get("/api/v1/streams/humidity/devices",
                           params={"sort": "account_last_365_days"}).json()  # fmt: skip
    assert [d["name"] for d in ascending["devices"]] == ["flat", "home"]
    spread = client.get("/api/v1/streams/humidity/stats").json()["device_accounts"]
    both = np.array([expected["spent_last_365_days"], 2.0])
    assert spread["last_365_days"] == {
        "median": float(np.median(both)),
        "p90": float(np.percentile(both, 90)),
        "max": 12.5,
    }
    assert spread["last_7_days"]["max"] == expected["spent_last_7_days"]
    with state(client).sessions() as session, session.begin():
        prune_ledger(session, now + 30 * 86_400_000)  # keeps 400 days behind it: 370 back
        kept = session.scalars(select(PrincipalDay.period)).all()
    assert today - 380 not in kept
    assert today - 200 in kept
    assert account() == expected
