"""One device's privacy cap across its streams, at the agent.

The collector holds a device to a daily cap over all the streams it sends to (zeal.policy:
the device cap, 8 epsilon per UTC day unless the operator set another). An agent that runs
a device's streams together (``zeal-edge run --stream a,b,c``) keeps one ledger for them:
each stream may spend its share of the cap (``--shares``; even by default, each share
rounded down to whole micro-epsilon) and the device's total over the day, read from the
outbox for every stream of the device it holds and kept up to date in memory, never passes
the cap. Nor does the device's spend in a UTC hour pass the device hour rule (the larger of
a twelfth of the cap and the reading's cost: zeal.policy.device_hour_cap), nor its spend
over any 30 or 365 consecutive UTC days a cap given for them (``rolling``), exactly as the
collector counts them (zeal_server.store.ledger). A reading that would pass any is neither
privatized nor sent, and counted as a skip at the policy, as a reading over its stream's
own policy is.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from zeal.policy import DAY_MS, HOUR_MS, ROLLING, cap_micro, check_shares, device_hour_cap, split
from zeal_edge.outbox import Outbox

__all__ = ["DeviceLedger"]


class DeviceLedger:
    """The device cap (`cap`, epsilon per UTC day; None: none) of `device`, split between
    `streams` by `shares` (none: evenly). Thread-safe: each stream's agent runs in its own
    thread."""

    def __init__(
        self,
        outbox: Outbox,
        device: str,
        cap: float | None,
        streams: Sequence[str],
        shares: Sequence[float] = (),
        *,
        rolling: Mapping[int, float | None] | None = None,
    ) -> None:
        self.outbox, self.device = outbox, device
        #: The caps it was given (micro-epsilon by horizon in UTC days: 1, and ROLLING's):
        #: its ceiling, which caps its server tells it may lower and never raise.
        self.ceiling = {
            days: cap_micro(c)
            for days, c in ((1, cap), *((d, (rolling or {}).get(d)) for d in ROLLING))
            if c is not None
        }
        self.streams, self.parts = list(streams), check_shares(list(shares), len(streams))
        self._lock = threading.Lock()
        self._apply(self.ceiling)
        learned = outbox.learned_caps(device)
        if learned is not None:  # what its server told it before: kept across restarts
            self.learn(learned[2])
        self._spent: dict[int, int] = {}  # day: micro-epsilon, outbox and admitted
        self._hours: dict[int, int] = {}  # hour: the same (an entry an hour: 8,760 a year)

    def _apply(self, caps: Mapping[int, int]) -> None:
        """Take `caps` (micro-epsilon by horizon) as the caps in force."""
        self.cap_micro = caps.get(1)
        #: Its caps over ROLLING horizons (UTC days -> micro-epsilon).
        self.rolling = {days: caps[days] for days in ROLLING if days in caps}
        self.shares: dict[str, int | None] = (
            dict.fromkeys(self.streams)
            if self.cap_micro is None
            else dict(zip(self.streams, split(self.cap_micro, self.parts), strict=True))
        )

    def learn(self, told: Mapping[int, float | None]) -> list[int]:
        """Adopt the caps its server holds (`told`: epsilon by horizon in UTC days; None:
        none there) within its ceiling: each horizon takes the lower of the two. Returns the
        horizons whose told cap was above the ceiling (refused: the ceiling stays)."""
        caps, above = dict(self.ceiling), []
        for days, value in told.items():
            if value is None or days not in (1, *ROLLING):
                continue
            micro = cap_micro(value)
            if days in caps and micro > caps[days]:
                above.append(days)
            else:
                caps[days] = micro
        with self._lock:
            self._apply(caps)
        return above

    def share(self, stream: str) -> int | None:
        """The stream's share of the cap in micro-epsilon per UTC day (None: no cap)."""
        return self.shares[stream]

    def take(self, stamp: int, cost: int) -> tuple[str, int, int, int] | None:
        """Charge a reading costing `cost` micro-epsilon stamped `stamp` (ms), or give the
        period it would pass a cap in (kind: "day", "hour" or "N days"; its number, the
        micro-epsilon spent there, the cap) with nothing charged."""
        if self.cap_micro is None and not self.rolling:
            return None
        day, hour = stamp // DAY_MS, stamp // HOUR_MS
        with self._lock:
            spent = self._day(day)
            if self.cap_micro is not None:
                if spent + cost > self.cap_micro:
                    return "day", day, spent, self.cap_micro
                in_hour = self._hours.get(hour)
                if in_hour is None:
                    in_hour = self.outbox.device_spent(self.device, hour, kind="hour")
                self._hours[hour] = in_hour
                allowed = device_hour_cap(self.cap_micro, cost)
                if in_hour + cost > allowed:
                    return "hour", hour, in_hour, allowed
            for days, cap in self.rolling.items():
                self._load(day - days + 1, day + days - 1)
                total = sum(self._spent.get(d, 0) for d in range(day - days + 1, day + 1))
                for start in range(day - days + 1, day + 1):  # every window holding the day
                    if start > day - days + 1:
                        total += self._spent.get(start + days - 1, 0)
                        total -= self._spent.get(start - 1, 0)
                    if total + cost > cap:
                        return f"{days} days", start, total, cap
            self._spent[day] = spent + cost
            if self.cap_micro is not None:
                self._hours[hour] += cost
            return None

    def _load(self, first: int, last: int) -> None:
        """Read the days from `first` to `last` the ledger holds no figure of yet, in one
        query (those it holds include readings admitted and not yet booked)."""
        if self._covered(first, last):
            return
        found = self.outbox.device_days(self.device, first, last)
        for d in range(first, last + 1):
            self._spent.setdefault(d, found.get(d, 0))

    def _covered(self, first: int, last: int) -> bool:
        return all(d in self._spent for d in range(first, last + 1))

    def _day(self, day: int) -> int:
        """What the device spent on UTC day `day` (read from the outbox once)."""
        spent = self._spent.get(day)
        if spent is None:
            spent = self._spent[day] = self.outbox.device_spent(self.device, day)
        return spent
