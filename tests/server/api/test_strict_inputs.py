"""Unknown names in a request are refused by name, never ignored: a misspelt field or filter
must not answer as if it had not been given."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from tests.server.helpers import T0, create, feed
from zeal.mqtt.streamconfig import read_config
from zeal.protocol import EPSILON_CEILING
from zeal_edge.options import AgentOptions, refusal


def refused_names(response: Any) -> set[str]:
    assert response.status_code == 422, response.text
    return {str(error["loc"][-1]) for error in response.json()["detail"]}


def test_a_stream_body_with_unknown_fields_is_refused_and_nothing_is_created(
    client: TestClient,
) -> None:
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
    response = client.post(
        "/api/v1/streams", json={**body, "max_epsilon_per_dya": 3, "units": "degF", "bucket": 5}
    )
    assert refused_names(response) == {"max_epsilon_per_dya", "units", "bucket"}
    assert client.get("/api/v1/streams/temps").status_code == 404


def test_patch_names_what_cannot_change_and_what_may(client: TestClient) -> None:
    before = create(client)
    response = client.patch("/api/v1/streams/temps", json={"epsilon": 3, "upper": 4})
    assert response.status_code == 422, response.text
    message = response.json()["detail"][0]["msg"]
    assert "epsilon, upper cannot change" in message
    assert "retention_days, max_epsilon_per_day" in message
    assert client.get("/api/v1/streams/temps").json() == before


def test_tags_body_with_unknown_fields_is_refused(client: TestClient) -> None:
    create(client)
    feed(client, "dev0", 0, np.full(3, 50.0), T0)
    response = client.put(
        "/api/v1/streams/temps/devices/dev0/tags", json={"tags": {"site": "a"}, "site": "a"}
    )
    assert refused_names(response) == {"site"}


def test_unknown_query_parameters_are_refused_by_name(client: TestClient) -> None:
    create(client)
    feed(client, "dev0", 0, np.full(3, 50.0), T0)
    response = client.get(
        "/api/v1/streams/temps/export", params={"device": "c-device", "columns": "json"}
    )
    assert refused_names(response) == {"device", "columns"}
    assert "this route takes: end, format, start, times" in response.json()["detail"][0]["msg"]
    assert refused_names(client.get("/api/v1/streams", params={"limit": 3})) == {"limit"}
    # the names a route does take still work, those of its dependencies included
    assert (
        client.get("/api/v1/streams/temps/average", params={"confidence": 0.9}).status_code == 200
    )
    assert (
        client.get(
            "/api/v1/streams/temps/export", params={"start": "2026-01-01T00:00:00Z"}
        ).status_code
        == 200
    )


def test_the_server_creates_no_stream_a_default_agent_refuses(
    client: TestClient, tmp_path: Path
) -> None:
    """One epsilon ceiling (zeal.protocol.EPSILON_CEILING) for the server's streams and the
    agent's default: above it, the create is refused naming epsilon; at it, a default agent
    adopts what the server publishes. Before: epsilon 8 was created, and refused by agents."""
    response = client.post(
        "/api/v1/streams", json={"name": "hot", "lower": 0, "upper": 110, "epsilon": 8}
    )
    assert refused_names(response) == {"epsilon"}
    body = {"name": "edge", "lower": 0, "upper": 110, "epsilon": EPSILON_CEILING}
    assert client.post("/api/v1/streams", json=body).status_code == 201
    config = read_config(client.get("/api/v1/streams/edge/config").json(), stream="edge")
    assert refusal(config, AgentOptions("edge", "dev1", tmp_path)) is None
    assert AgentOptions("edge", "dev1", tmp_path).max_epsilon == EPSILON_CEILING


def test_series_points_lie_on_the_clock(client: TestClient) -> None:
    """An hour's points begin at whole hours UTC (or at start when given), not at the first
    reading. Before: /series?interval=3600 gave a point from 00:26 to 01:26."""
    create(client)
    feed(client, "dev0", 0, np.full(10, 50.0), T0 + 26 * 60_000)  # 00:26 UTC
    feed(client, "dev0", 1, np.full(10, 50.0), T0 + 86 * 60_000)  # 01:26 UTC
    hourly = client.get("/api/v1/streams/temps/series", params={"interval": 3600}).json()
    assert [(p["start"], p["end"], p["n"]) for p in hourly["points"]] == [
        ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", 10),
        ("2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z", 10),
    ]
    from_start = client.get(
        "/api/v1/streams/temps/series",
        params={"interval": 3600, "start": "2025-12-31T23:30:00Z"},
    ).json()
    assert [(p["start"], p["n"]) for p in from_start["points"]] == [
        ("2025-12-31T23:30:00Z", 10),
        ("2026-01-01T00:30:00Z", 10),
    ]


def test_a_device_reads_the_same_in_every_answer(client: TestClient) -> None:
    """The tags PUT answers with the device as /devices lists it. Before: its epsilon_today
    was 0.0 there while /devices said 100.0."""
    create(client)
    now_ms = int(time.time() * 1000) // 86_400_000 * 86_400_000  # today, UTC
    feed(client, "dev0", 0, np.full(10, 50.0), now_ms)
    tagged = client.put("/api/v1/streams/temps/devices/dev0/tags", json={"tags": {"site": "a"}})
    assert tagged.status_code == 200, tagged.text
    (listed,) = client.get("/api/v1/streams/temps/devices").json()["devices"]
    assert tagged.json() == listed
    assert listed["epsilon_today"] == 10.0


def test_a_window_beyond_the_calendar_of_readings_is_echoed_as_asked(client: TestClient) -> None:
    """Before: start=9999-12-31 was answered as start 6429-10-17 (where the window is cut)."""
    create(client)
    far = client.get("/api/v1/streams/temps/average", params={"start": "9999-12-31"}).json()
    assert far["start"] == "9999-12-31T00:00:00Z"
    assert far["n"] == 0
    near = client.get(
        "/api/v1/streams/temps/average", params={"start": "2026-01-01T00:00:30Z"}
    ).json()
    assert near["start"] == "2026-01-01T00:00:00Z"  # its bucket, as before


def test_renamed_query_names_answer_under_the_old_name_with_a_warning(client: TestClient) -> None:
    """docs/api.md's vocabulary: interval is interval_seconds, a/b are group_a/group_b, the
    comparison's unit is independent. The old names answer as the new ones, saying so in
    Deprecation and Warning headers; an old name beside its new one is refused by name."""
    create(client)
    for device, site in (("dev0", "x"), ("dev1", "x"), ("dev2", "y"), ("dev3", "y")):
        feed(client, device, 0, np.full(30, 50.0), T0, rng=hash(device) % 100)
        client.put(f"/api/v1/streams/temps/devices/{device}/tags", json={"tags": {"site": site}})
    series = "/api/v1/streams/temps/series"
    new = client.get(series, params={"interval_seconds": 3600})
    old = client.get(series, params={"interval": 3600})
    assert (new.status_code, old.status_code) == (200, 200)
    assert old.json() == new.json()
    assert "deprecation" not in new.headers
    assert old.headers["deprecation"] == "true"
    assert "'interval' is now 'interval_seconds'" in old.headers["warning"]
    both = client.get(series, params={"interval": 3600, "interval_seconds": 3600})
    assert refused_names(both) == {"interval"}

    compare = "/api/v1/streams/temps/compare"
    asked = {"group_a": "site:x", "group_b": "site:y", "independent": "reading"}
    new = client.get(compare, params=asked)
    old = client.get(compare, params={"a": "site:x", "b": "site:y", "unit": "reading"})
    assert new.status_code == 200, new.text
    assert old.json() == new.json()
    out = new.json()
    assert (out["group_a"], out["group_b"], out["independent"]) == ("site:x", "site:y", "reading")
    assert (out["a"], out["b"], out["unit"]) == ("site:x", "site:y", "reading")  # one release
    warning = old.headers["warning"]
    for said in ("'a' is now 'group_a'", "'b' is now 'group_b'", "'unit' is now 'independent'"):
        assert said in warning

    preview = {"lower": 0, "upper": 110, "epsilon": 1, "devices": 100}
    new = client.get(
        "/api/v1/preview",
        params={**preview, "reading_every_seconds": 600, "interval_seconds": 3600},
    )
    old = client.get("/api/v1/preview", params={**preview, "reading_every": 600, "interval": 3600})
    assert new.status_code == 200, new.text
    assert old.json() == new.json()
    assert new.json()["windows"] is not None


def test_every_error_is_one_json_object_with_detail(client: TestClient) -> None:
    """docs/api.md: every error body is {"detail": ...}: a sentence, or FastAPI's list of
    {loc, msg, type} for a request that fails validation. Unknown routes and streams too."""
    create(client)
    answers = {
        "unknown stream": client.get("/api/v1/streams/nope"),
        "unknown route": client.get("/api/v1/nothing"),
        "unknown file": client.get("/dashboard/nothing.js"),
        "wrong token": client.post(
            "/api/v1/streams", json={}, headers={"Authorization": "Bearer wrong"}
        ),
        "unconfirmed": client.delete("/api/v1/streams/temps"),
        "bad value": client.get("/api/v1/streams/temps/average", params={"confidence": 2}),
        "unknown name": client.get("/api/v1/streams/temps/average", params={"bogus": 1}),
        "too large": client.post("/api/v1/streams", content=b"x" * 2_000_000),
    }
    for what, response in answers.items():
        assert response.status_code >= 400, what
        assert response.headers["content-type"] == "application/json", what
        body = response.json()
        assert list(body) == ["detail"], (what, body)
        detail = body["detail"]
        if isinstance(detail, list):
            assert response.status_code == 422, what
            assert all({"loc", "msg", "type"} <= set(error) for error in detail), what
        else:
            assert isinstance(detail, str), (what, detail)
            assert detail, what
