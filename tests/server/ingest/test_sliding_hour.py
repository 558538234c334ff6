"""A device's weight in any 60 minutes, and what it can do to such a window's average
(docs/privacy.md, "Bounded influence"): a real collector's ingest path, the API's averages
over sliding windows, SQLite and PostgreSQL."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, migrate, session_factory

OPERATOR = "operator-token-0123456789"
HOUR, MINUTE = 3_600_000, 60_000
#: 40 readings a UTC day at epsilon 1, so 4 a UTC hour (ceil(2 * 40 / 24)).
PARAMS = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=40)


def iso(ms: int) -> str:
    return np.datetime64(ms, "ms").astype(str) + "Z"


@pytest.mark.slow
def test_a_device_at_its_cap_moves_any_60_minutes_by_at_most_the_documented_bound(
    database_url: str,
) -> None:
    """Twenty honest devices read 2 to 3 times an hour over hours h0 to h0+3; an attacker
    sends the largest code every minute of those hours, one reading per batch, the last
    minutes of each even hour first and the first minutes of each odd one first, so its
    stored readings crowd around the hour changes. The collector stores 4 of its readings
    per UTC hour (the cap). For every 60-minute window starting on a minute, the attacker
    weighs at most 2 x readings_per_hour readings, and the window's average moves by at most
    w / (n + w) x (v - m): w = 2 x readings_per_hour, n and m the honest readings' count and
    average in the window, v the value of the largest code. Windows straddling an hour
    change reach that weight; aligned hours hold at most readings_per_hour."""
    assert PARAMS.readings_per_hour == 4
    engine = make_engine(database_url)
    migrate(engine)
    sessions = session_factory(engine)
    h0 = 1_767_225_600_000 // HOUR * HOUR + 10 * HOUR  # 2026-01-01T10:00Z
    with sessions() as session, session.begin():
        store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=40
        )
    largest = PARAMS.code_max
    ingest = Ingest()
    rng = np.random.default_rng(35)

    def send(device: str, sequence: int, stamps: list[int], codes: list[int]) -> str:
        payload = encode_batch(
            PARAMS, stream="temps", device=device, sequence=sequence,
            timestamps=stamps, codes=codes,
        )  # fmt: skip
        with sessions() as session, session.begin():
            outcome = ingest.add_many(session, [(f"zeal/v1/temps/{device}/up", payload, h0)])
        return outcome[0].reason or outcome[0].status

    honest = [f"honest-{i:02d}" for i in range(20)]
    for device in honest:
        for sequence, hour in enumerate(range(4)):
            minutes = np.sort(rng.choice(60, size=int(rng.integers(2, 4)), replace=False))
            stamps = [h0 + hour * HOUR + int(m) * MINUTE for m in minutes]
            truth = rng.gamma(4.0, 12.0, size=len(stamps)).clip(0, 110)
            codes = [int(c) for c in PARAMS.perturb(truth, rng=rng)]
            assert send(device, sequence, stamps, codes) == "stored"
    stored: list[int] = []
    sequence = 0
    for hour in range(4):
        minutes = range(59, -1, -1) if hour % 2 == 0 else range(60)
        for minute in minutes:
            stamp = h0 + hour * HOUR + minute * MINUTE
            if send("attacker", sequence, [stamp], [largest]) == "stored":
                stored.append(stamp)
            sequence += 1
    assert len(stored) == 4 * PARAMS.readings_per_hour

    settings = ServerSettings.from_env(
        {"ZEAL_DATABASE_URL": database_url, "ZEAL_MQTT_URL": "off", "ZEAL_OPERATOR_TOKEN": OPERATOR}
    )
    w = 2 * PARAMS.readings_per_hour
    v = float(PARAMS.decode([largest])[0])
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {OPERATOR}"
        for device in honest:
            tagged = client.put(
                f"/api/v1/streams/temps/devices/{device}/tags", json={"tags": {"kind": "honest"}}
            )
            assert tagged.status_code == 200, tagged.text
        heaviest, moves = 0, []
        for start in range(h0, h0 + 3 * HOUR + MINUTE, MINUTE):
            window = f"start={iso(start)}&end={iso(start + HOUR)}"
            everyone = client.get(f"/api/v1/streams/temps/average?{window}").json()
            others = client.get(f"/api/v1/streams/temps/average?{window}&group=kind:honest")
            n, m = others.json()["n"], others.json()["estimate"]["mean"]
            weight = sum(start <= s < start + HOUR for s in stored)
            assert everyone["n"] == n + weight
            assert weight <= w
            if start % HOUR == 0:
                assert weight <= PARAMS.readings_per_hour
            heaviest = max(heaviest, weight)
            move = everyone["estimate"]["mean"] - m
            bound = w / (n + w) * (v - m)
            assert move <= bound * (1 + 1e-9), (iso(start), move, bound)
            moves.append(move / bound)
    assert heaviest == w  # the straddling windows were reached
    assert max(moves) > 0.99  # and there the bound is met with equality
    assert math.isfinite(sum(moves))
    engine.dispose()
