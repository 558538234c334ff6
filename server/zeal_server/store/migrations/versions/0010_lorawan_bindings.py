"""lorawan_bindings: ChirpStack applications and FPorts bound to streams

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lorawan_bindings",
        sa.Column("application_id", sa.String(64), primary_key=True),
        sa.Column("f_port", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("stream_id", sa.Integer(), sa.ForeignKey("streams.id"), nullable=False),
        sa.Column("device_names", sa.String(16), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("lorawan_bindings")
