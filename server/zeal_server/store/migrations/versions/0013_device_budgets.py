"""principals, principal_days, tag_budgets: one daily privacy cap per device across streams

Revision ID: 0013
Revises: 0012

A device's identity across streams (``principals``: its name, its login where logins are
provisioned), the micro-epsilon it spent per UTC day over its streams with a policy
(``principal_days``), and the caps given to device tags (``tag_budgets``). Every device
name already stored becomes a principal with no cap of its own, so the server's default
applies to it; its ledger starts from what its streams' ledgers (``device_periods``) hold
for the days still inside the import window: readings times its stream's micro-epsilon per
reading, summed over its streams. Nothing stored changes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _micro(epsilon: float) -> int:
    """zeal.policy.micro_epsilon, as of this revision."""
    return math.ceil(Fraction(epsilon) * 10**6)


def upgrade() -> None:
    principals = op.create_table(
        "principals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("max_epsilon_per_day", sa.Float(), nullable=True),
    )
    days = op.create_table(
        "principal_days",
        sa.Column("principal_id", sa.Integer(), sa.ForeignKey("principals.id"), primary_key=True),
        sa.Column("period", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("micro", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "tag_budgets",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(200), primary_key=True),
        sa.Column("max_epsilon_per_day", sa.Float(), nullable=False),
    )
    bind = op.get_bind()
    names = [r[0] for r in bind.execute(sa.text("SELECT DISTINCT name FROM devices ORDER BY name"))]
    if not names:
        return
    op.bulk_insert(principals, [{"name": n} for n in names])
    ids: dict[str, int] = {
        str(n): int(i) for n, i in bind.execute(sa.text("SELECT name, id FROM principals"))
    }
    spent: dict[tuple[int, int], int] = {}
    rows = bind.execute(
        sa.text(
            "SELECT d.name, p.period, p.readings, s.epsilon FROM device_periods p "
            "JOIN devices d ON d.id = p.device_id JOIN streams s ON s.id = d.stream_id "
            "WHERE p.hours = 24 AND s.max_epsilon_per_day IS NOT NULL"
        )
    )
    for name, period, readings, epsilon in rows:
        key = (ids[name], int(period))
        spent[key] = spent.get(key, 0) + int(readings) * _micro(float(epsilon))
    op.bulk_insert(
        days,
        [{"principal_id": p, "period": d, "micro": m} for (p, d), m in sorted(spent.items())],
    )


def downgrade() -> None:
    op.drop_table("tag_budgets")
    op.drop_table("principal_days")
    op.drop_table("principals")
