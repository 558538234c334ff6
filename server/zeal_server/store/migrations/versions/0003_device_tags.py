"""device tags as rows (group queries without giant IN lists); streams open to enrolled
devices only

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as streams:
        streams.add_column(
            sa.Column("enrolled_only", sa.Boolean(), nullable=False, server_default="0")
        )
    tags = op.create_table(
        "device_tags",
        sa.Column("device_id", sa.Integer(), sa.ForeignKey("devices.id"), primary_key=True),
        sa.Column("key", sa.String(length=64), primary_key=True),
        sa.Column("value", sa.String(length=200), nullable=False),
    )
    op.create_index("ix_device_tags_key_value", "device_tags", ["key", "value"])
    rows = op.get_bind().execute(sa.text("SELECT id, tags FROM devices WHERE tags <> '{}'"))
    op.bulk_insert(
        tags,
        [
            {"device_id": device_id, "key": str(key)[:64], "value": str(value)[:200]}
            for device_id, text in rows
            for key, value in json.loads(text or "{}").items()
        ],
    )


def downgrade() -> None:
    op.drop_index("ix_device_tags_key_value", table_name="device_tags")
    op.drop_table("device_tags")
    with op.batch_alter_table("streams") as streams:
        streams.drop_column("enrolled_only")
