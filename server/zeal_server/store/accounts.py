"""A device's account across streams as SQL: what its own ledger (identity "") spent over
the last 7, 30 and 365 UTC days and since first seen, in micro-epsilon, one row per device
name (``principal_days`` summed, plus what was folded into ``retired_micro``). The devices
list sorts by it and /stats sums it up over a stream's devices (store.budgets gives one
device's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from zeal_server.store.models import Device, Principal, PrincipalDay

__all__ = ["ACCOUNT_COLUMNS", "accounts", "accounts_of", "stream_accounts"]

#: The account's columns: (name, horizon in days or None for since first seen).
ACCOUNT_COLUMNS = (("last_7_days", 7), ("last_30_days", 30), ("last_365_days", 365),
                   ("since_first_seen", None))  # fmt: skip


def accounts(today: int) -> Any:
    """A subquery of (name, last_7_days, last_30_days, last_365_days, since_first_seen):
    each device name's own account up to UTC day `today` (readings stamped after it count
    too), 0 where nothing is booked."""
    days = PrincipalDay
    sums = [
        func.sum(case((days.period > today - n, days.micro), else_=0))
        if n
        else func.sum(days.micro)
        for _, n in ACCOUNT_COLUMNS
    ]
    spent = (
        select(
            days.principal_id.label("pid"),
            *(s.label(c) for s, (c, _) in zip(sums, ACCOUNT_COLUMNS, strict=True)),
        )
        .group_by(days.principal_id)
        .subquery()
    )
    columns = [
        (func.coalesce(spent.c[c], 0) + (Principal.retired_micro if n is None else 0)).label(c)
        for c, n in ACCOUNT_COLUMNS
    ]
    return (
        select(Principal.name.label("name"), *columns)
        .outerjoin(spent, spent.c.pid == Principal.id)
        .where(Principal.identity == "")
        .subquery()
    )


def accounts_of(session: Session, names: list[str], today: int) -> dict[str, tuple[int, ...]]:
    """The accounts of `names` (micro-epsilon, in ACCOUNT_COLUMNS' order); a name with no
    principal yet is left out (it spent nothing)."""
    if not names:
        return {}
    found = accounts(today)
    rows = session.execute(select(found).where(found.c.name.in_(names)))
    return {str(r[0]): tuple(int(v) for v in r[1:]) for r in rows}


def stream_accounts(session: Session, stream_id: int, today: int) -> list[tuple[int, ...]]:
    """The account of every device of the stream (0s for one with no principal yet)."""
    found = accounts(today)
    rows = session.execute(
        select(*(func.coalesce(found.c[c], 0) for c, _ in ACCOUNT_COLUMNS))
        .select_from(Device)
        .outerjoin(found, found.c.name == Device.name)
        .where(Device.stream_id == stream_id)
    )
    return [tuple(int(v) for v in r) for r in rows]
