"""the installation's signing key; a stream's release of the agents halted on it; a
device's transport

Revision ID: 0011
Revises: 0010

The server signs what agents act on (configurations, tombstones, notices) with an Ed25519
key made here, once per database: its 32-byte seed, in hex, on the installation row. A
database restored from a backup keeps it, so its agents keep trusting it. ``released_ms``:
when the operator released the agents halted on a stream (``zeal-server streams release``).
``devices.transport``: how a device's data arrive (MQTT 0, LoRaWAN 1), set at its first
message from now on: a message by the other way under its name is refused, not merged.
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("installation") as installation:
        installation.add_column(sa.Column("signing_key", sa.String(64), nullable=True))
    op.execute(
        sa.text("UPDATE installation SET signing_key = :key").bindparams(key=secrets.token_hex(32))
    )
    with op.batch_alter_table("streams") as streams:
        streams.add_column(sa.Column("released_ms", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("devices") as devices:
        devices.add_column(sa.Column("transport", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("Zeal does not downgrade schemas; restore a backup instead")
