"""GET /streams/{name}/export for analysts (SQLite and PostgreSQL): ISO 8601 or epoch times,
each reading's code beside its estimate so that anyone can decode it with the stream's
signed configuration and check the server's numbers, and Parquet that pandas reads back
with the same rows as the CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import T0, create, feed, operator_client
from zeal.mqtt.streamconfig import params_from_config

URL = "/api/v1/streams/temps/export"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def fleet(client: TestClient) -> None:
    create(client, unit="degF")
    for d in range(3):
        feed(client, f"dev{d}", 0, np.linspace(10, 90, 40), T0 + 1234 * d, rng=d)


def test_csv_rows_carry_iso_times_and_codes_that_decode_to_their_estimates(
    client: TestClient,
) -> None:
    fleet(client)
    text = client.get(URL).text
    assert text.startswith("time,device,code,estimate\n")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 120
    config = client.get("/api/v1/streams/temps/config").text
    params = params_from_config(config, stream="temps")
    codes = np.array([int(r["code"]) for r in rows], dtype=np.uint64)
    assert [float(r["estimate"]) for r in rows] == params.decode(codes).tolist()  # exactly
    first = min(rows, key=lambda r: r["time"])
    assert first["time"] == "2026-01-01T00:00:00.000Z"
    when = datetime.fromisoformat(rows[-1]["time"])
    assert when.tzinfo == UTC
    epoch = list(csv.DictReader(io.StringIO(client.get(URL, params={"times": "epoch"}).text)))
    assert [int(r["timestamp_ms"]) for r in epoch] == [
        int(datetime.fromisoformat(r["time"]).timestamp() * 1000) for r in rows
    ]
    assert client.get(URL, params={"times": "local"}).status_code == 422


def test_parquet_reads_back_in_pandas_as_the_csv_rows(client: TestClient) -> None:
    fleet(client)
    answer = client.get(URL, params={"format": "parquet"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/vnd.apache.parquet"
    frame = pd.read_parquet(io.BytesIO(answer.content))
    rows = list(csv.DictReader(io.StringIO(client.get(URL, params={"times": "epoch"}).text)))
    assert list(frame.columns) == ["time", "device", "code", "estimate"]
    assert len(frame) == len(rows) == 120
    assert frame["time"].dt.as_unit("ms").astype("int64").tolist() == [
        int(r["timestamp_ms"]) for r in rows
    ]
    assert frame["device"].astype(str).tolist() == [r["device"] for r in rows]
    assert frame["code"].tolist() == [int(r["code"]) for r in rows]
    assert frame["estimate"].tolist() == [float(r["estimate"]) for r in rows]
    # The file carries the signed configuration that decodes its codes.
    import pyarrow.parquet as pq

    metadata = pq.read_schema(io.BytesIO(answer.content)).metadata
    params = params_from_config(json.dumps(json.loads(metadata[b"zeal.config"])), stream="temps")
    assert params.decode(frame["code"].to_numpy(np.uint64)).tolist() == frame["estimate"].tolist()
    assert b"unbiased but noisy" in metadata[b"zeal.estimates"]


def test_parquet_without_pyarrow_says_how_to_get_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route's answer where the server lacks the extra (store.parquet_problem stubbed:
    the route is what is tested)."""
    from zeal_server import store

    fleet(client)
    monkeypatch.setattr(store, "parquet_problem", lambda: "Parquet needs pyarrow on the server")
    answer = client.get(URL, params={"format": "parquet"})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["msg"] == "format: Parquet needs pyarrow on the server"
