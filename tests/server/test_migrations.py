"""The Alembic migrations build exactly the schema the models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from zeal_server.db import make_engine, migrate
from zeal_server.models import Base


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

    from zeal_server.db import MIGRATIONS

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
