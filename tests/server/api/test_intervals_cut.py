"""Every interval the API serves is cut to what its estimand can be (zeal.estimate.cut):
with a dozen readings near the lower bound of a stream on [0, 110], the average, the
series, a group's average, the metrics, the distribution's quantiles and share, and a
comparison's difference all give intervals within their range, on SQLite and PostgreSQL,
while the estimate itself stays as unbiased (and uncut) as ever."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import PARAMS, answered, create, feed, operator_client
from zeal_server import store

LOWER, UPPER = PARAMS.lower, PARAMS.upper


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def few_near_the_bottom(client: TestClient) -> tuple[int, list[np.ndarray]]:
    """Three devices in two groups, four readings of 1.0 each, stamped a few minutes ago
    (the metrics look at the last hour): the window's start in ms, and the codes."""
    create(client)
    start = (store.now_ms() - 600_000) // 60_000 * 60_000
    codes = []
    for d, group in enumerate(("a", "a", "b")):
        device = f"m{d}"
        codes.append(feed(client, device, 0, np.full(4, 1.0), start + 1000 * d, rng=40 + d))
        tags = {"tags": {"site": group}}
        assert client.put(f"/api/v1/streams/temps/devices/{device}/tags", json=tags).is_success
    return start, codes


def within(*intervals: list[float], lower: float = LOWER, upper: float = UPPER) -> bool:
    return all(lower <= low <= high <= upper for low, high in intervals)


def test_every_interval_served_lies_in_its_range(client: TestClient) -> None:
    _, codes = few_near_the_bottom(client)
    url = "/api/v1/streams/temps"
    uncut = PARAMS.estimate_mean(np.concatenate(codes))
    # What the cut is for: uncut, this window's intervals reach far below the range.
    z = 1.959963984540054
    assert uncut.mean - z * uncut.std_error < LOWER
    average = answered(client, f"{url}/average")["estimate"]
    assert average["mean"] == uncut.mean  # the estimate is not cut
    assert within(average["ci"], average["guaranteed"]), average
    assert average["ci"][0] == LOWER  # cut, not recomputed: the end below moved to the bound
    assert average["ci"][1] == pytest.approx(uncut.mean + z * uncut.std_error, rel=1e-12)
    points = answered(client, f"{url}/series", interval_seconds=60)["points"]
    assert points
    bands = [p["estimate"][band] for p in points if p["estimate"] for band in ("ci", "guaranteed")]
    assert within(*bands), points
    group = answered(client, f"{url}/average", group="site:a")["estimate"]
    assert within(group["ci"], group["guaranteed"]), group
    metrics = client.get("/metrics").text
    line = r'zeal_stream_average_last_hour_bound\{[^}]*stream="temps"[^}]*\} (\S+)'
    bounds = [float(b) for b in re.findall(line, metrics)]
    assert len(bounds) == 4
    assert all(LOWER <= b <= UPPER for b in bounds), bounds
    shape = answered(client, f"{url}/distribution", quantiles="0.1,0.5,0.9", above=50)
    for item in shape["quantiles"]:
        if item["low"] is not None:
            assert within([item["low"], item["high"]]), item
    if shape["above"]["low"] is not None:
        share = [shape["above"]["low"], shape["above"]["high"]]
        assert within(share, lower=0, upper=1), shape["above"]
    if shape["mean"]["low"] is not None:
        assert within([shape["mean"]["low"], shape["mean"]["high"]]), shape["mean"]
    difference = answered(client, f"{url}/compare", a="site:a", b="site:b", independent="reading")
    assert difference["ci"] is not None
    assert within(difference["ci"], lower=LOWER - UPPER, upper=UPPER - LOWER), difference
