"""Databases for server tests: every test that takes `database_url` runs on SQLite and on a
fresh PostgreSQL database (dropped afterwards)."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

PG = os.environ.get("ZEAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG, autocommit=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'zeal.sqlite'}"
        return
    yield from _postgres_database()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database only (for tests about PostgreSQL itself)."""
    yield from _postgres_database()


def _postgres_database() -> Iterator[str]:
    name = f"zeal_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    yield f"{base}/{name}"
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def _quiet_testclient() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*")
        yield
