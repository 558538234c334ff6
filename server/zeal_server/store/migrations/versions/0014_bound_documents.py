"""streams.revision, installation.endorsements, principals by identity: signed documents
fresh and bound, a device's cap spent by that device only

Revision ID: 0014
Revises: 0013

Every stream gets a revision (its configuration's: agents ignore an older one), the time of
its last known change (its creation or its release). The installation gets room for the
chain of endorsements of a rotated key. A principal becomes a device name *and* the
identity that sent under it (``""`` for the device itself: every principal so far), unique
together. Nothing stored changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

#: Names for SQLite's unnamed constraints, so that batch mode can drop the old unique one.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    with op.batch_alter_table("streams") as streams:
        streams.add_column(
            sa.Column("revision", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.execute(
        "UPDATE streams SET revision = CASE WHEN released_ms IS NOT NULL AND released_ms > "
        "created_ms THEN released_ms ELSE created_ms END"
    )
    with op.batch_alter_table("installation") as installation:
        installation.add_column(sa.Column("endorsements", sa.Text(), nullable=True))
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table(
        "principals", recreate="always" if sqlite else "auto", naming_convention=NAMING
    ) as principals:
        principals.add_column(
            sa.Column("identity", sa.String(100), nullable=False, server_default="")
        )
        principals.drop_constraint(
            "uq_principals_name" if sqlite else "principals_name_key", type_="unique"
        )
        principals.create_unique_constraint("principals_name_identity", ["name", "identity"])


def downgrade() -> None:
    others = "SELECT id FROM principals WHERE identity <> ''"
    op.execute(f"DELETE FROM principal_days WHERE principal_id IN ({others})")
    op.execute("DELETE FROM principals WHERE identity <> ''")
    with op.batch_alter_table("principals") as principals:
        principals.drop_constraint("principals_name_identity", type_="unique")
        principals.drop_column("identity")
        principals.create_unique_constraint("principals_name_key", ["name"])
    with op.batch_alter_table("installation") as installation:
        installation.drop_column("endorsements")
    with op.batch_alter_table("streams") as streams:
        streams.drop_column("revision")
