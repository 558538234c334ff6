"""Generated requests against the OpenAPI schema: no 500, no response outside the schema."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tools.testbed.server import stream_body
from zeal import Zeal, encode_batch
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings

TOKEN = "operator-token-0123456789"


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running app with one stream of data, and its schema."""
    path: Path = tmp_path_factory.mktemp("schemathesis")
    app = create_app(
        ServerSettings.from_env(
            {
                "ZEAL_DATABASE_URL": f"sqlite:///{path / 'zeal.sqlite'}",
                "ZEAL_MQTT_URL": "off",
                "ZEAL_OPERATOR_TOKEN": TOKEN,
            }
        )
    )
    with TestClient(app) as client:
        client.post(
            "/api/v1/streams",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json=stream_body(),
        )
        params = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6)
        ingest = Ingest()
        with app.state.sessions() as session, session.begin():
            for d in range(3):
                payload = encode_batch(
                    params,
                    stream="temps",
                    device=f"dev{d}",
                    sequence=0,
                    codes=params.perturb(np.full(60, 50.0)),
                    timestamps=1767225600000 + 1000 * np.arange(60),
                )
                ingest.add(session, f"zeal/v1/temps/dev{d}/up", payload, 1767225600000)
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


# Examples per operation; ZEAL_FUZZ_EXAMPLES=400 for a longer hunt than make test's.
EXAMPLES = int(os.environ.get("ZEAL_FUZZ_EXAMPLES", "40"))

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
def test_api_never_errors_and_keeps_its_schema(api_schema: Any) -> None:
    """Every generated request, for every operation, gets a documented status and a body
    that fits the schema (no 500).

    Driven through schemathesis's Hypothesis strategies directly: its pytest plugin does not
    run under pytest 9.
    """
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {TOKEN}"}
            case.call_and_validate(checks=CHECKS)

        run()
