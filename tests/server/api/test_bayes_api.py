"""estimator=bayes on /average and /series (SQLite and PostgreSQL): the posterior summaries
are zeal.bayes's for the stored codes, AVG* beside them is unchanged, one device can be
asked for, bad priors get a clear 422, and a Bayes query reads what it needs and writes
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from tests.server.helpers import PARAMS, T0, answered, create, feed, operator_client
from tools.testbed.appstate import state
from zeal.bayes import NormalPrior, binary_posterior, constant_posterior, mean_posterior

URL = "/api/v1/streams/temps/average"


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def doors(client: TestClient) -> dict[str, list[np.ndarray]]:
    """Two door sensors (readings 0 = closed or 110 = open: the range's ends), two minutes
    of 12 readings each."""
    create(client)
    rng = np.random.default_rng(3)
    codes: dict[str, list[np.ndarray]] = {}
    for d, share in enumerate((0.2, 0.7)):
        for minute in range(2):
            x = np.where(rng.random(12) < share, 110.0, 0.0)
            seed = 10 * d + minute
            codes.setdefault(f"door{d}", []).append(
                feed(client, f"door{d}", minute, x, T0 + 60_000 * minute, rng=seed)
            )
    return codes


def ask(client: TestClient, url: str = URL, **query: Any) -> dict[str, Any]:
    return answered(client, url, **query)


def test_each_model_is_zeal_bayes_on_the_stored_codes(client: TestClient) -> None:
    codes = doors(client)
    every = np.concatenate([c for cs in codes.values() for c in cs])
    plain = ask(client)
    assert plain["bayes"] is None
    mean = ask(client, estimator="bayes")
    assert mean["estimate"] == plain["estimate"]  # AVG* beside it, unchanged
    expected = mean_posterior(PARAMS, every.size, plain["estimate"]["mean"])
    assert mean["bayes"]["model"] == "mean"
    assert mean["bayes"]["mean"] == pytest.approx(expected.mean, rel=1e-12)
    assert mean["bayes"]["interval"] == pytest.approx(list(expected.interval), rel=1e-12)
    assert mean["bayes"]["prior"] == "uniform over the range"
    binary = ask(client, estimator="bayes", model="binary", prior="beta:2,3")
    expected = binary_posterior(PARAMS, every, prior=(2, 3))
    assert binary["bayes"]["mean"] == pytest.approx(expected.mean, rel=1e-12)
    assert binary["bayes"]["median"] == pytest.approx(expected.median, rel=1e-12)
    assert (binary["bayes"]["prior"], binary["bayes"]["n"]) == ("Beta(2, 3)", every.size)
    assert "lower or upper" in binary["bayes"]["assumes"]
    door = ask(client, estimator="bayes", model="constant", device="door1", prior="normal:60,30")
    one = np.concatenate(codes["door1"])
    expected = constant_posterior(PARAMS, one, prior=NormalPrior(60, 30))
    assert door["n"] == one.size
    assert door["device"] == "door1"
    assert door["bayes"]["mean"] == pytest.approx(expected.mean, rel=1e-12)


def test_series_points_carry_their_own_posteriors(client: TestClient) -> None:
    codes = doors(client)
    body = ask(
        client,
        "/api/v1/streams/temps/series",
        interval=60,
        estimator="bayes",
        model="binary",
        device="door0",
    )
    assert [p["n"] for p in body["points"]] == [12, 12]
    for point, minute in zip(body["points"], codes["door0"], strict=True):
        assert point["bayes"]["mean"] == pytest.approx(
            binary_posterior(PARAMS, minute).mean, rel=1e-12
        )
    plain = ask(client, "/api/v1/streams/temps/series", interval=60)
    assert all(p["bayes"] is None for p in plain["points"])


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ({"prior": "normal:1"}, "2 numbers"),
        ({"prior": "beta:1,1"}, "model mean takes prior=uniform or normal"),
        ({"prior": "normal:50,0"}, "sd > 0"),
        ({"model": "binary", "prior": "beta:0,1"}, "a > 0 and b > 0"),
        ({"model": "median"}, "model: must be"),
        ({"device": "nobody"}, "no device named 'nobody'"),
        ({"device": "door0", "group": "site:x"}, "a group or a device, not both"),
    ],
)
def test_bad_bayes_queries_get_the_reason(
    client: TestClient, query: dict[str, str], fragment: str
) -> None:
    doors(client)
    answer = client.get(URL, params={"estimator": "bayes", **query})
    assert answer.status_code == 422, answer.text
    assert fragment in answer.text


def test_a_bayes_query_reads_what_avg_reads_or_the_codes_and_writes_nothing(
    client: TestClient,
) -> None:
    """The window-mean model issues exactly the statements of the AVG* query; the code
    models add reads of the segments; no model writes."""
    doors(client)
    engine = state(client).engine
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        before = ask(client, "/api/v1/streams/temps/stats")
        runs = {}
        for name, query in (
            ("avg", {}),
            ("mean", {"estimator": "bayes"}),
            ("binary", {"estimator": "bayes", "model": "binary"}),
        ):
            seen.clear()
            ask(client, **query)
            runs[name] = list(seen)
        after = ask(client, "/api/v1/streams/temps/stats")
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert runs["mean"] == runs["avg"]
    assert len(runs["binary"]) > len(runs["avg"])
    assert any("segments" in s for s in runs["binary"])
    for statements in runs.values():
        # A heavy read (the binary and constant models read the codes) sets its statement
        # timeout on PostgreSQL first (zeal_server.api.costs): a setting, not a write.
        reads = [s for s in statements if not s.startswith("SET LOCAL statement_timeout")]
        assert all(s.lstrip("( ").upper().startswith(("SELECT", "WITH")) for s in reads), statements
    assert before == after
