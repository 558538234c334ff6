"""Longitudinal streams: a stream's grid (``streams.grid_points``) and the codes each of its
devices has sent (``devices.memo_codes``)

Revision ID: 0018
Revises: 0017

``grid_points`` makes a stream longitudinal (zeal.longitudinal): its devices round each
reading to that many grid values and send a memoized code per value. ``memo_codes`` is a
bitmap of the codes a device has sent in its stream: the collector books a reading only when
its code is new (zeal_server.ingest.memo). Every existing stream is plain (NULL), and no
device has a bitmap; nothing stored changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("streams") as batch:
        batch.add_column(sa.Column("grid_points", sa.Integer(), nullable=True))
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("memo_codes", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("memo_codes")
    with op.batch_alter_table("streams") as batch:
        batch.drop_column("grid_points")
