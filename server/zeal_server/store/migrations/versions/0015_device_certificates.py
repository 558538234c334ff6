"""device_certificates: the client certificates issued to devices, for the revocation list

Revision ID: 0015
Revises: 0014

A device provisioned with a certificate (``zeal-server devices provision NAME
--certificate``) logs in to the broker with it; revoking the device puts every serial of it
in the revocation list the broker reads. Nothing stored changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_certificates",
        sa.Column("serial", sa.String(40), primary_key=True),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("issued_ms", sa.BigInteger(), nullable=False),
        sa.Column("not_after_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_device_certificates_device", "device_certificates", ["device"])


def downgrade() -> None:
    op.drop_index("ix_device_certificates_device", table_name="device_certificates")
    op.drop_table("device_certificates")
