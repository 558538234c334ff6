"""Window-mean reporting on a real server (SQLite and PostgreSQL): 200 devices reading every
minute, each reporting one privatized mean per hour over 100 hours of the bundled Seattle
temperatures. They privatize 1/60 as many values as per-reading mode (so each device spends
1/60 of the privacy loss), and the served hourly averages are unbiased for the mean of the
device hourly means: the mean error over the 100 hours is within 4 of its standard errors,
and so is every hour's."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import PARAMS, T0, create
from tools.testbed.appstate import state
from zeal import encode_batch
from zeal_edge.sources import Reading, WindowMeans
from zeal_server.ingest import Ingest

DEVICES, HOURS, HOUR = 200, 100, 3_600_000


class Minutes:
    """One device's readings, one a minute: the hourly record interpolated, with the
    device's own offset and a wobble within the hour (skewed devices, not i.i.d.)."""

    description = "minute readings"
    skipped = 0

    def __init__(self, hourly: np.ndarray, device: int) -> None:
        self.hourly, self.device = hourly, device

    def __iter__(self) -> Iterator[Reading]:
        offset = 12 * math.sin(self.device) + (self.device % 7)
        for minute in range(HOURS * 60):
            h, f = divmod(minute, 60)
            base = self.hourly[h] + (self.hourly[h + 1] - self.hourly[h]) * f / 60
            wobble = 3 * math.sin(minute / 9 + self.device)
            yield Reading(base + offset + wobble, T0 + minute * 60_000, minute)


@pytest.mark.slow
def test_hourly_window_means_cost_one_sixtieth_and_stay_unbiased(
    client: TestClient, seattle: np.ndarray
) -> None:
    create(client, bucket_seconds=3600)
    rng = np.random.default_rng(2026)
    truths = np.zeros((DEVICES, HOURS))
    readings = 0
    for d in range(DEVICES):
        start = (d * 41) % (seattle.size - HOURS - 1)
        minutes = Minutes(seattle[start : start + HOURS + 1], d)
        readings += HOURS * 60
        means = list(WindowMeans(minutes, 3600, (PARAMS.lower, PARAMS.upper)))
        assert [r.timestamp_ms for r in means] == [T0 + h * HOUR for h in range(HOURS)]
        values = np.array([r.value for r in means])
        raw = np.array([r.value for r in minutes]).reshape(HOURS, 60)
        truths[d] = np.clip(raw, PARAMS.lower, PARAMS.upper).mean(axis=1)  # its hourly means
        assert np.allclose(values, truths[d], rtol=0, atol=1e-9)
        payload = encode_batch(
            PARAMS,
            stream="temps",
            device=f"dev{d:03d}",
            sequence=0,
            codes=PARAMS.perturb(values, rng=rng),
            timestamps=[r.timestamp_ms for r in means],
        )
        topic = f"zeal/v1/temps/dev{d:03d}/up"
        with state(client).sessions() as session, session.begin():
            assert Ingest().add(session, topic, payload, T0).status == "stored"
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert stats["readings"] * 60 == readings == DEVICES * HOURS * 60  # 1/60 of the values
    device = client.get("/api/v1/streams/temps/devices", params={"limit": 1}).json()["devices"][0]
    assert device["epsilon_spent"] == HOURS * PARAMS.epsilon  # per-reading mode: 60 times this

    points = client.get("/api/v1/streams/temps/series", params={"interval": 3600}).json()["points"]
    assert len(points) == HOURS
    served = np.array([p["estimate"]["mean"] for p in points])
    errors = np.array([p["estimate"]["std_error"] for p in points])
    truth = truths.mean(axis=0)
    z = (served - truth) / errors
    overall = float(np.mean(served - truth) / (math.sqrt(float(np.sum(errors**2))) / HOURS))
    print(
        f"{HOURS} hours: mean error {np.mean(served - truth):+.3f} "
        f"(z {overall:+.2f}); hourly |z| at most {np.abs(z).max():.2f}; "
        f"SE per hour {errors.mean():.2f}"
    )
    assert abs(overall) <= 4
    assert np.all(np.abs(z) <= 4)
