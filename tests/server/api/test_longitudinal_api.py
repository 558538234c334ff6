"""A longitudinal stream on a real server (SQLite and PostgreSQL): created with its grid, in
its signed configuration; homes sending a memoized code every hour are stored whole under
the default policy (8 a day, 1 an hour), since only a code new for its device costs, while a
device that draws a fresh code every hour is refused past 8 a day; the served average and
series are the library's device-level estimates (zeal.longitudinal.clustered_estimate)."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from tests.server.helpers import T0, answered, create
from tools.testbed.appstate import state
from zeal import Zeal, encode_batch
from zeal.longitudinal import Memo, clustered_estimate
from zeal.mqtt.streamconfig import read_config
from zeal_server.ingest import Ingest

HOUR = 3_600_000
HOMES, HOURS = 30, 48


def send(
    client: TestClient, params: Zeal, device: str, sequence: int, stamp: int, codes: list[int]
) -> str:
    payload = encode_batch(
        params,
        stream="homes",
        device=device,
        sequence=sequence,
        codes=np.array(codes, dtype=np.uint64),
        timestamps=stamp + np.arange(len(codes)) * HOUR,
    )
    with state(client).sessions() as session, session.begin():
        outcome = Ingest().add(session, f"zeal/v1/homes/{device}/up", payload, stamp)
    return str(outcome.status if outcome.reason is None else outcome.reason)


def test_memoized_codes_cost_once_and_the_errors_come_from_devices(client: TestClient) -> None:
    body = create(client, name="homes", grid_points=12, max_epsilon_per_day=8, bucket_seconds=3600)
    assert body["grid_points"] == 12
    assert body["readings_per_hour"] == 1
    config = answered(client, "/api/v1/streams/homes/config")
    assert config["grid_points"] == 12
    params = read_config(config, stream="homes").params
    rng = np.random.default_rng(8)
    counts, sums, daily = [], [], [[], []]
    for d in range(HOMES):
        memo = Memo.new(params, rng)
        readings = 50 + 6 * np.sin(np.arange(HOURS) / 4 + d) + rng.normal(0, 1, HOURS) + d % 5
        codes = memo.report(params, readings, rng=rng).codes.tolist()
        for day in range(2):  # a day a batch: 24 readings, a few new codes each
            part = codes[24 * day : 24 * day + 24]
            assert send(client, params, f"home-{d}", day, T0 + day * 24 * HOUR, part) == "stored"
            daily[day].append(int(sum(part)))
        counts.append(HOURS)
        sums.append(int(sum(codes)))
    served = answered(client, "/api/v1/streams/homes/average")
    assert served["n"] == HOMES * HOURS
    local = clustered_estimate(params, counts, sums)
    assert served["estimate"]["mean"] == local.mean
    assert served["estimate"]["std_error"] == local.std_error
    assert served["estimate"]["ci"] == list(local.ci)
    days = answered(client, "/api/v1/streams/homes/series", interval_seconds=86_400)["points"]
    assert [p["n"] for p in days] == [HOMES * 24, HOMES * 24]
    for p, day_sums in zip(days, daily, strict=True):  # each day's, from its devices
        assert (
            p["estimate"]["std_error"]
            == clustered_estimate(params, [24] * HOMES, day_sums).std_error
        )
    # A device drawing a new code every hour: its first 8 hours are stored, then refused.
    code_min = params.code_min
    answers = [
        send(client, params, "greedy", hour, T0 + hour * HOUR, [code_min + hour])
        for hour in range(10)
    ]
    assert answers == ["stored"] * 8 + ["over_budget"] * 2
    # ... while repeating a code it sent costs nothing, whatever the day's count.
    assert send(client, params, "greedy", 10, T0 + 10 * HOUR, [code_min]) == "stored"
    listed = answered(client, "/api/v1/streams/homes/devices", limit=1000)["devices"]
    [greedy] = [d for d in listed if d["name"] == "greedy"]
    assert greedy["readings"] == 9
    assert greedy["epsilon_spent"] == 8.0


def test_a_backlog_sent_at_once_pays_for_each_code_once(client: TestClient) -> None:
    """Twelve batches of one device stored in one transaction (an agent back from an
    outage), every reading the same memoized code: one reading booked, all stored."""
    create(client, name="homes", grid_points=12, max_epsilon_per_day=8, bucket_seconds=3600)
    params = read_config(answered(client, "/api/v1/streams/homes/config"), stream="homes").params
    code = np.full(6, params.code_min + 3, dtype=np.uint64)
    messages = [
        (
            "zeal/v1/homes/back/up",
            encode_batch(
                params,
                stream="homes",
                device="back",
                sequence=s,
                codes=code,
                timestamps=T0 + s * 2 * HOUR + np.arange(6) * 600_000,
            ),
            T0,
        )
        for s in range(12)
    ]
    with state(client).sessions() as session, session.begin():
        outcomes = Ingest().add_many(session, messages)
    assert [o.status for o in outcomes] == ["stored"] * 12
    listed = answered(client, "/api/v1/streams/homes/devices")["devices"]
    assert [(d["readings"], d["epsilon_spent"], d["epsilon_today"]) for d in listed] == [
        (72, 1.0, 0.0)
    ]


def test_the_grid_planner_answers_over_http(client: TestClient) -> None:
    """GET /preview/grid: the bench's grid (0..110 degF, epsilon 1, a span of 45, a budget of
    8) is 18 values 6.47 apart, at most 8 draws; a wrong question gets a clear 422."""
    plan = answered(
        client, "/api/v1/preview/grid", lower=0, upper=110, epsilon=1, span=45, budget=8
    )
    assert plan["grid_points"] == 18
    assert round(plan["step"], 2) == 6.47
    assert plan["most_draws"] == 8
    assert plan["expected_loss"] <= 8
    both = client.get(
        "/api/v1/preview/grid",
        params={"lower": 0, "upper": 110, "epsilon": 1, "span": 45, "budget": 8, "grid_points": 4},
    )
    assert both.status_code == 422
    assert "one of them" in both.text


def test_a_home_repeating_one_extreme_code_is_not_flagged(client: TestClient) -> None:
    """An honest home whose one memoized code is the stream's largest (any code can come
    from any reading) sends it 200 times: as independent readings that would prove it
    dishonest; as the one draw it is, it does not."""
    create(client, name="homes", grid_points=12, max_epsilon_per_day=1e6, bucket_seconds=3600)
    params = read_config(answered(client, "/api/v1/streams/homes/config"), stream="homes").params
    codes = [params.code_max] * 200
    assert send(client, params, "home", 0, T0, codes) == "stored"
    as_readings = params.estimate_mean(np.array(codes, dtype=np.uint64))
    assert as_readings.mean - 6 * as_readings.std_error > params.upper  # far outside
    listed = answered(client, "/api/v1/streams/homes/devices")["devices"]
    assert listed[0]["flags"] == []
    served = answered(client, "/api/v1/streams/homes/average", exclude="implausible")
    assert served["excluded"] == []
    assert served["n"] == 200


def test_bayes_estimates_are_refused_on_a_longitudinal_stream(client: TestClient) -> None:
    create(client, name="homes", grid_points=12, bucket_seconds=3600)
    for route in ("average", "series"):
        answer = client.get(f"/api/v1/streams/homes/{route}", params={"estimator": "bayes"})
        assert answer.status_code == 422
        assert "independent readings" in answer.text
