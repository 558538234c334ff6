"""privacy ledger per device and UTC hour (the policy's hourly cap)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_hours",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("hour", sa.BigInteger(), primary_key=True),
        sa.Column("readings", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("device_hours")
