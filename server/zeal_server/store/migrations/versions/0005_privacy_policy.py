"""privacy policy per stream, privacy loss per device and day

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as streams:
        streams.add_column(sa.Column("max_epsilon_per_day", sa.Float(), nullable=True))
    op.create_table(
        "device_days",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("day", sa.BigInteger(), primary_key=True),
        sa.Column("readings", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("device_days")
    with op.batch_alter_table("streams") as streams:
        streams.drop_column("max_epsilon_per_day")
