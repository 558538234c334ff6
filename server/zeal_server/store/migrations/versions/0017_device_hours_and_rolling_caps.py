"""principal_hours: the device hour rule's ledger; 30- and 365-day caps of devices and tags

Revision ID: 0017
Revises: 0016

``principal_hours`` books a device's micro-epsilon per UTC hour over all its streams with a
policy, as ``principal_days`` does per day: the device hour rule (zeal.policy.device_hour_cap)
holds each row. Its rows go at the import window, as a stream's hours do. A device name and
a tag may carry caps over any 30 and any 365 consecutive UTC days besides the day's
(``max_epsilon_per_30_days``, ``max_epsilon_per_365_days``); a tag's day cap may now be
absent when it caps only a longer horizon. The hours still inside the import window start
from what the device's streams' ledgers (``device_periods``) hold for them, booked on the
device name's own principal (identity ""), as revision 0013 started its days: readings
times the stream's micro-epsilon per reading. Nothing stored changes, and no rolling cap
exists.
"""

from __future__ import annotations

import math
from fractions import Fraction

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_ROLLING = ("max_epsilon_per_30_days", "max_epsilon_per_365_days")


def _micro(epsilon: float) -> int:
    """zeal.policy.micro_epsilon, as of this revision."""
    return math.ceil(Fraction(epsilon) * 10**6)


def upgrade() -> None:
    hours = op.create_table(
        "principal_hours",
        sa.Column("principal_id", sa.Integer(), sa.ForeignKey("principals.id"), nullable=False),
        sa.Column("period", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("micro", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("principal_id", "period"),
    )
    with op.batch_alter_table("principals") as batch:
        for column in _ROLLING:
            batch.add_column(sa.Column(column, sa.Float(), nullable=True))
    with op.batch_alter_table("tag_budgets") as batch:
        batch.alter_column("max_epsilon_per_day", existing_type=sa.Float(), nullable=True)
        for column in _ROLLING:
            batch.add_column(sa.Column(column, sa.Float(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT r.id, p.period, p.readings, s.epsilon FROM device_periods p "
            "JOIN devices d ON d.id = p.device_id JOIN streams s ON s.id = d.stream_id "
            "JOIN principals r ON r.name = d.name AND r.identity = '' "
            "WHERE p.hours = 1 AND s.max_epsilon_per_day IS NOT NULL"
        )
    )
    spent: dict[tuple[int, int], int] = {}
    for pid, period, readings, epsilon in rows:
        key = (int(pid), int(period))
        spent[key] = spent.get(key, 0) + int(readings) * _micro(float(epsilon))
    if spent:
        op.bulk_insert(
            hours,
            [{"principal_id": p, "period": h, "micro": m} for (p, h), m in sorted(spent.items())],
        )


def downgrade() -> None:
    with op.batch_alter_table("tag_budgets") as batch:
        for column in _ROLLING:
            batch.drop_column(column)
    op.execute("DELETE FROM tag_budgets WHERE max_epsilon_per_day IS NULL")
    with op.batch_alter_table("tag_budgets") as batch:
        batch.alter_column("max_epsilon_per_day", existing_type=sa.Float(), nullable=False)
    with op.batch_alter_table("principals") as batch:
        for column in _ROLLING:
            batch.drop_column(column)
    op.drop_table("principal_hours")
