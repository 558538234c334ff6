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


def test_0013_gives_every_device_the_default_cap_and_its_days_spend(database_url: str) -> None:
    """A database at revision 0012 with one device name in two streams with a policy (epsilon
    1 and 0.5) and in one without: after the upgrade each name is one principal without a cap
    of its own (the default applies), its day's spend the sum over its streams with a policy
    of readings times micro-epsilon, and nothing stored before changed."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import MetaData, Table, insert, select, text

    from zeal_server import store
    from zeal_server.store.db import MIGRATIONS
    from zeal_server.store.fleet import new_device_row

    engine = make_engine(database_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0012")
    with engine.begin() as connection:  # the tables as they are at 0012 (not the models')
        tables = {
            t: Table(t, MetaData(), autoload_with=connection)
            for t in ("streams", "devices", "device_periods")
        }
        for name, epsilon, policy in (("a", 1.0, 8.0), ("b", 0.5, 8.0), ("open", 1.0, None)):
            params = store.derive_params(0, 1, epsilon, max_epsilon_per_day=policy)
            stream_id = connection.execute(
                insert(tables["streams"]).returning(tables["streams"].c.id),
                {
                    **{"name": name, "lower": 0.0, "upper": 1.0, "epsilon": epsilon},
                    **{"exponent": params.exponent, "payload_bits": params.payload_bits},
                    **{"sampler": params.sampler, "fingerprint": params.fingerprint.hex()},
                    **{"bucket_seconds": 60, "description": "", "unit": "", "created_ms": 1},
                    **{"enrolled_only": False, "max_epsilon_per_day": policy},
                },
            ).scalar_one()
            for device, readings in (("home", 3), (f"only-{name}", 1)):
                device_id = connection.execute(
                    insert(tables["devices"]).returning(tables["devices"].c.id),
                    new_device_row(stream_id, device, 1),
                ).scalar_one()
                connection.execute(
                    insert(tables["device_periods"]),
                    [
                        {
                            "device_id": device_id,
                            "hours": 24,
                            "period": 20_000,
                            "readings": readings,
                        },
                        {"device_id": device_id, "hours": 1, "period": 480_000, "readings": 1},
                    ],
                )
    with engine.connect() as connection:
        before = sorted(tuple(r) for r in connection.execute(text("SELECT * FROM device_periods")))
        devices = sorted(tuple(r) for r in connection.execute(select(tables["devices"])))
    migrate(engine)
    with engine.connect() as connection:
        principals = connection.execute(
            text("SELECT name, max_epsilon_per_day FROM principals ORDER BY name")
        ).all()
        days = connection.execute(
            text(
                "SELECT p.name, d.period, d.micro FROM principal_days d JOIN principals p "
                "ON p.id = d.principal_id ORDER BY p.name"
            )
        ).all()
        after = sorted(tuple(r) for r in connection.execute(text("SELECT * FROM device_periods")))
        devices_after = sorted(tuple(r) for r in connection.execute(select(tables["devices"])))
    engine.dispose()
    assert [tuple(p) for p in principals] == [
        ("home", None),
        ("only-a", None),
        ("only-b", None),
        ("only-open", None),
    ]
    assert [tuple(d) for d in days] == [
        ("home", 20_000, 3 * 1_000_000 + 3 * 500_000),
        ("only-a", 20_000, 1_000_000),
        ("only-b", 20_000, 500_000),
    ]
    assert (after, devices_after) == (before, devices)
