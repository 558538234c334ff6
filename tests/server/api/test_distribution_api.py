"""GET /streams/{name}/distribution and /series?quantile= (SQLite and PostgreSQL): the
answer is zeal.distribution's on the stored codes, its mean agrees with AVG* within its
interval, few devices give estimates without intervals and say why, and bad input is a
422 with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import PARAMS, T0, answered, create, feed, operator_client
from zeal import distribution as dist

URL = "/api/v1/streams/temps/distribution"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def fleet(client: TestClient, devices: int = 24, per: int = 130) -> dict[str, np.ndarray]:
    """`devices` thermometers on [0, 110], each around its own level, one minute each."""
    create(client)
    rng = np.random.default_rng(5)
    codes = {}
    for d in range(devices):
        x = np.clip(rng.normal(rng.uniform(20, 80), 8, per), 0, 110)
        codes[f"t{d}"] = feed(client, f"t{d}", 0, x, T0 + 60_000 * (d % 3), rng=d)
    return codes


def ask(client: TestClient, url: str = URL, **query: Any) -> dict[str, Any]:
    return answered(client, url, **query)


def test_the_answer_is_the_librarys_on_the_stored_codes(client: TestClient) -> None:
    """Histogram, quantiles, share and intervals equal zeal.distribution's for the codes
    fed, device by device."""
    codes = fleet(client)
    body = ask(client, quantiles="0.25,0.5,0.9", above=60, bins=11)
    rows = np.array([dist.code_counts(PARAMS, c) for c in codes.values()])  # in id order
    found = dist.fit(PARAMS, rows.sum(axis=0))
    boot = dist.device_bootstrap(PARAMS, rows, quantiles=(0.25, 0.5, 0.9), thresholds=(60.0,))
    edges, masses = found.histogram(11)
    assert body["n"] == rows.sum()
    assert body["devices"] == len(codes)
    assert body["edges"] == pytest.approx(edges.tolist(), abs=1e-12)
    assert body["probabilities"] == pytest.approx(masses.tolist(), abs=1e-12)
    assert sum(body["probabilities"]) == pytest.approx(1.0)
    for item in body["quantiles"]:
        q = item["q"]
        assert item["value"] == pytest.approx(found.quantile(q), abs=1e-12)
        assert [item["low"], item["high"]] == pytest.approx(list(boot.quantiles[q]), abs=1e-12)
    assert body["above"]["share"] == pytest.approx(found.share_above(60.0), abs=1e-12)
    assert [body["above"]["low"], body["above"]["high"]] == pytest.approx(list(boot.above[60.0]))
    assert body["intervals"] is None
    assert "pooled over devices" in body["estimand"]


def test_its_mean_agrees_with_avg_star_within_its_interval(client: TestClient) -> None:
    """Two answers of one server about one window do not contradict each other."""
    fleet(client)
    mean = ask(client)["mean"]
    avg = ask(client, "/api/v1/streams/temps/average")["estimate"]["mean"]
    assert mean["low"] <= avg <= mean["high"], (mean, avg)


def test_few_devices_or_readings_get_estimates_without_intervals(client: TestClient) -> None:
    """Below the devices or the readings a bootstrap's coverage was measured at, the
    quantiles come without ends and the answer says why; the default bins are each at
    least one code step wide."""
    fleet(client, devices=25, per=100)  # 2,500 readings of 25 devices
    few = ask(client)
    assert (few["devices"], few["n"]) == (25, 2500)
    assert "from 3,000 readings of 20 devices" in few["intervals"]
    assert few["quantiles"][0]["low"] is None
    body = ask(client, device="t0")
    assert body["devices"] == 1
    assert "no intervals" in body["intervals"]
    assert all(item["low"] is None and item["high"] is None for item in body["quantiles"])
    assert [item["q"] for item in body["quantiles"]] == [0.5, 0.9, 0.95]
    width = body["edges"][1] - body["edges"][0]
    assert width >= PARAMS.grid_step
    assert len(body["edges"]) == dist.default_bins(PARAMS) + 1


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ({"bins": 0}, "bins", "greater than or equal"),
        ({"bins": dist.FINE_BINS + 1}, "bins", "less than or equal"),
        ({"quantiles": "0.5,1"}, "quantiles", "lie in (0, 1)"),
        ({"quantiles": "0,0.5"}, "quantiles", "lie in (0, 1)"),
        ({"quantiles": "nan"}, "quantiles", "lie in (0, 1)"),
        ({"quantiles": "half"}, "quantiles", "not a number"),
        ({"above": 500}, "above", "range"),
        ({"start": "2030-01-01T00:00:00Z"}, "start", "no readings"),
    ],
)
def test_bad_input_is_a_422_with_the_reason(
    client: TestClient, query: dict[str, Any], field: str, words: str
) -> None:
    """Bins out of range, levels outside (0, 1), a threshold outside the range, an empty
    window."""
    fleet(client, devices=2, per=10)
    answer = client.get(URL, params=query)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"][-1] == field, detail
    assert words in detail["msg"], detail


def test_series_points_carry_their_quantile(client: TestClient) -> None:
    """quantile=0.5 on /series: each minute's point has its median and interval as
    /distribution gives them for that minute; the minutes with 3,000 readings or more have
    an interval."""
    fleet(client, devices=63, per=150)
    body = ask(client, "/api/v1/streams/temps/series", interval_seconds=60, quantile=0.5)
    assert len(body["points"]) >= 3
    with_interval = 0
    for point in body["points"]:
        alone = ask(client, start=point["start"], end=point["end"], quantiles="0.5")
        mine, theirs = point["quantile"], alone["quantiles"][0]
        assert mine["value"] == pytest.approx(theirs["value"])
        assert (mine["low"] is None) == (theirs["low"] is None) == (alone["n"] < 3000)
        if mine["low"] is not None:
            with_interval += 1
            assert [mine["low"], mine["high"]] == pytest.approx([theirs["low"], theirs["high"]])
    assert with_interval >= 1
    answer = client.get("/api/v1/streams/temps/series", params={"quantile": 1.5})
    assert answer.status_code == 422
