"""How long stored messages waited between their arrival and the commit that stored them:
a Prometheus histogram and the recent lags the health details summarise."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
from prometheus_client.metrics_core import HistogramMetricFamily, Metric

__all__ = ["LAG_BUCKETS", "RECENT_LAGS", "CommitLags"]

#: Receive-to-commit lag buckets (seconds): a healthy collector commits within 0.1 s at a
#: light load and within about 2 s under a heavy inflow (inbox.Inbox.take gathers); a
#: database stall shows up in the upper buckets.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Commit lags the health details summarise, at most (the most recent).
RECENT_LAGS = 20_000


class CommitLags:
    """Receive-to-commit lag of stored messages: the histogram /metrics exposes, and the
    last RECENT_LAGS lags (bounded: memory stays flat) for the health details, an array
    per commit.

    The histogram is counted here, a commit's messages at once (numpy), and exposed as a
    Prometheus histogram family: prometheus_client's Histogram takes one value a call,
    which cost a microsecond a message on the write path."""

    def __init__(self) -> None:
        self._bounds = np.array(LAG_BUCKETS)
        self._counts = np.zeros(len(LAG_BUCKETS) + 1, dtype=np.int64)  # the last: above all
        self._sum = 0.0
        self._lock = threading.Lock()
        #: The last RECENT_LAGS lags, by commit: (committed_ms, lags in ms).
        self._recent: deque[tuple[float, npt.NDArray[np.int64]]] = deque()
        self._held = 0

    def observe(self, committed_ms: float, received_ms: int) -> None:
        self.observe_many(committed_ms, [received_ms])

    def observe_many(self, committed_ms: float, received_ms: list[int]) -> None:
        """The lags of messages received at `received_ms` and committed at `committed_ms`."""
        if not received_ms:
            return
        lags = committed_ms - np.asarray(received_ms, dtype=np.float64)
        seconds = np.maximum(lags, 0.0) / 1000
        found = np.bincount(
            np.searchsorted(self._bounds, seconds, side="left"), minlength=self._counts.size
        )
        with self._lock:
            self._counts += found
            self._sum += float(seconds.sum())
        with self._lock:
            self._recent.append((committed_ms, lags.astype(np.int64)[-RECENT_LAGS:]))
            self._held += len(self._recent[-1][1])
            while self._held - len(self._recent[0][1]) >= RECENT_LAGS:
                self._held -= len(self._recent.popleft()[1])
            if self._held > RECENT_LAGS:  # the oldest commit's first lags go
                when, oldest = self._recent[0]
                self._recent[0] = (when, oldest[self._held - RECENT_LAGS :])
                self._held = RECENT_LAGS

    def collect(self) -> Iterator[Metric]:
        """The histogram family ``zeal_collector_commit_lag_seconds``."""
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        yield HistogramMetricFamily(
            "zeal_collector_commit_lag_seconds",
            "Time from a message's arrival to the commit that stored it (this process).",
            buckets=[
                *(
                    (f"{bound}", count)
                    for bound, count in zip(LAG_BUCKETS, cumulative[:-1], strict=True)
                ),
                ("+Inf", cumulative[-1]),
            ],
            sum_value=total,
        )

    def summary(self, window_s: float = 60.0) -> dict[str, float] | None:
        """Lags (ms) of the messages stored in the last `window_s`: p50, p99, max, how
        many."""
        since = time.time() * 1000 - window_s * 1000
        with self._lock:
            chunks = [chunk for when, chunk in self._recent if when >= since]
        if not chunks:
            return None
        lags = np.sort(np.concatenate(chunks)).tolist()

        def pick(q: float) -> float:
            return float(lags[min(len(lags) - 1, int(q * len(lags)))])

        return {"p50": pick(0.5), "p99": pick(0.99), "max": float(lags[-1]), "n": len(lags)}
