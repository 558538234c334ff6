"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rejects",
        sa.Column("stream", sa.String(length=128), nullable=False),
        sa.Column("device", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("last_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "device", "reason"),
    )
    op.create_table(
        "streams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("lower", sa.Float(), nullable=False),
        sa.Column("upper", sa.Float(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("exponent", sa.Integer(), nullable=False),
        sa.Column("payload_bits", sa.Integer(), nullable=False),
        sa.Column("sampler", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=16), nullable=False),
        sa.Column("bucket_seconds", sa.Integer(), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "bucket_totals",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("s0", sa.BigInteger(), nullable=False),
        sa.Column("s1", sa.BigInteger(), nullable=False),
        sa.Column("s2", sa.BigInteger(), nullable=False),
        sa.Column("q0", sa.BigInteger(), nullable=False),
        sa.Column("q1", sa.BigInteger(), nullable=False),
        sa.Column("q2", sa.BigInteger(), nullable=False),
        sa.Column("q3", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "bucket"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("first_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("readings", sa.BigInteger(), nullable=False),
        sa.Column("batches", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("stream_id", "name"),
    )
    op.create_table(
        "segments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("compacted", sa.Boolean(), nullable=False),
        sa.Column("codes", sa.LargeBinary(), nullable=False),
        sa.Column("timestamps", sa.LargeBinary(), nullable=False),
        sa.Column("devices", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.create_index("ix_segments_stream_bucket", ["stream_id", "bucket"], unique=False)

    op.create_table(
        "aggregates",
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("s0", sa.BigInteger(), nullable=False),
        sa.Column("s1", sa.BigInteger(), nullable=False),
        sa.Column("s2", sa.BigInteger(), nullable=False),
        sa.Column("q0", sa.BigInteger(), nullable=False),
        sa.Column("q1", sa.BigInteger(), nullable=False),
        sa.Column("q2", sa.BigInteger(), nullable=False),
        sa.Column("q3", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
        ),
        sa.PrimaryKeyConstraint("stream_id", "bucket", "device_id"),
    )
    op.create_table(
        "batches",
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.Column("readings", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
        ),
        sa.PrimaryKeyConstraint("device_id", "sequence"),
    )


def downgrade() -> None:
    op.drop_table("batches")
    op.drop_table("aggregates")
    with op.batch_alter_table("segments", schema=None) as batch_op:
        batch_op.drop_index("ix_segments_stream_bucket")

    op.drop_table("segments")
    op.drop_table("devices")
    op.drop_table("bucket_totals")
    op.drop_table("streams")
    op.drop_table("rejects")
