"""content-aware dedup, device counters, stream units, the installation id

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import secrets
import time
import warnings

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as streams:
        streams.add_column(
            sa.Column("unit", sa.String(length=32), nullable=False, server_default="")
        )
    with op.batch_alter_table("devices") as devices:
        for name in ("duplicates", "sequence_resets"):
            devices.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
    # The dedup key gains a generation: the same (device, sequence) with other content is a
    # reset outbox's new batch, stored beside the old one. Old rows keep digest NULL.
    sqlite = op.get_bind().dialect.name == "sqlite"
    with (
        warnings.catch_warnings(),
        op.batch_alter_table("batches", recreate="always" if sqlite else "auto") as batches,
    ):
        # SQLite's copy of the table is built with the new key on purpose; SQLAlchemy warns
        # that it differs from the reflected one.
        warnings.filterwarnings("ignore", message=".*specifies columns .* as primary_key")
        batches.add_column(
            sa.Column("generation", sa.Integer(), nullable=False, server_default="0")
        )
        batches.add_column(sa.Column("digest", sa.BigInteger(), nullable=True))
        if not sqlite:
            batches.drop_constraint("batches_pkey", type_="primary")
        batches.create_primary_key("batches_pkey", ["device_id", "sequence", "generation"])
    installation = op.create_table(
        "installation",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(
        installation,
        [{"id": f"zs-{secrets.token_hex(6)}", "created_ms": int(time.time() * 1000)}],
    )


def downgrade() -> None:
    raise NotImplementedError("Zeal does not downgrade schemas; restore a backup instead")
