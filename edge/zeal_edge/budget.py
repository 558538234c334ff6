"""Privacy budget ledger: integer micro-epsilon spent per rolling window, and a cap.

Every privatized reading costs the stream's epsilon, rounded *up* to whole micro-epsilon,
so the ledger never under-counts. Spends are booked per second in the outbox database with
the batch that releases them; the window sums the last ``window_s`` seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from zeal.policy import MICRO, micro_epsilon

__all__ = ["MICRO", "BudgetPolicy", "micro_epsilon"]


@dataclass(frozen=True)
class BudgetPolicy:
    """A cap of ``cap_micro`` micro-epsilon per rolling ``window_s`` seconds (None: no cap)."""

    cap_micro: int | None
    window_s: int

    @classmethod
    def from_epsilon(cls, cap: float | None, window_s: int) -> BudgetPolicy:
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"budget cap must be a positive number of epsilon, got {cap!r}")
        if window_s < 1:
            raise ValueError(f"budget window must be at least 1 second, got {window_s!r}")
        return cls(None if cap is None else math.floor(Fraction(cap) * MICRO), window_s)

    def allows(self, spent_micro: int, cost_micro: int) -> bool:
        """Whether spending cost on top of spent stays within the cap."""
        return self.cap_micro is None or spent_micro + cost_micro <= self.cap_micro

    def reached(self, spent_micro: int) -> str:
        """What the agent logs when a reading is skipped at the cap."""
        cap = 0 if self.cap_micro is None else self.cap_micro
        return (
            f"privacy budget cap reached: {spent_micro / MICRO:.6f} of {cap / MICRO:.6f} "
            f"epsilon spent in the last {self.window_s} s; readings are neither perturbed "
            "nor sent until the window allows"
        )

    def resume_ms(
        self, history: list[tuple[int, int]], pending_micro: int, cost_micro: int
    ) -> int | None:
        """When (ms) enough of the window's spend expires to afford `cost` again.

        ``history`` is the (second, micro) spend inside the window, oldest first; ``None`` when
        the cap is below a single reading's cost (never).
        """
        if self.cap_micro is None:
            return 0
        if cost_micro > self.cap_micro:
            return None
        spent = sum(m for _, m in history) + pending_micro
        for second, micro in history:
            if spent + cost_micro <= self.cap_micro:
                break
            spent -= micro
            expires = (second + self.window_s + 1) * 1000
            if spent + cost_micro <= self.cap_micro:
                return expires
        return 0
