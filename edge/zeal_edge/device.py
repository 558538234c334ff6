"""One device's privacy cap across its streams, at the agent.

The collector holds a device to a daily cap over all the streams it sends to (zeal.policy:
the device cap, 8 epsilon per UTC day unless the operator set another). An agent that runs
a device's streams together (``zeal-edge run --stream a,b,c``) keeps one ledger for them:
each stream may spend its share of the cap (``--shares``; even by default, each share
rounded down to whole micro-epsilon) and the device's total over the day, read from the
outbox for every stream of the device it holds and kept up to date in memory, never passes
the cap. A reading that would pass either is neither privatized nor sent, and counted as a
skip at the policy, as a reading over its stream's own policy is.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from zeal.policy import cap_micro, check_shares, split
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
    ) -> None:
        self.outbox, self.device = outbox, device
        self.cap_micro = None if cap is None else cap_micro(cap)
        parts = check_shares(list(shares), len(streams))
        self.shares: dict[str, int | None] = (
            dict.fromkeys(streams)
            if self.cap_micro is None
            else dict(zip(streams, split(self.cap_micro, parts), strict=True))
        )
        self._lock = threading.Lock()
        self._spent: dict[int, int] = {}  # day: micro-epsilon, outbox and admitted

    def share(self, stream: str) -> int | None:
        """The stream's share of the cap in micro-epsilon per UTC day (None: no cap)."""
        return self.shares[stream]

    def take(self, day: int, cost: int) -> tuple[int, int] | None:
        """Charge a reading costing `cost` micro-epsilon stamped in UTC day `day`, or give
        (spent, cap) if it would pass the cap (nothing charged)."""
        if self.cap_micro is None:
            return None
        with self._lock:
            spent = self._spent.get(day)
            if spent is None:
                spent = self.outbox.device_spent(self.device, day)
            if spent + cost > self.cap_micro:
                self._spent[day] = spent
                return spent, self.cap_micro
            self._spent[day] = spent + cost
            return None
