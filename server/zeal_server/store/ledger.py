"""The privacy ledger at the collector: a batch's readings booked on its device's rows per UTC
day and per UTC hour of their timestamps, if every day and every hour stays within the
stream's policy, or nothing booked and the batch refused whole.

``charge`` books a transaction's batches of one stream together: one conditional upsert per
period length for all their (device, period) rows, each row the sum of the device's batches. A
device's batches all fit when their sum does (a cap is a bound on a sum, so every prefix
fits too). A device whose sum does not fit, or whose row another collector filled
meanwhile, has what was booked for it taken back and its batches booked one by one in
their order (``charge_days``): exactly what booking them one by one from the start gives.
The multi-row statements lock every row the device needs before any one-by-one booking
(PostgreSQL locks a conflicting row even where the upsert's condition fails), so
collectors sharing the database lock ledger rows in one order: stream (ingest takes them in
topic order), then period length (days, then hours), then (device, period).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, delete, or_
from sqlalchemy.orm import Session

from zeal.policy import DAY_MS, HOUR_MS, tally
from zeal.wirebatches import Batches
from zeal_server.store.models import DevicePeriod
from zeal_server.store.rawsql import Raw

__all__ = ["charge", "charge_days", "prune"]

#: (kind, period length): the ledgers a reading is booked on, in their lock order.
PERIODS = (("day", DAY_MS), ("hour", HOUR_MS))
#: Periods (hours since 1970, of timestamps below 2**48 ms) are below this: a device id
#: times it plus a period is one sortable key.
_SPAN = 1 << 27


def charge(
    session: Session,
    raw: Raw,
    allowed: tuple[int, int],
    batches: Batches,
    device_ids: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Book `batches` (batch ``i`` from ``device_ids[i]``, each device's in their order)
    within `allowed` readings per day and per hour: which were booked."""
    owners = np.repeat(device_ids, batches.counts)
    refused: set[int] = set()  # devices whose batches are booked one by one
    booked: list[tuple[str, int, int, int]] = []
    for (kind, size), cap in zip(PERIODS, allowed, strict=True):
        keys, counts = np.unique(owners * _SPAN + batches.timestamps // size, return_counts=True)
        over = counts > cap
        rows = np.stack([keys // _SPAN, keys % _SPAN, np.where(over, 0, counts)], axis=1)
        devices, periods = rows[:, 0].tolist(), rows[:, 1].tolist()
        written = raw.many(session, f"charge_{kind}", ("did", "start", "n"), rows, {"allowed": cap})
        applied = {(int(d), int(p)) for d, p in written}
        for device, period, count, too_many in zip(
            devices, periods, counts.tolist(), over.tolist(), strict=True
        ):
            if too_many or (device, period) not in applied:
                refused.add(device)
            elif count:
                booked.append((kind, device, period, count))
    charged = np.ones(len(batches), dtype=bool)
    if not refused:
        return charged
    for kind, device, period, count in booked:
        if device in refused:
            raw.first(session, f"uncharge_{kind}", {"did": device, "start": period, "n": count})

    def run(name: str, row: dict[str, int]) -> Any:
        return raw.first(session, name, row)

    for i in np.flatnonzero(np.isin(device_ids, list(refused))).tolist():
        stamps = batches.timestamps[batches.starts[i] : batches.starts[i + 1]]
        charged[i] = charge_days(allowed, int(device_ids[i]), stamps, run)
    return charged


def charge_days(
    allowed: tuple[int, int],
    device_id: int,
    timestamps: npt.NDArray[np.int64],
    run: Callable[[str, dict[str, int]], Any],
) -> bool:
    """Book a batch's readings on its device's privacy ledger, per UTC day and per UTC hour
    of their timestamps, if every day and every hour stays within `allowed` (the stream's
    readings per day and per hour); else book nothing (False). Each period is one
    conditional upsert (`run` executes the ingest's compiled statements and gives their
    first row) that takes the period's row lock, so collectors sharing the database cannot
    together let a device past either cap."""
    plan = [
        (kind, tally(timestamps, size), cap)
        for (kind, size), cap in zip(PERIODS, allowed, strict=True)
    ]
    if any(count > cap for _, pairs, cap in plan for _, count in pairs):
        return False
    done: list[tuple[str, int, int]] = []
    for kind, pairs, cap in plan:
        for period, count in pairs:
            row = {"did": device_id, "start": period, "n": count, "allowed": cap}
            if run(f"charge_{kind}", row) is None:
                for done_kind, done_period, k in done:  # the batch is refused whole
                    run(f"uncharge_{done_kind}", {"did": device_id, "start": done_period, "n": k})
                return False
            done.append((kind, period, count))
    return True


def prune(session: Session, horizon_ms: int) -> None:
    """Delete the days and hours that end at or before `horizon_ms`: no batch stamped in them
    is accepted any more, so their counts can no longer decide one."""
    behind = [
        and_(DevicePeriod.hours == size // HOUR_MS, DevicePeriod.period < horizon_ms // size)
        for _, size in PERIODS
    ]
    session.execute(delete(DevicePeriod).where(or_(*behind)))
