"""Readings held in memory until their batch is due: each is charged against the privacy
budget as it arrives (or skipped at the cap, never perturbed), and they leave together,
perturbed with the CSPRNG, as one draft for the batcher. Raw readings never leave memory."""

from __future__ import annotations

import logging
import time

import numpy as np

from zeal import Zeal
from zeal_edge.budget import micro_epsilon
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Draft
from zeal_edge.sources import Reading

__all__ = ["Holding"]

log = logging.getLogger("zeal_edge.agent")


class Holding:
    """Up to ``options.batch`` readings of one device, for at most ``options.interval``
    seconds."""

    def __init__(
        self, outbox: Outbox, namespace: str, options: AgentOptions, throttle: Throttle
    ) -> None:
        self.outbox, self.namespace = outbox, namespace
        self.options, self.throttle = options, throttle
        self._readings: list[Reading] = []
        self._since = 0.0

    def __len__(self) -> int:
        return len(self._readings)

    def admit(self, reading: Reading, params: Zeal, *, now_ms: int) -> None:
        """Charge a reading against the budget, or skip it at the cap (never perturbed)."""
        policy, cost = self.options.budget, micro_epsilon(params.epsilon)
        if policy.cap_micro is not None:  # without a cap, no query per reading
            spent = self.outbox.spent(self.namespace, now_ms=now_ms, window_s=policy.window_s)
            spent += cost * len(self._readings)
            if not policy.allows(spent, cost):
                self.outbox.record_skips(self.namespace, 1, now_ms=now_ms)
                if self.throttle.ready("budget"):
                    log.warning("%s", policy.reached(spent))
                return
        if not self._readings:
            self._since = time.monotonic()
        self._readings.append(reading)

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
        if not readings:
            return None
        stamps, last = [], 0
        for r in readings:
            last = max(last, r.timestamp_ms if r.timestamp_ms is not None else now_ms)
            stamps.append(last)
        codes = params.perturb(np.array([r.value for r in readings]))
        offsets = [r.offset for r in readings if r.offset is not None]
        return Draft(self.namespace, stamps, codes, offsets[-1] if offsets else None)

    def drop(self) -> None:
        """Forget the held readings (a halt): never perturbed, so nothing was spent."""
        self._readings = []
