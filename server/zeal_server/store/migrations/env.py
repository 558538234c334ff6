"""Alembic environment: uses the connection handed over by zeal_server.store.db.migrate."""

from __future__ import annotations

from alembic import context

from zeal_server.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through zeal_server.store.db.migrate (zeal-server migrate)")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
