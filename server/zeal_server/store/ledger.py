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

``charge_devices`` then books the batches the streams let in on their devices' caps across
streams, after every stream's rows: a device with a cap over 30 or 365 days has its
principal row locked and its days read (``Rolling``: every window holding a day booked
must stay within the cap); then its days (``principal_days``, micro-epsilon per UTC day,
within the day cap) and its hours (``principal_hours``, within the device hour rule:
zeal.policy.device_hour_cap), with one conditional upsert per bound for all their
(principal, period) rows: every transaction locks principals, then days, then hours, after
the streams' rows. A device whose total does not fit
has its batches of the transaction booked again one by one in topic order, on its stream's
ledger and then on its cap (every row they touch is locked already; a batch the cap
refuses is taken back from its stream's ledger): exactly what storing the messages one at
a time gives. A batch over its stream's policy is ``over_budget``, as before there was a
device cap; one within it that the cap refuses, ``device_cap``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from zeal.policy import DAY_MS, HOUR_MS, DeviceCaps, device_hour_cap, tally
from zeal.wirebatches import Batches
from zeal_server.store.models import DevicePeriod, Principal, PrincipalDay, PrincipalHour
from zeal_server.store.rawsql import Raw

__all__ = ["DeviceCharge", "Rolling", "charge", "charge_days", "charge_devices", "prune"]

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
    ``order(i)``-th when messages are stored one by one (``topic``, its stream's name and
    "/", then its message's ``positions[i]``: topic order, for one device); ``allowed``
    the stream's readings per day and hour; ``cost`` its micro-epsilon per reading.
    ``booked`` (in: what the stream's ledger booked) and ``capped`` (out: refused at the
    device cap) are updated in place."""

    topic: str
    positions: Sequence[int]
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

    def order(self, i: int) -> tuple[str, int]:
        return self.topic, self.positions[i]

    def stamps(self, i: int) -> npt.NDArray[np.int64]:
        return self.batches.timestamps[self.batches.starts[i] : self.batches.starts[i + 1]]


def _spend(
    charges: list[DeviceCharge], size: int = HOUR_MS
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The (principal, period) keys (periods of `size` ms) of every new batch with a cap,
    what the booked ones spend on each (0 for the others: their rows are locked with the
    rest), and the cheapest reading booked on each (its hour rule: device_hour_cap)."""
    keys_, amounts_, costs_ = [], [], []
    for c in charges:
        mine = c.candidates & (c.principals >= 0)
        if not mine.any():
            continue
        counts = np.where(mine, c.batches.counts, 0)
        owners = np.repeat(c.principals, counts)
        stamps = c.batches.timestamps[np.repeat(mine, c.batches.counts)]
        keys_.append(owners * _SPAN + stamps // size)
        cost = np.where(c.booked[mine], c.cost, 0).astype(np.int64)
        amounts_.append(np.repeat(cost, c.batches.counts[mine]))
        costs_.append(np.full(len(stamps), c.cost, dtype=np.int64))
    if not keys_:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    found, inverse = np.unique(np.concatenate(keys_), return_inverse=True)
    sums = np.zeros(len(found), dtype=np.int64)
    np.add.at(sums, inverse, np.concatenate(amounts_))
    cheapest = np.full(len(found), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(cheapest, inverse, np.concatenate(costs_))
    return found, sums, cheapest


def _days_of(
    hours: npt.NDArray[np.int64], sums: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The (principal, UTC day) keys of (principal, UTC hour) keys `hours` (a day is 24
    hours), and what each spends: their hours' `sums` added."""
    keys = hours // _SPAN * _SPAN + hours % _SPAN // 24
    days, inverse = np.unique(keys, return_inverse=True)
    out = np.zeros(len(days), dtype=np.int64)
    np.add.at(out, inverse, sums)
    return days, out


#: The bound of a day row of a device capped over longer horizons only (no sum reaches it).
_UNBOUNDED = 1 << 62


class Rolling:
    """The days of the devices with a cap over 30 or 365 UTC days (DeviceCaps.rolling) a
    transaction books on, read once after locking their principals' rows (in id order,
    after every stream's ledger rows and before the devices' day rows): what collectors
    sharing the database book for one device over many days is decided one transaction at
    a time. Kept up to date as the one-by-one path books. A collector whose cached caps do
    not show a device's new rolling cap yet (for up to its 2 s poll of the counter of cap
    changes) neither locks nor checks it: the cap holds from then on, as the day cap's
    changes do."""

    def __init__(self, session: Session, caps: dict[int, DeviceCaps], days: npt.NDArray[Any]):
        self.caps = {pid: c.rolling for pid, c in caps.items() if c.rolling}
        self.spent: dict[int, dict[int, int]] = {}
        principals = days // _SPAN
        wanted = sorted({p for p in principals.tolist() if p in self.caps})
        if not wanted:
            return
        session.execute(
            select(Principal.id).where(Principal.id.in_(wanted)).order_by(Principal.id)
            .with_for_update()
        )  # fmt: skip
        span = max(d for pid in wanted for d, _ in self.caps[pid]) - 1
        periods = days % _SPAN
        rows = session.execute(
            select(PrincipalDay.principal_id, PrincipalDay.period, PrincipalDay.micro).where(
                PrincipalDay.principal_id.in_(wanted),
                PrincipalDay.period >= int(periods.min()) - span,
                PrincipalDay.period <= int(periods.max()) + span,
            )
        )
        for pid, day, micro in rows:
            self.spent.setdefault(int(pid), {})[int(day)] = int(micro)

    def fits(self, pid: int, adds: dict[int, int]) -> bool:
        """Whether adding `adds` (UTC day: micro-epsilon) to the device's days keeps every
        window of each capped horizon that holds one of them within its cap."""
        horizons = self.caps.get(pid)
        if not horizons or not adds:
            return True
        mine = self.spent.get(pid, {})
        for days, cap in horizons:
            lo, hi = min(adds) - days + 1, max(adds) + days - 1
            spent = np.zeros(hi - lo + 1, dtype=np.int64)
            for source in (mine, adds):
                for day, micro in source.items():
                    if lo <= day <= hi:
                        spent[day - lo] += micro
            window = np.convolve(spent, np.ones(days, dtype=np.int64), mode="valid")
            # window[s] sums days lo+s .. lo+s+days-1; those holding an added day matter
            for day in adds:
                first = max(0, day - lo - days + 1)
                if window[first : day - lo + 1].max() > cap:
                    return False
        return True

    def add(self, pid: int, adds: dict[int, int]) -> None:
        if pid in self.caps:
            mine = self.spent.setdefault(pid, {})
            for day, micro in adds.items():
                mine[day] = mine.get(day, 0) + micro


def _adds(principals: npt.NDArray[Any], days: npt.NDArray[Any], sums: npt.NDArray[Any]) -> Any:
    out: dict[int, dict[int, int]] = {}
    for pid, day, n in zip(principals.tolist(), days.tolist(), sums.tolist(), strict=True):
        if n:
            out.setdefault(pid, {})[day] = n
    return out


def _book(
    session: Session,
    raw: Raw,
    name: str,
    *,
    rows: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]],
    limits: npt.NDArray[np.int64],
    refused: set[int],
    booked: list[tuple[str, int, int, int]],
) -> None:
    """Book device ledger rows (principal, period, micro-epsilon) with one conditional
    upsert per bound in `limits` (in (principal, period) order within each): a principal
    with a row over its bound, or refused already, has its rows locked with nothing added,
    and joins `refused`; what was added is listed in `booked`."""
    principals, periods, sums = rows
    for cap in np.unique(limits).tolist():
        here = limits == cap
        over = (sums[here] > cap) | np.isin(principals[here], list(refused))
        chosen = np.stack([principals[here], periods[here], np.where(over, 0, sums[here])], axis=1)
        written = raw.many(session, name, ("did", "start", "n"), chosen, {"allowed": cap})
        applied = {(int(p), int(d)) for p, d in written}
        for (pid, period, n), too_much in zip(chosen.tolist(), over.tolist(), strict=True):
            if too_much or (n and (pid, period) not in applied):
                refused.add(pid)
            elif n:
                booked.append((name, pid, period, n))


def charge_devices(
    session: Session, raw: Raw, charges: list[DeviceCharge], caps: dict[int, DeviceCaps]
) -> None:
    """Book what the streams let in (``DeviceCharge.booked``) on the devices' caps
    (`caps` by principal): the rolling horizons checked first (``Rolling``), then the days,
    then the hours (the hour rule), refusing at the cap what does not fit (see the module
    docstring)."""
    hours, hour_sums, cheapest = _spend(charges)
    days, day_sums = _days_of(hours, hour_sums)
    rolling = Rolling(session, caps, days)
    day_owners = days // _SPAN
    refused = {
        pid
        for pid, adds in _adds(day_owners, days % _SPAN, day_sums).items()
        if not rolling.fits(pid, adds)
    }
    booked: list[tuple[str, int, int, int]] = []
    day_caps = [caps[p].day for p in day_owners.tolist()]
    limits = np.array([_UNBOUNDED if c is None else c for c in day_caps], dtype=np.int64)
    _book(
        session,
        raw,
        "charge_device",
        rows=(day_owners, days % _SPAN, day_sums),
        limits=limits,
        refused=refused,
        booked=booked,
    )
    hour_owners = hours // _SPAN
    ruled = np.array([caps[p].day is not None for p in hour_owners.tolist()], dtype=bool)
    if ruled.any():
        owners = hour_owners[ruled]
        limits = np.array(
            [
                device_hour_cap(caps[p].day or 0, cost)
                for p, cost in zip(owners.tolist(), cheapest[ruled].tolist(), strict=True)
            ],
            dtype=np.int64,
        )
        rows = (owners, hours[ruled] % _SPAN, hour_sums[ruled])
        _book(
            session,
            raw,
            "charge_device_hour",
            rows=rows,
            limits=limits,
            refused=refused,
            booked=booked,
        )
    if refused:
        _one_by_one(
            session, raw, charges=charges, caps=caps, rolling=rolling, refused=refused,
            booked=booked,
        )  # fmt: skip


def _one_by_one(
    session: Session,
    raw: Raw,
    *,
    charges: list[DeviceCharge],
    caps: dict[int, DeviceCaps],
    rolling: Rolling,
    refused: set[int],
    booked: list[tuple[str, int, int, int]],
) -> None:
    """The `refused` devices' batches booked again one by one in topic order: what was
    `booked` for them on their caps and their streams' ledgers taken back first."""

    def run(name: str, row: dict[str, int]) -> Any:
        return raw.first(session, name, row)

    for name, pid, period, n in booked:
        if pid in refused:
            run("un" + name, {"did": pid, "start": period, "n": n})
    queue: list[tuple[tuple[str, int], DeviceCharge, int]] = []
    for c in charges:
        for i in np.flatnonzero(c.candidates & np.isin(c.principals, list(refused))).tolist():
            if c.booked[i]:
                _uncharge(run, int(c.device_ids[i]), c.stamps(i))
                c.booked[i] = False
            queue.append((c.order(i), c, i))
    for _, c, i in sorted(queue, key=lambda q: q[0]):
        device, pid, stamps = int(c.device_ids[i]), int(c.principals[i]), c.stamps(i)
        if not charge_days(c.allowed, device, stamps, run):
            continue  # over its stream's policy
        c.booked[i] = _charge_device(
            run, pid, caps[pid], rolling=rolling, cost=c.cost, stamps=stamps
        )
        if not c.booked[i]:  # within its stream's policy, over the device's cap
            _uncharge(run, device, stamps)
            c.capped[i] = True


def _charge_device(
    run: Callable[[str, dict[str, int]], Any],
    pid: int,
    caps: DeviceCaps,
    *,
    rolling: Rolling,
    cost: int,
    stamps: Any,
) -> bool:
    """Book one batch (readings costing `cost` each, stamped `stamps`) on its device's caps:
    its rolling horizons, then every day and every hour of it, or nothing."""
    adds = {day: count * cost for day, count in tally(stamps, DAY_MS)}
    plan = [("charge_device", _UNBOUNDED if caps.day is None else caps.day, list(adds.items()))]
    if caps.day is not None:
        hourly = [(hour, count * cost) for hour, count in tally(stamps, HOUR_MS)]
        plan.append(("charge_device_hour", device_hour_cap(caps.day, cost), hourly))
    if any(n > cap for _, cap, rows in plan for _, n in rows) or not rolling.fits(pid, adds):
        return False
    done: list[tuple[str, int, int]] = []
    for name, cap, rows in plan:
        for period, n in rows:
            if run(name, {"did": pid, "start": period, "n": n, "allowed": cap}) is None:
                for done_name, done_period, k in done:
                    run("un" + done_name, {"did": pid, "start": done_period, "n": k})
                return False
            done.append((name, period, n))
    rolling.add(pid, adds)
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
    session.execute(delete(PrincipalHour).where(PrincipalHour.period < horizon_ms // HOUR_MS))
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
