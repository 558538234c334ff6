"""Databases for server tests: every test that takes `database_url` runs on SQLite and on a
fresh PostgreSQL database (dropped afterwards)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import operator_client, postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'zeal.sqlite'}"
        return
    yield from postgres_database()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database only (for tests about PostgreSQL itself)."""
    yield from postgres_database()


@pytest.fixture(autouse=True)
def _quiet_testclient() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*")
        yield


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    """A client of a server on the test database (no broker) with the operator token."""
    yield from operator_client(database_url)
