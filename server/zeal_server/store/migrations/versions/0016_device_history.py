"""principals.retired_micro, first_day: a device's spend over its whole life

Revision ID: 0016
Revises: 0015

A device's day totals (``principal_days``) are kept 400 days behind the import window
(they were deleted at it); what is older is folded into its principal's ``retired_micro``
before the rows go, with the first day it spent on (``first_day``), so that its spend since
first seen stays exact after them. Nothing stored changes: every existing principal starts
at 0 retired.
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


def downgrade() -> None:
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("first_day")
        batch.drop_column("retired_micro")
