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

``charge_devices`` then books the batches the streams let in on their devices' cap across
streams (``principal_days``, micro-epsilon per UTC day), after every stream's rows, with
one conditional upsert per cap value for all their (principal, day) rows: the device cap's
rows are locked after the streams' in every transaction. A device whose total does not fit
has its batches of the transaction booked again one by one in topic order, on its stream's
ledger and then on its cap (every row they touch is locked already; a batch the cap
refuses is taken back from its stream's ledger): exactly what storing the messages one at
a time gives. A batch over its stream's policy is ``over_budget``, as before there was a
device cap; one within it that the cap refuses, ``device_cap``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from zeal.policy import DAY_MS, HOUR_MS, tally
from zeal.wirebatches import Batches
from zeal_server.store.models import DevicePeriod, Principal, PrincipalDay
from zeal_server.store.rawsql import Raw

__all__ = ["DeviceCharge", "charge", "charge_days", "charge_devices", "prune"]

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


def _uncharge(run: Callable[[str, dict[str, int]], Any], device_id: int, stamps: Any) -> None:
    """Take a booked batch's readings back from its stream's ledger."""
    for kind, size in PERIODS:
        for period, count in tally(stamps, size):
            run(f"uncharge_{kind}", {"did": device_id, "start": period, "n": count})


@dataclass
class DeviceCharge:
    """One stream's new batches of a transaction, for the device cap: batch ``i`` from
    ``device_ids[i]`` (principal ``principals[i]``, -1 for none: no cap applies), stored
    ``order[i]``-th when messages are stored one by one (its stream name then its
    message's position: topic order, for one device); ``allowed`` the stream's readings per
    day and hour; ``cost`` its micro-epsilon per reading. ``booked`` (in: what the stream's
    ledger booked) and ``capped`` (out: refused at the device cap) are updated in place."""

    order: list[tuple[str, int]]
    principals: npt.NDArray[np.int64]
    device_ids: npt.NDArray[np.int64]
    batches: Batches
    allowed: tuple[int, int]
    cost: int
    candidates: npt.NDArray[np.bool_]
    booked: npt.NDArray[np.bool_]
    capped: npt.NDArray[np.bool_] = field(init=False)

    def __post_init__(self) -> None:
        self.capped = np.zeros(len(self.booked), dtype=bool)

    def stamps(self, i: int) -> npt.NDArray[np.int64]:
        return self.batches.timestamps[self.batches.starts[i] : self.batches.starts[i + 1]]


def _spend(charges: list[DeviceCharge]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The (principal, day) keys of every new batch with a cap, and what the booked ones
    spend on each (0 for the others: their rows are locked with the rest)."""
    keys_, amounts_ = [], []
    for c in charges:
        mine = c.candidates & (c.principals >= 0)
        if not mine.any():
            continue
        counts = np.where(mine, c.batches.counts, 0)
        owners = np.repeat(c.principals, counts)
        stamps = c.batches.timestamps[np.repeat(mine, c.batches.counts)]
        keys_.append(owners * _SPAN + stamps // DAY_MS)
        cost = np.where(c.booked[mine], c.cost, 0).astype(np.int64)
        amounts_.append(np.repeat(cost, c.batches.counts[mine]))
    if not keys_:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    found, inverse = np.unique(np.concatenate(keys_), return_inverse=True)
    sums = np.zeros(len(found), dtype=np.int64)
    np.add.at(sums, inverse, np.concatenate(amounts_))
    return found, sums


def charge_devices(
    session: Session, raw: Raw, charges: list[DeviceCharge], caps: dict[int, int]
) -> None:
    """Book what the streams let in (``DeviceCharge.booked``) on the devices' caps
    (`caps`: micro-epsilon per UTC day by principal), refusing at the cap what does not fit
    (see the module docstring)."""
    found, sums = _spend(charges)
    principals = found // _SPAN
    limits = np.array([caps[int(p)] for p in principals.tolist()], dtype=np.int64)
    refused: set[int] = set()
    booked: list[tuple[int, int, int]] = []
    for cap in np.unique(limits).tolist():  # one statement per cap, in (principal, day) order
        here = limits == cap
        over = sums[here] > cap
        rows = np.stack(
            [principals[here], found[here] % _SPAN, np.where(over, 0, sums[here])], axis=1
        )
        written = raw.many(session, "charge_device", ("did", "start", "n"), rows, {"allowed": cap})
        applied = {(int(p), int(d)) for p, d in written}
        for (pid, day, n), too_much in zip(rows.tolist(), over.tolist(), strict=True):
            if too_much or (n and (pid, day) not in applied):
                refused.add(pid)
            elif n:
                booked.append((pid, day, n))
    if refused:
        _one_by_one(session, raw, charges=charges, caps=caps, refused=refused, booked=booked)


def _one_by_one(
    session: Session,
    raw: Raw,
    *,
    charges: list[DeviceCharge],
    caps: dict[int, int],
    refused: set[int],
    booked: list[tuple[int, int, int]],
) -> None:
    """The `refused` devices' batches booked again one by one in topic order: what was
    `booked` for them on their caps and their streams' ledgers taken back first."""

    def run(name: str, row: dict[str, int]) -> Any:
        return raw.first(session, name, row)

    for pid, day, n in booked:
        if pid in refused:
            run("uncharge_device", {"did": pid, "start": day, "n": n})
    queue: list[tuple[tuple[str, int], DeviceCharge, int]] = []
    for c in charges:
        for i in np.flatnonzero(c.candidates & np.isin(c.principals, list(refused))).tolist():
            if c.booked[i]:
                _uncharge(run, int(c.device_ids[i]), c.stamps(i))
                c.booked[i] = False
            queue.append((c.order[i], c, i))
    for _, c, i in sorted(queue, key=lambda q: q[0]):
        device, pid, stamps = int(c.device_ids[i]), int(c.principals[i]), c.stamps(i)
        if not charge_days(c.allowed, device, stamps, run):
            continue  # over its stream's policy
        c.booked[i] = _charge_device(run, caps[pid], _device_days(pid, c.cost, stamps))
        if not c.booked[i]:  # within its stream's policy, over the device's cap
            _uncharge(run, device, stamps)
            c.capped[i] = True


def _device_days(pid: int, cost: int, stamps: Any) -> list[tuple[int, int, int]]:
    """(principal, UTC day, micro-epsilon) a batch books on its device's cap."""
    return [(pid, day, count * cost) for day, count in tally(stamps, DAY_MS)]


def _charge_device(
    run: Callable[[str, dict[str, int]], Any], cap: int, days: list[tuple[int, int, int]]
) -> bool:
    """Book one batch on its device's cap (`days`: _device_days), every day or none."""
    if any(n > cap for _, _, n in days):
        return False
    done: list[tuple[int, int, int]] = []
    for pid, day, n in days:
        if run("charge_device", {"did": pid, "start": day, "n": n, "allowed": cap}) is None:
            for _, done_day, k in done:
                run("uncharge_device", {"did": pid, "start": done_day, "n": k})
            return False
        done.append((pid, day, n))
    return True


#: Days of a device's spend across streams kept behind the import window (its account over
#: 7, 30 and 365 days: store.budgets); older ones are folded into its principal's total.
KEEP_DAYS = 400


def prune(session: Session, horizon_ms: int) -> None:
    """Delete the days and hours that end at or before `horizon_ms`: no batch stamped in them
    is accepted any more, so their counts can no longer decide one. A device's days across
    streams stay KEEP_DAYS longer (its account), then fold into its principal's
    ``retired_micro`` (and ``first_day``) as they go."""
    behind = [
        and_(DevicePeriod.hours == size // HOUR_MS, DevicePeriod.period < horizon_ms // size)
        for _, size in PERIODS
    ]
    session.execute(delete(DevicePeriod).where(or_(*behind)))
    cut = horizon_ms // DAY_MS - KEEP_DAYS
    days = PrincipalDay
    gone = (days.principal_id == Principal.id, days.period < cut)
    session.execute(
        update(Principal)
        .where(Principal.id.in_(select(days.principal_id).where(days.period < cut)))
        .values(
            retired_micro=Principal.retired_micro
            + select(func.sum(days.micro)).where(*gone).scalar_subquery(),
            first_day=func.coalesce(
                Principal.first_day, select(func.min(days.period)).where(*gone).scalar_subquery()
            ),
        )
        .execution_options(synchronize_session=False)
    )
    session.execute(delete(days).where(days.period < cut))
