"""Data poisoning by one device (Cao, Jia and Gong 2021): a device that sends only the
maximal code among 50 honest ones moves the average by its weight times its distance; its
own readings prove it dishonest, so /devices flags it and exclude=implausible leaves it
out, while no honest device is flagged."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from tests.server.helpers import PARAMS, T0, create, feed
from tools.testbed.appstate import state
from zeal import Zeal, encode_batch
from zeal_server.ingest import Ingest

HONEST, READINGS = 50, 600  # 50 devices, 10 minutes at one reading a second


def rogue(client: TestClient, name: str, code: int, count: int) -> None:
    payload = encode_batch(
        PARAMS,
        stream="temps",
        device=name,
        sequence=0,
        codes=np.full(count, code, dtype=np.uint64),
        timestamps=T0 + 1000 * np.arange(count),
    )
    with state(client).sessions() as session, session.begin():
        outcome = Ingest().add(session, f"zeal/v1/temps/{name}/up", payload, T0)
    assert outcome.status == "stored", outcome


def average(client: TestClient, **query: Any) -> dict[str, Any]:
    result: dict[str, Any] = client.get("/api/v1/streams/temps/average", params=query).json()
    return result


def test_a_device_sending_the_maximal_code_is_flagged_and_left_out(client: TestClient) -> None:
    create(client)
    rng = np.random.default_rng(17)
    truth = []
    for d in range(HONEST):
        readings = np.clip(rng.normal(50 + (d % 10) - 4.5, 8, READINGS), 0, 110)
        truth.append(readings)
        feed(client, f"honest{d:02d}", 0, readings, T0, rng=d)
    honest = average(client)
    rogue(client, "rogue", PARAMS.code_max, READINGS)  # 2 % of the readings, at the top
    poisoned = average(client)
    shift = poisoned["estimate"]["mean"] - honest["estimate"]["mean"]
    weight = READINGS / (HONEST * READINGS + READINGS)
    top = float(PARAMS.decode(np.array([PARAMS.code_max], dtype=np.uint64))[0])
    bound = weight * (top - PARAMS.lower)  # what its weight allows: at most this far
    print(f"honest {honest['estimate']['mean']:.3f}, poisoned {poisoned['estimate']['mean']:.3f}")
    print(f"shift {shift:.3f}; bound weight x (max decoded - lower) = {weight:.4f} x {top:.1f}")
    assert 0 < shift <= bound
    mean_truth = float(np.mean(np.concatenate(truth)))
    lo, hi = poisoned["estimate"]["guaranteed"]
    assert not lo <= mean_truth <= hi  # the guaranteed interval no longer holds the truth

    devices = client.get("/api/v1/streams/temps/devices", params={"limit": 100}).json()
    flags = {d["name"]: d["flags"] for d in devices["devices"]}
    assert flags.pop("rogue") == ["implausible"]
    assert all(f == [] for f in flags.values()), flags  # no honest device flagged

    cleaned = average(client, exclude="implausible")
    assert cleaned["excluded"] == ["rogue"]
    assert cleaned["n"] == HONEST * READINGS
    assert cleaned["estimate"]["mean"] == honest["estimate"]["mean"]  # the same sums, exactly
    lo, hi = cleaned["estimate"]["guaranteed"]
    assert lo <= mean_truth <= hi
    series = client.get(
        "/api/v1/streams/temps/series", params={"interval": 600, "exclude": "implausible"}
    ).json()
    assert series["excluded"] == ["rogue"]
    assert sum(p["n"] for p in series["points"]) == HONEST * READINGS
    # A device at the bottom of the code range is caught the same way; a group query
    # leaves out only its own flagged devices.
    rogue(client, "sunk", PARAMS.code_min, READINGS)
    assert average(client, exclude="implausible")["excluded"] == ["rogue", "sunk"]
    assert average(client, exclude="implausible", device="honest00")["excluded"] == []


def test_honest_devices_with_few_readings_are_not_flagged(client: TestClient) -> None:
    """Readings at both ends of the range (the worst case for an honest device), from 1 to
    300 per device: none is flagged (the test's false-alarm rate is at most 1e-9 each)."""
    create(client)
    for d, count in enumerate([1, 2, 5, 20, 100, 300]):
        for end, value in (("low", 0.0), ("high", 110.0)):
            feed(client, f"{end}{d}", 0, np.full(count, value), T0, rng=d)
    devices = client.get("/api/v1/streams/temps/devices", params={"limit": 100}).json()
    assert all(d["flags"] == [] for d in devices["devices"])
    assert math.isfinite(average(client, exclude="implausible")["estimate"]["mean"])


def test_a_device_sending_as_fast_as_it_can_weighs_at_most_its_hourly_cap(
    client: TestClient,
) -> None:
    """A stream whose policy allows a reading a second (86,400 a day at epsilon 1, so 7,200
    in any UTC hour); 50 honest devices read once a second for an hour. One more device
    sends the maximal code in batches of 100 as fast as it can (20,000 readings stamped in
    that hour): the collector stores 7,200 of them and refuses the rest as over_budget, so
    its weight in the hour, and the shift of the hour's average, are at most what that cap
    allows; the device is flagged."""
    params = Zeal(lower=0, upper=110, epsilon=1, payload_bits=6, max_epsilon_per_day=86_400)
    create(client, max_epsilon_per_day=86_400)
    assert (params.readings_per_day, params.readings_per_hour) == (86_400, 7_200)
    rng = np.random.default_rng(29)
    ingest, stamps = Ingest(), T0 + 1000 * np.arange(3600)

    def send(name: str, sequence: int, codes: np.ndarray, timestamps: np.ndarray) -> str:
        payload = encode_batch(
            params, stream="temps", device=name, sequence=sequence, codes=codes,
            timestamps=timestamps,
        )  # fmt: skip
        with state(client).sessions() as session, session.begin():
            return ingest.add(session, f"zeal/v1/temps/{name}/up", payload, T0).status

    for d in range(HONEST):
        readings = np.clip(rng.normal(50 + (d % 10) - 4.5, 8, 3600), 0, 110)
        assert send(f"honest{d:02d}", 0, params.perturb(readings, rng=rng), stamps) == "stored"
    honest = average(client)
    top = params.code_max
    outcomes = [
        send("rogue", k, np.full(100, top, dtype=np.uint64), T0 + 100 * k + np.arange(100))
        for k in range(200)
    ]
    assert outcomes.count("stored") == 72  # 7,200 readings: the hour's cap
    poisoned = average(client)
    assert poisoned["n"] == HONEST * 3600 + 7200
    shift = poisoned["estimate"]["mean"] - honest["estimate"]["mean"]
    weight = 7200 / (HONEST * 3600 + 7200)
    decoded_top = float(params.decode(np.array([top], dtype=np.uint64))[0])
    bound = weight * (decoded_top - params.lower)
    day_only = 20_000 / (HONEST * 3600 + 20_000)  # a daily cap alone would have let all in
    print(
        f"honest {honest['estimate']['mean']:.3f} (CI {honest['estimate']['ci']}), "
        f"poisoned {poisoned['estimate']['mean']:.3f}: shift {shift:.3f} <= bound {bound:.3f} "
        f"(weight {weight:.4f} x {decoded_top:.1f}); a daily cap alone: weight {day_only:.4f}, "
        f"shift {day_only * (decoded_top - honest['estimate']['mean']):.3f}"
    )
    assert 0 < shift <= bound
    devices = client.get("/api/v1/streams/temps/devices", params={"limit": 100}).json()
    flags = {d["name"]: d["flags"] for d in devices["devices"]}
    assert flags.pop("rogue") == ["implausible", "over_budget"]
    assert all(f == [] for f in flags.values()), flags
    assert average(client, exclude="implausible")["estimate"] == honest["estimate"]
