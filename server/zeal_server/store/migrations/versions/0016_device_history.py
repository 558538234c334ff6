"""principals.retired_micro, first_day: a device's spend over its whole life; caps_version

Revision ID: 0016
Revises: 0015

A device's day totals (``principal_days``) are kept 400 days behind the import window
(they were deleted at it); what is older is folded into its principal's ``retired_micro``
before the rows go, with the first day it spent on (``first_day``), so that its spend since
first seen stays exact after them. ``caps_version`` holds one counter raised with every
change a device's cap depends on: collectors read caps again only when it moved. Nothing
stored changes: every existing principal starts at 0 retired, the counter at 0 (no row).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("principals") as batch:
        batch.add_column(
            sa.Column("retired_micro", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("first_day", sa.BigInteger(), nullable=True))
    op.create_table(  # its one row is made by the first change (store.versions)
        "caps_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("caps_version")
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("first_day")
        batch.drop_column("retired_micro")
