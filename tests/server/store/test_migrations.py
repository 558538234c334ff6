"""The Alembic migrations build exactly the schema the models describe."""

from __future__ import annotations

import multiprocessing
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from zeal_server.store.db import make_engine, migrate
from zeal_server.store.models import Base


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    """After `migrate`, autogenerate finds nothing to change (no drift between the two)."""
    engine = make_engine(database_url)
    migrate(engine)
    migrate(engine)  # idempotent
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_tags_written_before_0003_become_group_rows(database_url: str) -> None:
    """A database at revision 0002 with tagged devices: after the upgrade, the same tags are
    rows of device_tags, so the groups it had are still there."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from zeal_server.store.db import MIGRATIONS

    engine = make_engine(database_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0002")
        connection.execute(
            text(
                "INSERT INTO streams (id, name, lower, upper, epsilon, exponent, payload_bits, "
                "sampler, fingerprint, bucket_seconds, description, unit, created_ms) VALUES "
                "(1, 's', 0, 1, 1, 0, 6, 'grid', '00', 60, '', '', 0)"
            )
        )
        for i, tags in enumerate(['{"site": "north", "floor": "2"}', "{}", '{"site": "south"}']):
            connection.execute(
                text(
                    "INSERT INTO devices (id, stream_id, name, tags, first_seen_ms, last_seen_ms, "
                    "readings, batches, bytes, duplicates, sequence_resets) "
                    f"VALUES ({i + 1}, 1, 'd{i}', :tags, 0, 0, 0, 0, 0, 0, 0)"
                ),
                {"tags": tags},
            )
    migrate(engine)
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT device_id, key, value FROM device_tags ORDER BY device_id, key")
        ).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        (1, "floor", "2"),
        (1, "site", "north"),
        (3, "site", "south"),
    ]


def _migrate_after(url: str, barrier: Any, results: Any) -> None:
    engine = make_engine(url)
    barrier.wait(timeout=30)
    try:
        migrate(engine)
        results.put("ok")
    except Exception as exc:  # the race shows as a duplicate-object error
        results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    finally:
        engine.dispose()


def test_replicas_starting_together_migrate_one_postgresql_database_in_turn(
    postgres_url: str,
) -> None:
    """Four processes migrate one empty PostgreSQL database at the same instant (a barrier):
    every one succeeds, because the upgrade holds an advisory lock, and the schema is the
    models' once."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(4), context.Queue()
    workers = [
        context.Process(target=_migrate_after, args=(postgres_url, barrier, results))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(results.get(timeout=5) for _ in workers) == ["ok"] * 4
    engine = make_engine(postgres_url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []
