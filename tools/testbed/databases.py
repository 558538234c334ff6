"""Databases for tests and benchmarks: a fresh PostgreSQL database, and what each table of a
database occupies on disk (its indexes and TOAST included), after a VACUUM."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Engine, text

__all__ = ["ADMIN", "postgres_database", "table_bytes", "vacuum"]

#: The PostgreSQL server tests and benchmarks create their databases on.
ADMIN = os.environ.get("ZEAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def postgres_database(prefix: str = "zeal_bench") -> Iterator[str]:
    """A new empty PostgreSQL database (its SQLAlchemy URL), dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def vacuum(engine: Engine) -> None:
    """VACUUM FULL on PostgreSQL (every table rewritten without dead rows or free space),
    VACUUM on SQLite (the file rebuilt)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("VACUUM FULL"))
            connection.execute(text("ANALYZE"))
        else:
            connection.execute(text("VACUUM"))


def table_bytes(engine: Engine) -> dict[str, int]:
    """Bytes per table of the database, with its indexes (and on PostgreSQL its TOAST): on
    PostgreSQL ``pg_total_relation_size``, on SQLite the pages ``dbstat`` gives the table
    and its indexes. Alembic's version table is left out."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            rows = connection.execute(
                text(
                    "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
                )
            ).all()
            sizes = {str(name): int(size) for name, size in rows}
        else:
            owners = {
                str(name): str(table)
                for name, table in connection.execute(
                    text(
                        "SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"
                    )
                )
            }
            sizes = {}
            for name, size in connection.execute(
                text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")
            ):
                table = owners.get(str(name), str(name))
                sizes[table] = sizes.get(table, 0) + int(size)
    sizes.pop("alembic_version", None)
    sizes.pop("sqlite_schema", None)
    return sizes
