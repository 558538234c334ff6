"""The HTTP API and the store on SQLite and PostgreSQL (messages fed straight to the store)."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.server.helpers import (
    OPERATOR,
    PARAMS,
    READER,
    T0,
    create,
    feed,
    settings,
)
from tools.testbed.appstate import state
from zeal import Zeal, encode_batch
from zeal.mqtt.streamconfig import config_document
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import SettingsError
from zeal_server.store import efficiency, retention, sequences
from zeal_server.store.db import make_engine
from zeal_server.store.models import DevicePeriod, Segment
from zeal_server.store.segments import CHUNK, section_sizes


def test_stream_lifecycle(client: TestClient) -> None:
    """Create, read, list and fetch the configuration; parameters never change."""
    out = create(client)
    assert out["payload_bits"] == 6
    assert out["fingerprint"] == PARAMS.fingerprint.hex()
    assert client.get("/api/v1/streams/temps").json() == out
    assert [s["name"] for s in client.get("/api/v1/streams").json()] == ["temps"]
    with state(client).sessions() as session:
        server = store.installation_id(session)
    created = int(datetime.fromisoformat(out["created"]).timestamp() * 1000)
    served = client.get("/api/v1/streams/temps/config").json()
    signature = {k: served.pop(k) for k in ("key", "signature")}  # store.signing
    assert served == config_document(
        "temps", PARAMS, server=server, created_ms=created, unit="", revision=created
    )
    assert len(signature["key"]) == 44
    assert len(signature["signature"]) == 88
    again = client.post(
        "/api/v1/streams", json={"name": "temps", "lower": 0, "upper": 1, "epsilon": 1}
    )
    assert again.status_code == 409
    assert "never change" in again.json()["detail"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "bad/name", "lower": 0, "upper": 1, "epsilon": 1}, "stream name"),
        ({"name": "s", "lower": 5, "upper": 1, "epsilon": 1}, "lower must be below upper"),
        ({"name": "s", "lower": 0, "upper": 1, "epsilon": 0}, "greater than 0"),
        (
            {"name": "s", "lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 40},
            "less than or equal",
        ),
        (
            {"name": "s", "lower": 0, "upper": 1, "epsilon": 1, "bucket_seconds": 0},
            "greater than or equal",
        ),
        ({"name": "s", "lower": 0, "upper": 1e308, "epsilon": 1}, ""),
    ],
)
def test_bad_stream_definitions_are_422(
    client: TestClient, body: dict[str, Any], fragment: str
) -> None:
    """Invalid stream parameters answer 422 with a message, never 500."""
    response = client.post("/api/v1/streams", json=body)
    assert response.status_code == 422, response.text
    assert fragment in response.text


def test_tokens_guard_writes_and_reads(database_url: str) -> None:
    """No token: 401; wrong token: 403; the read token, when set, guards every read route,
    and the operator token opens every read the read token opens (an operator holds one
    token); each refusal names the variable of the token it wants."""
    app = create_app(settings(database_url, ZEAL_OPERATOR_TOKEN=OPERATOR, ZEAL_READ_TOKEN=READER))
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
    with TestClient(app) as c:
        assert c.post("/api/v1/streams", json=body).status_code == 401
        assert (
            c.post(
                "/api/v1/streams", json=body, headers={"Authorization": "Bearer nope"}
            ).status_code
            == 403
        )
        assert (
            c.post(
                "/api/v1/streams", json=body, headers={"Authorization": f"Bearer {READER}"}
            ).status_code
            == 403
        )
        assert (
            c.post(
                "/api/v1/streams", json=body, headers={"Authorization": f"Bearer {OPERATOR}"}
            ).status_code
            == 201
        )
        for path in (
            "/api/v1/streams",
            "/api/v1/streams/temps",
            "/api/v1/streams/temps/average",
            "/api/v1/streams/temps/stats",
            "/metrics",
        ):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"Authorization": "Bearer x"}).status_code == 403, path
            assert c.get(path, headers={"Authorization": f"Bearer {READER}"}).status_code == 200
            assert c.get(path, headers={"Authorization": f"Bearer {OPERATOR}"}).status_code == 200
        heavy = "/api/v1/streams/temps/series"  # the read budget's door asks the same
        assert c.get(heavy, headers={"Authorization": f"Bearer {OPERATOR}"}).status_code == 200
        assert "ZEAL_READ_TOKEN" in c.get(heavy).json()["detail"]
        assert "ZEAL_OPERATOR_TOKEN" in c.post("/api/v1/streams", json=body).json()["detail"]
        denied = c.get("/api/v1/streams", headers={"Authorization": "Bearer x"}).json()
        assert "ZEAL_READ_TOKEN" in denied["detail"]
        said = c.get("/api/v1/server", headers={"Authorization": f"Bearer {OPERATOR}"}).json()
        assert (said["operator_token_required"], said["read_token_required"]) == (True, True)
    with TestClient(create_app(settings(database_url))) as c:  # development: no token
        said = c.get("/api/v1/server").json()
        assert (said["operator_token_required"], said["read_token_required"]) == (False, False)
    with pytest.raises(SettingsError, match="production mode needs ZEAL_OPERATOR_TOKEN"):
        settings(database_url, ZEAL_MODE="production")
    for bad in ("zeal login", "x" * 65, "a/b"):  # a property name, or none
        with pytest.raises(SettingsError, match="ZEAL_MQTT_LOGIN_PROPERTY must be"):
            settings(database_url, ZEAL_MQTT_LOGIN_PROPERTY=bad)
    assert settings(database_url, ZEAL_MQTT_LOGIN_PROPERTY="none").mqtt_login_property is None


def test_averages_equal_the_library_on_the_stored_codes(client: TestClient) -> None:
    """/average, groups, series and compare equal the exact estimates of the stored codes."""
    create(client)
    rng = np.random.default_rng(5)
    codes: dict[str, list[np.ndarray]] = {}
    per_bucket: dict[int, list[np.ndarray]] = {}
    for d, site in enumerate(["aarhus", "aarhus", "oslo", "oslo"]):
        device = f"dev{d}"
        for seq in range(3):
            start = T0 + seq * 60_000
            c = feed(
                client,
                device,
                seq,
                rng.uniform(20 + 10 * d, 40 + 10 * d, 60),
                start,
                rng=d * 10 + seq,
            )
            codes.setdefault(site, []).append(c)
            per_bucket.setdefault(start // 60_000, []).append(c)
        assert (
            client.put(
                f"/api/v1/streams/temps/devices/{device}/tags", json={"tags": {"site": site}}
            ).status_code
            == 200
        )
    everything = np.concatenate([c for cs in codes.values() for c in cs])
    avg = client.get("/api/v1/streams/temps/average").json()
    assert avg["n"] == 720
    assert avg["estimate"]["mean"] == PARAMS.estimate_mean(everything).mean
    assert avg["estimate"]["guaranteed"] == list(PARAMS.estimate_mean(everything).guaranteed)
    oslo = client.get("/api/v1/streams/temps/average", params={"group": "site:oslo"}).json()
    assert oslo["estimate"]["mean"] == PARAMS.estimate_mean(np.concatenate(codes["oslo"])).mean
    series = client.get("/api/v1/streams/temps/series", params={"interval": 60}).json()["points"]
    assert len(series) == 3
    for point in series:
        bucket = (
            int(np.datetime64(point["start"].replace("Z", ""), "ms").astype(np.int64)) // 60_000
        )
        assert (
            point["estimate"]["mean"]
            == PARAMS.estimate_mean(np.concatenate(per_bucket[bucket])).mean
        )
    window = client.get(
        "/api/v1/streams/temps/average",
        params={"start": "2026-01-01T00:01:00Z", "end": "2026-01-01T00:02:00Z"},
    ).json()
    assert window["n"] == 240
    cmp = client.get(
        "/api/v1/streams/temps/compare", params={"a": "site:aarhus", "b": "site:oslo"}
    ).json()
    a, b = (PARAMS.estimate_mean(np.concatenate(codes[s])) for s in ("aarhus", "oslo"))
    assert cmp["difference"] == pytest.approx(a.mean - b.mean)
    assert 0 <= cmp["p_value"] <= 1


def test_devices_stats_export_verify(client: TestClient) -> None:
    """Devices page, stats, CSV export (decoded codes) and verify agree with what was stored."""
    create(client)
    stored = [feed(client, f"dev{d}", 0, np.full(60, 50.0), T0, rng=d) for d in range(5)]
    page = client.get("/api/v1/streams/temps/devices", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5
    assert [d["name"] for d in page["devices"]] == ["dev1", "dev2"]
    assert page["devices"][0]["epsilon_spent"] == 60.0
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert (stats["readings"], stats["messages"], stats["devices"]) == (300, 5, 5)
    exported = client.get("/api/v1/streams/temps/export")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert sorted(float(r["estimate"]) for r in rows) == sorted(
        PARAMS.decode(np.concatenate(stored)).tolist()
    )
    # Estimates outside the range are expected at epsilon 1, and the header says why.
    assert any(not 0 <= float(r["estimate"]) <= 110 for r in rows)
    note = exported.headers["zeal-estimates"]
    assert "unbiased but noisy, so values outside the stream's range [0.0, 110.0] are" in note
    with state(client).sessions() as session, session.begin():
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        assert store.verify(session, stream) == []
        assert store.compact(session, stream) == 1
        assert store.verify(session, stream) == []
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert stats["stored_readings"] == 300
    assert 0 < stats["store_bytes"]["segments"] < stats["store_bytes"]["database"]
    assert sum(stats["database_bytes"].values()) == stats["store_bytes"]["database"]
    assert "zeal_collector_messages_total" in client.get("/metrics").text


@pytest.mark.parametrize(
    ("path", "params", "status", "fragment"),
    [
        ("/api/v1/streams/nope/average", {}, 404, "no stream named 'nope'"),
        (
            "/api/v1/streams/temps/average",
            {"start": "2026-01-02", "end": "2026-01-01"},
            422,
            "must be before",
        ),
        ("/api/v1/streams/temps/average", {"start": "yesterday"}, 422, "datetime"),
        ("/api/v1/streams/temps/average", {"group": "site"}, 422, "key:value"),
        ("/api/v1/streams/temps/average", {"group": "site:mars"}, 422, "matches no device"),
        ("/api/v1/streams/temps/average", {"confidence": 1}, 422, "less than or equal to 0.999999"),
        ("/api/v1/streams/temps/series", {"interval": 90}, 422, "multiple of the stream's bucket"),
        (
            "/api/v1/streams/temps/series",
            {"start": "1970-01-01", "end": "2026-01-01", "interval": 60},
            422,
            "more than",
        ),
        ("/api/v1/streams/temps/devices", {"limit": 0}, 422, "greater than or equal"),
        ("/api/v1/streams/temps/compare", {"a": "x:y"}, 422, "Field required"),
        ("/api/v1/streams/temps/devices", {"sort": "secret"}, 422, "'name'"),
        ("/api/v1/preview", {"lower": 1, "upper": 0, "epsilon": 1}, 422, "lower"),
        ("/api/v1/preview", {"lower": 0, "upper": 1, "epsilon": 0}, 422, "greater than 0"),
        ("/api/v1/preview", {"lower": 0, "upper": 1}, 422, "Field required"),
        ("/api/v1/preview", {"lower": 0, "upper": 1, "epsilon": 1, "n": 0}, 422, "n"),
        (
            "/api/v1/preview",
            {"lower": 0, "upper": 1, "epsilon": 1, "payload_bits": 29},
            422,
            "less than or equal to 28",
        ),
        ("/api/v1/streams/nope/groups", {}, 404, "no stream named 'nope'"),
    ],
)
def test_bad_query_parameters_say_what_is_wrong(
    client: TestClient, path: str, params: dict[str, Any], status: int, fragment: str
) -> None:
    """Wrong parameters get a 4xx that names the problem."""
    create(client)
    feed(client, "dev0", 0, np.full(10, 50.0), T0)
    response = client.get(path, params=params)
    assert response.status_code == status, response.text
    assert fragment in response.text


def test_rejects_are_counted_and_store_nothing(client: TestClient) -> None:
    """A corrupt payload, another device's payload, an unknown stream and stale parameters are
    each rejected, counted by reason, and change nothing stored."""
    create(client)
    feed(client, "dev0", 0, np.full(60, 50.0), T0)
    stale = Zeal(lower=0, upper=100, epsilon=1, payload_bits=6)
    good = encode_batch(
        PARAMS,
        stream="temps",
        device="dev1",
        sequence=0,
        codes=np.full(5, 40),
        timestamps=T0 + np.arange(5),
    )
    bad = {
        "zeal/v1/temps/dev1/up": [
            good[:-2],
            encode_batch(
                stale,
                stream="temps",
                device="dev1",
                sequence=1,
                codes=np.full(5, 40),
                timestamps=T0 + np.arange(5),
            ),
        ],
        "zeal/v1/temps/dev2/up": [good],
        "zeal/v1/nostream/dev1/up": [good],
        "zeal/v1/temps/up": [good],
    }
    ingest = Ingest()
    with state(client).sessions() as session, session.begin():
        for topic, payloads in bad.items():
            for payload in payloads:
                assert ingest.add(session, topic, payload, T0).status == "rejected"
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert stats["rejects"] == {"truncated": 1, "fingerprint_mismatch": 2}
    assert (stats["readings"], stats["messages"], stats["devices"]) == (60, 1, 1)
    feed(client, "dev0", 1, np.full(60, 50.0), T0 + 60_000)
    assert client.get("/api/v1/streams/temps/stats").json()["readings"] == 120


def test_redelivered_batches_change_nothing(client: TestClient) -> None:
    """The same (device, sequence) stored again is a duplicate: counts and sums unchanged."""
    create(client)
    codes = PARAMS.perturb(np.full(60, 50.0), rng=np.random.default_rng(1))
    payload = encode_batch(
        PARAMS,
        stream="temps",
        device="dev0",
        sequence=7,
        codes=codes,
        timestamps=T0 + 1000 * np.arange(60),
    )
    ingest = Ingest()
    with state(client).sessions() as session, session.begin():
        outcomes = [
            ingest.add(session, "zeal/v1/temps/dev0/up", payload, T0).status for _ in range(3)
        ]
    with state(client).sessions() as session, session.begin():
        outcomes.append(ingest.add(session, "zeal/v1/temps/dev0/up", payload, T0).status)
    assert outcomes == ["stored", "duplicate", "duplicate", "duplicate"]
    s = client.get("/api/v1/streams/temps/stats").json()
    assert (s["messages"], s["readings"]) == (1, 60)
    assert (s["duplicates"], s["sequence_resets"]) == (3, 0)
    assert client.get("/api/v1/streams/temps/average").json()["estimate"]["mean"] == (
        PARAMS.estimate_mean(codes).mean
    )


def payload(sequence: int, start_ms: int, rng: int) -> bytes:
    """A batch of dev0 on temps: 10 readings a second apart from `start_ms`."""
    codes = PARAMS.perturb(np.full(10, 50.0), rng=np.random.default_rng(rng))
    stamps = start_ms + 1000 * np.arange(10)
    return encode_batch(
        PARAMS, stream="temps", device="dev0", sequence=sequence, codes=codes, timestamps=stamps
    )


def test_a_reused_sequence_with_other_content_is_stored_as_a_reset(client: TestClient) -> None:
    """A reset outbox sends sequences 0 and 1 again with new readings: stored, not dropped,
    counted as sequence resets; each of those batches redelivered is then a duplicate, and
    a third generation of sequence 0 is stored too."""
    create(client)
    ingest = Ingest()

    first = [payload(s, T0 + 60_000 * s, s) for s in range(3)]
    again = [payload(s, T0 + 600_000 + 60_000 * s, 10 + s) for s in range(2)]
    third = payload(0, T0 + 1_200_000, 99)
    got = []
    with state(client).sessions() as session, session.begin():
        for p in [*first, *again, *again, third]:
            got.append(ingest.add(session, "zeal/v1/temps/dev0/up", p, T0))
    assert [o.status for o in got] == ["stored"] * 5 + ["duplicate"] * 2 + ["stored"]
    assert [o.reset for o in got] == [False] * 3 + [True] * 2 + [False] * 2 + [True]
    assert [o.last_sequence for o in got if o.reset] == [2, 2, 2]
    s = client.get("/api/v1/streams/temps/stats").json()
    assert (s["messages"], s["readings"], s["sequence_resets"], s["duplicates"]) == (6, 60, 3, 2)
    device = client.get("/api/v1/streams/temps/devices").json()["devices"][0]
    assert (device["readings"], device["sequence_resets"], device["duplicates"]) == (60, 3, 2)
    with state(client).sessions() as session:
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        assert store.verify(session, stream) == []


def test_redeliveries_deeper_than_the_recent_digests_are_told_by_the_store(
    client: TestClient,
) -> None:
    """A device keeps the digests of its last RECENT batches only; a batch further back sent
    again is a duplicate by the store's own readings (its timestamps and codes are there),
    in a later transaction and in the same one, and the same sequence with new readings is
    still a reset, stored."""
    create(client)
    ingest = Ingest()

    sent = [payload(s, T0 + 60_000 * s, s) for s in range(3 * sequences.RECENT)]
    topic = "zeal/v1/temps/dev0/up"
    with state(client).sessions() as session, session.begin():
        assert {o.status for o in ingest.add_many(session, [(topic, p, T0) for p in sent])} == {
            "stored"
        }
    before = client.get("/api/v1/streams/temps/average").json()
    with state(client).sessions() as session, session.begin():
        again = ingest.add_many(session, [(topic, p, T0) for p in [*sent, *sent]])
    assert {o.status for o in again} == {"duplicate"}
    assert client.get("/api/v1/streams/temps/average").json() == before
    reset = payload(1, T0 + 3_600_000, 99)
    with state(client).sessions() as session, session.begin():
        outcome = ingest.add(session, topic, reset, T0)
    assert (outcome.status, outcome.reset, outcome.last_sequence) == (
        "stored",
        True,
        3 * sequences.RECENT - 1,
    )
    s = client.get("/api/v1/streams/temps/stats").json()
    assert (s["messages"], s["duplicates"], s["sequence_resets"]) == (
        3 * sequences.RECENT + 1,
        6 * sequences.RECENT,
        1,
    )


def test_deleting_a_stream_removes_it_and_its_data_only(client: TestClient) -> None:
    """DELETE needs the operator token, removes the stream with its readings, devices and
    rejects, answers 404 afterwards, and leaves the other streams as they were."""
    create(client)
    create(client, name="other")
    feed(client, "dev0", 0, np.full(60, 50.0), T0)
    feed(client, "dev0", 0, np.full(60, 40.0), T0, stream="other")
    with state(client).sessions() as session, session.begin():
        Ingest().add(session, "zeal/v1/temps/dev0/up", b"garbage", T0)
    before = client.get("/api/v1/streams/other/average").json()
    anonymous = client.delete(
        "/api/v1/streams/temps?confirm=temps",
        headers={"Authorization": "Bearer wrong-token-0123456789"},
    )
    assert anonymous.status_code == 403
    response = client.delete("/api/v1/streams/temps?confirm=temps")
    assert response.status_code == 200, response.text
    assert response.json() == {"stream": "temps", "device": None, "readings": 60}
    for path in ("", "/config", "/average", "/stats"):
        assert client.get(f"/api/v1/streams/temps{path}").status_code == 404
    assert client.delete("/api/v1/streams/temps?confirm=temps").status_code == 404
    assert [s["name"] for s in client.get("/api/v1/streams").json()] == ["other"]
    assert client.get("/api/v1/streams/other/average").json() == before
    with state(client).sessions() as session:
        assert store.rejects(session, "temps") == {}
        other = store.stream_by_name(session, "other")
        assert other is not None
        assert store.verify(session, other) == []
    assert create(client)["name"] == "temps"  # the name can be used again


def test_a_stream_declares_its_unit(client: TestClient) -> None:
    """The unit is stored, returned and put in the configuration; markup is refused."""
    assert create(client, unit="degF")["unit"] == "degF"
    assert client.get("/api/v1/streams/temps/config").json()["unit"] == "degF"
    for bad in ("<b>", "x" * 33, "a\nb"):
        response = client.post(
            "/api/v1/streams", json={"name": "u", "lower": 0, "upper": 1, "epsilon": 1, "unit": bad}
        )
        assert response.status_code == 422, (bad, response.text)


def test_preview_is_what_creating_the_stream_gives(client: TestClient) -> None:
    """The form's preview: the same derived parameters as the created stream, and the
    worst-case standard error and guaranteed half width for n readings."""
    query = {"lower": -5, "upper": 45, "epsilon": 0.5, "n": 2500}
    preview = client.get("/api/v1/preview", params=query).json()
    created = create(client, name="room", lower=-5, upper=45, epsilon=0.5, payload_bits=None)
    for key in ("payload_bits", "shared_bits", "exponent", "abar", "C", "grid_step"):
        assert preview[key] == created[key], key
    params = Zeal(lower=-5, upper=45, epsilon=0.5)
    assert preview["std_error"] == pytest.approx(math.sqrt(params.variance_bound() / 2500))
    assert preview["realized_epsilon"] <= 0.5
    # The guaranteed interval at n readings is where Theorem 3's bound equals 5 %.
    tail = params.absolute_bound(preview["guaranteed_half_width"], n=2500)
    assert tail == pytest.approx(0.05, rel=1e-9)
    narrow = client.get("/api/v1/preview", params={**query, "payload_bits": 3}).json()
    assert narrow["payload_bits"] == 3
    assert narrow["std_error"] > preview["std_error"]


def test_preview_shows_the_loss_per_day_against_the_policy(client: TestClient) -> None:
    """A device reading every minute at epsilon 1 spends 1,440 a day: over the default
    policy (8 readings a day), within a raised one; a policy below one reading is refused
    with the reason, at the preview as at creation."""
    query = {"lower": 0, "upper": 110, "epsilon": 1, "reading_every": 60}
    default = client.get("/api/v1/preview", params=query).json()
    assert (default["max_epsilon_per_day"], default["readings_per_day"]) == (8.0, 8)
    assert (default["epsilon_per_day"], default["within_policy"]) == (1440.0, False)
    raised = client.get("/api/v1/preview", params={**query, "max_epsilon_per_day": 1440}).json()
    assert (raised["readings_per_day"], raised["within_policy"]) == (1440, True)
    bare = client.get("/api/v1/preview", params={"lower": 0, "upper": 1, "epsilon": 2}).json()
    assert (bare["epsilon_per_day"], bare["within_policy"]) == (None, None)
    # Found by schemathesis: 86,400 / 5e-324 overflowed to infinity and answered 500.
    for tiny in (5e-324, 0.0009):
        fast = client.get("/api/v1/preview", params={**query, "reading_every": tiny})
        assert fast.status_code == 422, fast.text
        assert "reading_every" in fast.text
    fastest = client.get("/api/v1/preview", params={**query, "reading_every": 0.001}).json()
    assert fastest["epsilon_per_day"] == 86_400_000.0
    # Found by schemathesis: a subnormal range made Eq. (9)'s density overflow; 500 before.
    narrow = {"epsilon": 0.5, "lower": -2.2250738585e-313, "upper": 0.0}
    answer = client.get("/api/v1/preview", params=narrow)
    assert answer.status_code == 422, answer.text
    assert "too narrow for float64" in answer.text
    made = client.post("/api/v1/streams", json={"name": "narrow", **narrow})
    assert made.status_code == 422, made.text
    assert "too narrow for float64" in made.text
    low = client.get("/api/v1/preview", params={**query, "max_epsilon_per_day": 0.5})
    assert low.status_code == 422
    assert "allows no reading" in low.text
    body = {"name": "few", "lower": 0, "upper": 1, "epsilon": 1, "max_epsilon_per_day": 0.5}
    refused = client.post("/api/v1/streams", json=body)
    assert refused.status_code == 422
    assert "allows no reading" in refused.text
    created = create(client, name="hourly", max_epsilon_per_day=24)
    assert (created["max_epsilon_per_day"], created["readings_per_day"]) == (24.0, 24)
    patch = client.patch("/api/v1/streams/hourly", json={"max_epsilon_per_day": None})
    assert patch.status_code == 422
    assert "cannot be removed" in patch.text
    assert client.get("/api/v1/streams/hourly").json()["fingerprint"] == created["fingerprint"]


def test_the_privacy_ledger_keeps_the_days_a_batch_can_still_be_charged_to(
    client: TestClient,
) -> None:
    """Housekeeping deletes ledger days and hours before the import window (no batch
    stamped then is accepted any more) and keeps the rest; without an import window it
    keeps all; what a device spent since first seen stays."""
    create(client)
    feed(client, "dev0", 0, np.full(5, 50.0), T0)
    week = 7 * 86_400_000

    def rows(hours: int) -> int:
        count = select(func.count()).where(DevicePeriod.hours == hours)
        return int(session.scalar(count) or 0)

    with state(client).sessions() as session, session.begin():
        streams = store.list_streams(session)
        retention.housekeep(session, streams, T0 + 10**12, max_age_ms=None)
        assert (rows(24), rows(1)) == (1, 1)
        retention.housekeep(session, streams, T0 + week, max_age_ms=week)  # horizon T0
        assert (rows(24), rows(1)) == (1, 1)
        retention.housekeep(session, streams, T0 + week + 3_600_000, max_age_ms=week)
        assert (rows(24), rows(1)) == (1, 0)  # T0's hour is behind it
        retention.housekeep(session, streams, T0 + week + 86_400_000, max_age_ms=week)
        assert (rows(24), rows(1)) == (0, 0)
    device = client.get("/api/v1/streams/temps/devices").json()["devices"][0]
    assert (device["readings"], device["epsilon_spent"]) == (5, 5.0)


def test_devices_sort_groups_and_activity(client: TestClient) -> None:
    """Devices sort by any column both ways; groups list tag pairs; stats say who is active."""
    create(client)
    now = store.now_ms()
    ago = [7_200_000, 3_000_000, 0]  # received 2 h, 50 min and 0 s ago
    for d, count in enumerate([30, 10, 20]):
        feed(client, f"dev{d}", 0, np.full(count, 50.0), now - ago[d], rng=d)
    order = {
        (sort, desc): [
            x["name"]
            for x in client.get(
                "/api/v1/streams/temps/devices", params={"sort": sort, "descending": desc}
            ).json()["devices"]
        ]
        for sort in ("name", "readings", "last_seen")
        for desc in (False, True)
    }
    assert order["name", False] == ["dev0", "dev1", "dev2"]
    assert order["name", True] == ["dev2", "dev1", "dev0"]
    assert order["readings", False] == ["dev1", "dev2", "dev0"]
    assert order["readings", True] == ["dev0", "dev2", "dev1"]
    assert order["last_seen", True] == ["dev2", "dev1", "dev0"]
    for d, site in [(0, "north"), (1, "north"), (2, "south")]:
        client.put(f"/api/v1/streams/temps/devices/dev{d}/tags", json={"tags": {"site": site}})
    groups = client.get("/api/v1/streams/temps/groups").json()
    assert groups == [{"group": "site:north", "devices": 2}, {"group": "site:south", "devices": 1}]
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert stats["active_devices"] == 2  # dev1 and dev2: heard from in the last hour
    assert datetime.fromisoformat(stats["last_seen"]).timestamp() * 1000 == now


def test_efficiency_is_measured_on_the_stored_data(client: TestClient) -> None:
    """Wire bits from the payload bytes received; JSON and the paper's float64 + zstd format
    measured on the stored readings; store bits from the segment columns."""
    create(client)
    assert client.get("/api/v1/streams/temps/stats").json()["efficiency"] is None
    stored = [
        feed(client, f"dev{d}", s, np.full(60, 40.0 + d), T0 + 60_000 * s, rng=10 * d + s)
        for d in range(4)
        for s in range(5)
    ]
    with state(client).sessions() as session, session.begin():
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        store.compact(session, stream)
    stats = client.get("/api/v1/streams/temps/stats").json()
    e = stats["efficiency"]
    n = stats["readings"]
    assert n == e["sample"] == 1200
    assert e["wire_bits"] == pytest.approx(8 * stats["bytes_received"] / n)
    assert e["store_code_bits"] == pytest.approx(8 * code_bytes(client) / n)
    assert e["store_bits"] == pytest.approx(8 * stats["store_bytes"]["segments"] / n)
    assert e["database_bits"] == pytest.approx(stats["store_bits_per_reading"]["database"])
    codes = np.concatenate(stored)
    # The sample is the stored readings in another order: the same multiset of values.
    values = sorted(PARAMS.decode(codes).tolist())
    json_bits = 8 * np.mean([len(json.dumps({"ts": T0, "value": v})) for v in values])
    assert e["json_bits"] == pytest.approx(json_bits, rel=1e-12)  # every ts has 13 digits
    assert e["paper_wire_bits"] == 64 - stats_shared_bits(client)
    assert e["float64_bits"] == 64
    assert 0 < e["paper_store_bits"] < 64
    assert e["compression_ratio_cr"] == pytest.approx(e["paper_store_bits"] / 64)
    assert e["store_vs_paper"] == pytest.approx(e["paper_store_bits"] / e["store_code_bits"])
    assert e["wire_bits"] < e["json_bits"] / 10
    quick = client.get("/api/v1/streams/temps/stats", params={"efficiency": "false"}).json()
    assert quick["efficiency"] is None
    assert quick["readings"] == stats["readings"]


def test_store_figures_are_those_of_compacted_segments_while_others_wait(
    client: TestClient,
) -> None:
    """Nothing compacted: the raw parts' figures and compacted 0. Half compacted: the
    compacted segments' figures, and compacted 0.5."""
    create(client)
    for s in range(4):
        feed(client, "dev0", s, np.full(60, 40.0), T0 + 60_000 * s, rng=s)
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert stats["efficiency"]["compacted"] == 0
    assert stats["efficiency"]["store_code_bits"] == 8  # a byte a code, raw
    with state(client).sessions() as session, session.begin():
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        store.compact(session, stream, before_bucket=T0 // 60_000 + 2)
    e = client.get("/api/v1/streams/temps/stats").json()["efficiency"]
    assert e["compacted"] == 0.5
    assert e["store_code_bits"] == pytest.approx(8 * code_bytes(client) / 120)
    assert e["store_vs_paper"] == pytest.approx(e["paper_store_bits"] / e["store_code_bits"])


def code_bytes(client: TestClient) -> int:
    """The stored bytes of the codes sections of the compacted segment rows."""
    with state(client).sessions() as session:
        rows = session.scalars(select(Segment).where(Segment.encoding == CHUNK))
        return sum(section_sizes(r.data)[-1] for r in rows)


def test_json_bits_equal_json_dumps_for_every_length_of_timestamp() -> None:
    """The vectorized JSON size is the mean length of the real json.dumps texts, for
    timestamps of every digit count and sign and for the values of a 16-bit stream."""
    rng = np.random.default_rng(7)
    zeal = Zeal(lower=-40, upper=125, epsilon=0.5, payload_bits=16)
    values = zeal.decode(rng.integers(zeal.code_min, 1 << 16, 5000))
    edges = np.array([0, 9, 10, 99, 100, 10**12 - 1, 10**12, 10**13, -1, -10, -(10**13)])
    timestamps = np.concatenate([edges, rng.integers(-(10**15), 10**15, 5000 - edges.size)])
    texts = [
        json.dumps({"ts": int(t), "value": float(v)})
        for t, v in zip(timestamps, values, strict=True)
    ]
    assert efficiency.json_bits(timestamps, values) == pytest.approx(
        8 * np.mean([len(t) for t in texts]), rel=1e-12
    )


def test_the_efficiency_sample_is_the_most_recent_readings(client: TestClient) -> None:
    """Only the newest segments are read, newest bucket first: a limit of 90 readings takes
    the last 60-reading batch whole and 30 of the one before."""
    create(client)
    for s in range(6):  # one-minute batches (one bucket each), half an hour apart
        feed(client, "dev0", s, np.full(60, 40.0), T0 + 1_800_000 * s, rng=s)
    with state(client).sessions() as session:
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        sample = efficiency.recent_columns(session, stream, limit=90)
    assert sample is not None
    batch = (sample.timestamps - T0) // 1_800_000
    assert batch.tolist() == [5] * 60 + [4] * 30


def stats_shared_bits(client: TestClient) -> int:
    shared: int = client.get("/api/v1/streams/temps").json()["shared_bits"]
    return shared


@pytest.mark.parametrize(
    "params",
    [
        {"confidence": "0.9999999999999999"},
        {"end": "9999-12-31T23:59:59Z"},
        {"start": "0001-01-01T00:00:00+23:59"},
        {"interval": "553402322211286548480"},
    ],
    ids=["confidence", "end-9999", "start-0001", "interval"],
)
def test_the_inputs_that_gave_500_are_answered(client: TestClient, params: dict[str, str]) -> None:
    """The four inputs that answered 500: a parameter out of range (or one the route does
    not take) is 422 naming it; a window at the ends of the calendar is cut to the dates
    readings can have (200)."""
    create(client)
    feed(client, "dev0", 0, np.full(10, 50.0), T0)
    for path in ("average", "series"):
        response = client.get(f"/api/v1/streams/temps/{path}", params=params)
        # /average takes no interval: an unknown name is refused too
        expected = 422 if "confidence" in params or "interval" in params else 200
        assert response.status_code == expected, (path, response.text)
        if expected == 422:
            assert next(iter(params)) in response.text
    both = client.get(
        "/api/v1/streams/temps/average",
        params={"start": "0001-01-01T00:00:00+23:59", "end": "9999-12-31T23:59:59Z"},
    )
    assert both.status_code == 200
    assert both.json()["n"] == 10


def test_healthz_says_only_up_or_down_without_a_token(database_url: str) -> None:
    """With tokens set, /healthz without one (or with a wrong one) is {"status": "up"};
    with the read or operator token it has the details. Without tokens (development), the
    details are open like everything else. No SQL ever appears in it."""
    app = create_app(settings(database_url, ZEAL_OPERATOR_TOKEN=OPERATOR, ZEAL_READ_TOKEN=READER))
    with TestClient(app) as c:
        assert c.get("/healthz").json() == {"status": "up"}
        assert c.get("/healthz", headers={"Authorization": "Bearer wrong"}).json() == {
            "status": "up"
        }
        for token in (READER, OPERATOR):
            body = c.get("/healthz", headers={"Authorization": f"Bearer {token}"}).json()
            assert body == {"status": "up", "database": "ok", "broker": "off"}
    with TestClient(create_app(settings(database_url))) as c:
        assert c.get("/healthz").json() == {"status": "up", "database": "ok", "broker": "off"}


def test_liveness_and_readiness_are_separate_and_quiet_without_a_token(
    database_url: str, tmp_path: Path
) -> None:
    """/livez answers while the database is gone; /readyz says not ready (503) then, and
    without a token neither says more than its status."""
    url = database_url
    if url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'gone' / 'zeal.sqlite'}"
    app = create_app(settings(url, ZEAL_OPERATOR_TOKEN=OPERATOR, ZEAL_READ_TOKEN=READER))
    with TestClient(app) as c:
        assert c.get("/livez").json() == {"status": "live"}
        assert c.get("/readyz").json() == {"status": "ready"}
        details = c.get("/readyz", headers={"Authorization": f"Bearer {READER}"}).json()
        assert details == {"status": "ready", "database": "ok", "broker": "off"}
        app.state.engine.dispose()
        if url.startswith("sqlite"):
            shutil.rmtree(tmp_path / "gone")
            (tmp_path / "gone").write_text("not a directory")  # the file cannot come back
        else:
            app.state.engine = make_engine(url.replace("127.0.0.1:5432", "127.0.0.1:9"))
        assert c.get("/livez").status_code == 200
        answer = c.get("/readyz")
        assert (answer.status_code, answer.json()) == (503, {"status": "not ready"})
        detailed = c.get("/readyz", headers={"Authorization": f"Bearer {OPERATOR}"}).json()
        assert detailed["database"].startswith("down: ")
        assert "SELECT" not in json.dumps(detailed)


def test_openapi_declares_bearer_schemes_and_every_write_requires_one(client: TestClient) -> None:
    """The OpenAPI document lists the operator and read schemes (HTTP bearer, so /docs
    offers Authorize); every POST, PUT, PATCH and DELETE requires the operator one, every
    /api/v1 read the read one."""
    document = client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["OperatorToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["OperatorToken"]["description"],
    }
    assert schemes["ReadToken"]["scheme"] == "bearer"
    writes = reads = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method in ("post", "put", "patch", "delete"):
                writes += 1
                assert operation.get("security") == [{"OperatorToken": []}], (method, path)
            elif path.startswith("/api/v1/devices"):
                assert operation.get("security") == [{"OperatorToken": []}], (method, path)
            elif path.startswith("/api/v1") or path == "/metrics":
                reads += 1
                assert operation.get("security") == [{"ReadToken": []}], (method, path)
    assert writes >= 6
    assert reads >= 10


def test_tokens_never_reach_the_log(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Right, wrong and missing tokens on reads and writes: no token appears in any log
    record of the application or the HTTP client (uvicorn's access log prints no header)."""
    caplog.set_level(logging.DEBUG)
    app = create_app(settings(database_url, ZEAL_OPERATOR_TOKEN=OPERATOR, ZEAL_READ_TOKEN=READER))
    wrong = "wrong-token-that-must-not-be-logged"
    with TestClient(app) as c:
        for token in (OPERATOR, READER, wrong):
            headers = {"Authorization": f"Bearer {token}"}
            c.post("/api/v1/streams", json={"name": "x"}, headers=headers)
            c.get("/api/v1/streams", headers=headers)
            c.get("/metrics", headers=headers)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records
    for token in (OPERATOR, READER, wrong):
        assert token not in text


def test_db_errors_are_told_without_their_sql() -> None:
    """What the collector shows as its last error names the driver's error, not the
    statement or its parameters."""
    from sqlalchemy.exc import OperationalError

    from zeal_server.store.db import error_text as db_error_text

    exc = OperationalError(
        "INSERT INTO batches VALUES (?, ?)", (12, b"secret"), Exception("disk full")
    )
    assert db_error_text(exc) == "Exception: disk full"


def test_tags_are_capped_and_groups_are_queried_by_join(client: TestClient) -> None:
    """33 tags, a 65-character key or a 201-character value: 422. Groups and grouped
    averages follow tag changes (the device_tags rows), and a group of no device is 422."""
    create(client)
    feed(client, "dev0", 0, np.full(10, 20.0), T0)
    feed(client, "dev1", 0, np.full(10, 80.0), T0, rng=1)
    path = "/api/v1/streams/temps/devices/dev0/tags"
    for tags in (
        {f"k{i}": "v" for i in range(33)},
        {"k" * 65: "v"},
        {"k": "v" * 201},
        {"a:b": "v"},
    ):
        response = client.put(path, json={"tags": tags})
        assert response.status_code == 422, response.text
    assert client.put(path, json={"tags": {f"k{i}": "v" for i in range(32)}}).status_code == 200
    assert client.put(path, json={"tags": {"site": "north"}}).status_code == 200
    client.put("/api/v1/streams/temps/devices/dev1/tags", json={"tags": {"site": "south"}})
    groups = client.get("/api/v1/streams/temps/groups").json()
    assert groups == [{"group": "site:north", "devices": 1}, {"group": "site:south", "devices": 1}]
    north = client.get("/api/v1/streams/temps/average", params={"group": "site:north"}).json()
    assert north["n"] == 10
    compare = client.get(
        "/api/v1/streams/temps/compare", params={"a": "site:north", "b": "site:south"}
    ).json()
    assert (compare["n_a"], compare["n_b"]) == (10, 10)
    client.put(path, json={"tags": {"site": "south"}})
    assert client.get("/api/v1/streams/temps/groups").json() == [
        {"group": "site:south", "devices": 2}
    ]
    missing = client.get("/api/v1/streams/temps/average", params={"group": "site:north"})
    assert missing.status_code == 422
    assert "matches no device" in missing.text


def test_a_stream_for_enrolled_devices_only_refuses_the_others(client: TestClient) -> None:
    """A device may publish to any stream under its own name (the broker's ACL fixes only
    the device level). A stream created with enrolled_only stores batches only of devices
    enrolled through the API (operator token): the others are rejected `not_enrolled`."""
    stream = create(client, enrolled_only=True)
    assert stream["enrolled_only"] is True
    enrolled = client.put("/api/v1/streams/temps/devices/dev0")
    assert enrolled.status_code == 201
    assert enrolled.json()["readings"] == 0
    assert client.put("/api/v1/streams/temps/devices/dev0").status_code == 200
    assert client.put("/api/v1/streams/temps/devices/bad%20name").status_code == 422
    anonymous = client.put(
        "/api/v1/streams/temps/devices/dev9", headers={"Authorization": "Bearer wrong"}
    )
    assert anonymous.status_code == 403
    ingest = Ingest()
    outcomes = []
    for device in ("dev0", "dev1"):
        payload = encode_batch(
            PARAMS,
            stream="temps",
            device=device,
            sequence=0,
            codes=np.full(5, 40),
            timestamps=T0 + 1000 * np.arange(5),
        )
        with state(client).sessions() as session, session.begin():
            outcomes.append(ingest.add(session, f"zeal/v1/temps/{device}/up", payload, T0))
    assert [(o.status, o.reason) for o in outcomes] == [
        ("stored", None),
        ("rejected", "not_enrolled"),
    ]
    stats = client.get("/api/v1/streams/temps/stats").json()
    assert (stats["readings"], stats["rejects"]) == (5, {"not_enrolled": 1})
    names = [d["name"] for d in client.get("/api/v1/streams/temps/devices").json()["devices"]]
    assert names == ["dev0"]


def test_preview_plans_a_fleets_hourly_windows_and_says_which_cap_binds(
    client: TestClient,
) -> None:
    """The new user's question: 500 sensors on -20..50 reading every minute at the default
    policy, hourly averages. /preview says both caps skip readings, 16 of 24 hours stay
    empty, each covered hour's average has a standard error of sqrt(noise / 500), and a
    smaller epsilon per reading serves the hours better; without the fleet's three figures
    together it says which one is missing."""
    query = {"lower": -20, "upper": 50, "epsilon": 1, "reading_every": 60}
    plain = client.get("/api/v1/preview", params=query).json()
    assert (plain["within_policy"], plain["binding"], plain["windows"]) == (False, "both", None)
    answer = client.get(
        "/api/v1/preview", params={**query, "devices": 500, "interval": 3600}
    ).json()
    windows, best = answer["windows"], answer["best"]
    assert windows["binding"] == "both"
    assert (windows["readings_per_day"], windows["readings_per_hour"]) == (8, 1)
    assert windows["fleet_empty_share"] == pytest.approx(16 / 24)
    assert windows["readings_per_window"] == [0.0, pytest.approx(1 / 3), 1.0]
    noise = PARAMS_M20_50.variance(15.0)
    assert windows["std_error"] == pytest.approx(math.sqrt(noise / 500), rel=1e-12)
    assert windows["guaranteed_half_width"] > windows["std_error"]
    assert windows["even_reading_every"] == 10_800
    assert best["epsilon"] < 1
    assert best["risk"] < windows["risk"]
    assert best["fleet_empty_share"] < windows["fleet_empty_share"]
    missing = client.get("/api/v1/preview", params={**query, "devices": 500})
    assert missing.status_code == 422
    assert "interval" in missing.text
    outside = client.get(
        "/api/v1/preview", params={**query, "devices": 5, "interval": 60, "mean": 1e308}
    )
    assert outside.status_code == 422, outside.text
    assert "mean must be a reading in the range" in outside.text
    off_clock = client.get("/api/v1/preview", params={**query, "devices": 5, "interval": 7})
    assert off_clock.status_code == 422
    assert "divide a day" in off_clock.text


PARAMS_M20_50 = Zeal(lower=-20.0, upper=50.0, epsilon=1.0, max_epsilon_per_day=8.0)
