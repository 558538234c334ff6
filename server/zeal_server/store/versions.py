"""The version of the device caps (``caps_version``): one counter, raised in the transaction
of every change a device's cap depends on (a device's or a tag's cap, a device's tags, a
device's rows deleted). A collector caches each device's cap and reads this counter every
few seconds, instead of every cap again: its caches go only when the counter moved."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal_server.store.models import CapsVersion
from zeal_server.store.streams import insert_for

__all__ = ["bump_caps", "caps_version"]


def caps_version(session: Session) -> int:
    """The counter now (0 before any change: its row is made by the first)."""
    found = session.scalar(select(CapsVersion.version).where(CapsVersion.id == 1))
    return int(found or 0)


def bump_caps(session: Session) -> None:
    """Raise the counter, in the caller's transaction (the change and the raise commit
    together: a collector that sees the new counter reads the new caps)."""
    insert = insert_for(session)(CapsVersion).values(id=1, version=1)
    session.execute(
        insert.on_conflict_do_update(
            index_elements=[CapsVersion.id], set_={"version": CapsVersion.version + 1}
        )
    )
