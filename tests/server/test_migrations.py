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
