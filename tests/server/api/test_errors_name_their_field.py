"""Every 422 names the field or parameter it is about and the rule broken ("epsilon: must be
greater than 0"): the test goes through the OpenAPI document's query parameters and request
bodies, sends each a value its schema refuses, and reads the answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import T0, create, feed, operator_client

#: Path parameters filled with what exists (a stream, a device, a tag, a binding).
FILLED = {
    "name": "temps",
    "device": "d0",
    "tag": "site:north",
    "application": "00000000-0000-0000-0000-000000000001",
    "port": "1",
    "login": "d0",
}


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


def _types(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a schema (anyOf, or itself)."""
    return [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]


def bad_value(schema: dict[str, Any]) -> str | None:
    """A query value the schema refuses, or None where any text passes its schema."""
    for alternative in _types(schema):
        kind = alternative.get("type")
        if kind in ("integer", "number"):
            return "not-a-number"
        if kind == "boolean":
            return "maybe"
        if "enum" in alternative:
            return "not-one-of-them"
        if alternative.get("format") == "date-time":
            return "yesterday"
        if "maxLength" in alternative:
            return "x" * (alternative["maxLength"] + 1)
    return None


def named(answer: Any, field: str) -> bool:
    return any(d["msg"].startswith(f"{field}:") for d in answer.json()["detail"])


def test_every_query_parameter_refused_names_itself(client: TestClient) -> None:
    create(client)
    feed(client, "d0", 0, np.full(3, 50.0), T0)
    document = client.get("/openapi.json").json()
    checked = 0
    for path, operations in document["paths"].items():
        operation = operations.get("get")
        if operation is None:
            continue
        url = path
        for key, value in FILLED.items():
            url = url.replace(f"{{{key}}}", value)
        for parameter in operation.get("parameters", []):
            bad = bad_value(parameter.get("schema", {}))
            if parameter["in"] != "query" or bad is None:
                continue
            answer = client.get(url, params={parameter["name"]: bad})
            where = (path, parameter["name"], answer.text)
            assert answer.status_code == 422, where
            assert named(answer, parameter["name"]), where
            checked += 1
    assert checked >= 40  # the walk reached the parameters (there are more than 40)


def test_every_body_field_refused_names_itself(client: TestClient) -> None:
    """A value of the wrong kind in each field of each JSON body (an object, or for an
    object, text)."""
    create(client)
    feed(client, "d0", 0, np.full(3, 50.0), T0)
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    checked = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            ref = content.get("application/json", {}).get("schema", {}).get("$ref")
            if method not in ("post", "put", "patch") or ref is None:
                continue
            url = path
            for key, value in FILLED.items():
                url = url.replace(f"{{{key}}}", value)
            properties = schemas[ref.rsplit("/", 1)[-1]].get("properties", {})
            for field, schema in properties.items():
                objects = all(t.get("type") == "object" for t in _types(schema))
                wrong = "not an object" if objects else {"not": "a value"}
                answer = client.request(method, url, json={field: wrong})
                where = (method, path, field, answer.text)
                assert answer.status_code == 422, where
                assert named(answer, field), where
                checked += 1
    assert checked >= 20


def test_the_cli_prints_the_field(client: TestClient) -> None:
    """What the CLI prints is the answer's message: `epsilon: must be greater than 0`."""
    answer = client.post(
        "/api/v1/streams", json={"name": "t2", "lower": 0, "upper": 1, "epsilon": 0}
    )
    assert answer.status_code == 422
    assert [d["msg"] for d in answer.json()["detail"]] == ["epsilon: must be greater than 0"]
