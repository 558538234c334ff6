"""Readings held in memory until their batch is due: each is charged against the privacy
budget as it arrives (or skipped at the cap, never perturbed), and they leave together,
perturbed with the CSPRNG, as one draft for the batcher. Raw readings never leave memory.

On a longitudinal stream (zeal.longitudinal) a reading costs epsilon only when it rounds to
a grid value the device's memo has no code for yet (and no reading held before it does): a
memoized repeat costs nothing, and is booked as nothing. The memo (offset and codes) is read
from the outbox, kept in memory, and committed with the batch that first sends a new draw;
one that does not match the stream's mechanism (or is lost) is started anew, and its draws
are booked again as they are made."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from zeal import Zeal
from zeal.errors import ParameterError
from zeal.longitudinal import Memo, grid_indices
from zeal.policy import DAY_MS, HOUR_MS, MICRO, cap_micro
from zeal_edge.budget import micro_epsilon
from zeal_edge.device import DeviceLedger
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Draft
from zeal_edge.sources import Reading

__all__ = ["Holding"]

log = logging.getLogger(__name__)


class Holding:
    """Up to ``options.batch`` readings of one device, for at most ``options.interval``
    seconds."""

    def __init__(
        self,
        outbox: Outbox,
        namespace: str,
        options: AgentOptions,
        throttle: Throttle,
        device: DeviceLedger | None = None,
    ) -> None:
        self.outbox, self.namespace = outbox, namespace
        #: The device's cap across its streams, shared by its streams' agents.
        self.device = device
        self.options, self.throttle = options, throttle
        self._readings: list[Reading] = []
        self._since = 0.0
        self._last = 0  # the latest stamp held (reset when the batch leaves)
        self._held: dict[tuple[str, int], int] = {}  # micro-epsilon held per UTC day and hour
        self._held_micro = 0  # micro-epsilon of every reading held
        #: A longitudinal stream's memo, and the grid values held readings will draw.
        self._memo: Memo | None = None
        self._new: set[int] = set()
        self._booked_in: dict[tuple[str, int], int] = {}  # the outbox's ledgers, as read
        self._skipped, self._skip_ms, self._booked = 0, 0, 0.0  # skips at the stream policy
        #: Readings of the last batch released below and above the stream's range.
        self.clipped = (0, 0)

    def __len__(self) -> int:
        return len(self._readings)

    def admit(self, reading: Reading, params: Zeal, *, now_ms: int) -> None:
        """Charge a reading against the stream's policy (per UTC day and per UTC hour of its
        timestamp) and the agent's own cap, or skip it (never perturbed). It is stamped now
        if its source gave no time, and never before the readings held with it (a clock
        stepping back is held level), so the periods charged are those the collector
        counts."""
        policy, cost = self.options.budget, micro_epsilon(params.epsilon)
        unit, (cost, index) = cost, self._cost(reading, params, cost)
        stamp = max(self._last, now_ms if reading.timestamp_ms is None else reading.timestamp_ms)
        policed = params.max_epsilon_per_day is not None and params.readings_per_hour is not None
        if policed:
            assert params.max_epsilon_per_day is not None
            assert params.readings_per_hour is not None
            caps = [
                ("stream policy", "day", DAY_MS, cap_micro(params.max_epsilon_per_day)),
                ("stream policy", "hour", HOUR_MS, unit * params.readings_per_hour),
            ]
            share = None if self.device is None else self.device.share(self.options.stream)
            if share is not None:
                caps.append(("stream's share of the device cap", "day", DAY_MS, share))
            over = self._over(caps, stamp, cost)
            if over is not None:
                self._skip(now_ms, over)
                return
        if policy.cap_micro is not None:  # without a cap, no query per reading
            spent = self.outbox.spent(self.namespace, now_ms=now_ms, window_s=policy.window_s)
            spent += self._held_micro
            if not policy.allows(spent, cost):
                self.outbox.record_skips(self.namespace, 1, now_ms=now_ms)
                if self.throttle.ready("budget"):
                    log.warning("%s", policy.reached(spent))
                return
        if policed and self.device is not None and cost:  # last: it books the reading
            taken = self.device.take(stamp, cost)
            if taken is not None:
                self._skip(now_ms, ("device cap", *taken))
                return
        if not self._readings:
            self._since = time.monotonic()
        self._readings.append(replace(reading, timestamp_ms=stamp))
        self._last = stamp
        self._held_micro += cost
        if index is not None and cost:
            self._new.add(index)
        for key in (("day", stamp // DAY_MS), ("hour", stamp // HOUR_MS)):
            self._held[key] = self._held.get(key, 0) + cost

    def _cost(self, reading: Reading, params: Zeal, cost: int) -> tuple[int, int | None]:
        """What a reading costs, and the grid value a longitudinal stream's reading rounds
        to (None: a plain stream): nothing when that value's code is memoized, or drawn by
        a reading held before it."""
        if params.grid_points is None:
            return cost, None
        memo = self.memo(params)
        index = int(grid_indices(params, [reading.value], memo.offset)[0])
        return (0 if index in memo.codes or index in self._new else cost), index

    def memo(self, params: Zeal) -> Memo:
        """The device's memo for this longitudinal stream: the outbox's, or a new one (a
        lost or mismatched table: its values are drawn, and booked, again)."""
        key = Memo.key_of(params)
        if self._memo is None or self._memo.key != key:
            stored = self.outbox.memo(self.namespace)
            memo = None
            if stored is not None:
                try:
                    memo = Memo.from_json(stored)
                except ParameterError:
                    log.warning("the stored memo table does not read: drawing anew")
            if memo is None or memo.key != key:
                memo = Memo.new(params)
            self._memo, self._new = memo, set()
        return self._memo

    def _skip(self, now_ms: int, over: tuple[str, str, int, int, int]) -> None:
        """Count a reading skipped at a cap (`over`: which cap, its period's kind and
        number, micro-epsilon spent and the cap), and say so at most once a minute."""
        what, kind, period, spent, cap = over
        self._skipped, self._skip_ms = self._skipped + 1, now_ms
        if self.throttle.ready("policy"):
            when = datetime.fromtimestamp(
                period * (HOUR_MS if kind == "hour" else DAY_MS) / 1000, UTC
            )
            log.warning(
                "%s reached: %.6f of %g epsilon spent on readings of the UTC %s from %s; its "
                "readings are neither perturbed nor sent",
                what,
                spent / MICRO,
                cap / MICRO,
                kind,
                when.isoformat(timespec="minutes"),
            )

    def _over(
        self, caps: list[tuple[str, str, int, int]], stamp: int, cost: int
    ) -> tuple[str, str, int, int, int] | None:
        """The cap a reading stamped `stamp` would pass (what, period kind, number,
        micro-epsilon spent on it, cap), or None if it fits. What the outbox booked for a
        period is read once per batch held: only this holding commits to its namespace."""
        for what, kind, size, cap in caps:
            key = (kind, stamp // size)
            booked = self._booked_in.get(key)
            if booked is None:
                found = self.outbox.spent_by_day(self.namespace, key[1], kind=kind)
                booked = self._booked_in[key] = found.get(key[1], 0)
            spent = booked + self._held.get(key, 0)
            if spent + cost > cap:
                return what, kind, key[1], spent, cap
        return None

    def book_skips(self, *, final: bool = False) -> None:
        """Count the readings skipped at the stream's policy in the outbox (for `zeal-edge
        status`): at most once a second, since a day's excess can be many readings."""
        if self._skipped and (final or time.monotonic() - self._booked >= 1.0):
            self.outbox.record_skips(
                self.namespace, self._skipped, now_ms=self._skip_ms, policy=True
            )
            self._skipped, self._booked = 0, time.monotonic()

    def due(self, *, ended: bool) -> bool:
        """A batch is due: it is full, its oldest reading waited ``interval`` seconds, or the
        source has ended."""
        if not self._readings:
            return False
        full = len(self._readings) >= self.options.batch
        return full or ended or time.monotonic() - self._since >= self.options.interval

    def release(self, params: Zeal, *, now_ms: int) -> Draft | None:
        """The held readings perturbed, with their timestamps (a clock that steps back is
        held level within a batch) and the source position they reach; None if none."""
        readings, self._readings = self._readings, []
        self._last, self._held, self._booked_in = 0, {}, {}
        self._held_micro, self._new = 0, set()
        if not readings:
            return None
        stamps, last = [], 0
        for r in readings:
            last = max(last, r.timestamp_ms if r.timestamp_ms is not None else now_ms)
            stamps.append(last)
        values = np.array([r.value for r in readings])
        self.clipped = (int((values < params.lower).sum()), int((values > params.upper).sum()))
        offsets = [r.offset for r in readings if r.offset is not None]
        offset = offsets[-1] if offsets else None
        if params.grid_points is None:
            return Draft(self.namespace, stamps, params.perturb(values), offset)
        held = self.memo(params)
        # Drawn on a copy, and read back from the outbox for the next batch: the draws
        # count once their batch is committed with the table (a batch that fails to
        # commit is never sent, and its draws are forgotten with it).
        memo, self._memo = Memo(held.key, held.offset, held.codes), None
        reports = memo.report(params, values)
        table = memo.to_json() if reports.draws else None
        return Draft(self.namespace, stamps, reports.codes, offset, reports.fresh, table)

    def drop(self) -> None:
        """Forget the held readings (a halt): never perturbed, so nothing was spent."""
        self._readings = []
        self._last, self._held, self._booked_in = 0, {}, {}
        self._held_micro, self._new = 0, set()
