"""From committed batches to PUBACKs: the outbox feeds paho, acknowledgements empty the outbox.

At most ``window`` batches are handed to paho at a time, oldest first; the rest wait in the
outbox (on disk), so an outage costs disk, not memory. A batch leaves the outbox only when
its PUBACK arrives. A batch whose PUBACK carries an error (e.g. not authorized) stays in the
outbox and is not retried by this process: retrying at once would only loop; the next start
tries again.
"""

from __future__ import annotations

import logging
from collections import deque

from zeal.topics import data_topic
from zeal_edge.mqtt import Connection
from zeal_edge.outbox import Outbox

__all__ = ["Pipeline", "topic_of"]

log = logging.getLogger("zeal_edge.pipeline")


def topic_of(namespace: str) -> str:
    """The data topic of a namespace (stream/device): zeal/v1/{stream}/{device}/up."""
    stream, device = namespace.split("/", 1)
    return data_topic(stream, device)


class Pipeline:
    """Publishes outbox batches and books their acknowledgements (one thread)."""

    def __init__(self, outbox: Outbox, connection: Connection, *, window: int = 100) -> None:
        self.outbox, self.connection, self.window = outbox, connection, window
        self._waiting: deque[tuple[str, int]] = deque(outbox.pending_keys())
        self._inflight: dict[int, tuple[str, int]] = {}
        self.refused = 0
        self.acknowledged = 0

    def committed(self, keys: list[tuple[str, int]]) -> None:
        """Batches just committed to the outbox, to be published after the older ones."""
        self._waiting.extend(keys)

    @property
    def unacknowledged(self) -> int:
        return len(self._waiting) + len(self._inflight)

    def pump(self) -> list[tuple[str, int]]:
        """Book acknowledgements, then hand waiting batches to paho up to the window.

        Returns the batches the broker confirmed since the last call.
        """
        acked: list[tuple[str, int]] = []
        while not self.connection.acks.empty():
            mid, failed, reason = self.connection.acks.get_nowait()
            key = self._inflight.pop(mid, None)
            if key is None:
                continue
            if failed:
                self.refused += 1
                log.error(
                    "broker refused batch %s #%d (%s); kept in the outbox for the next start",
                    key[0],
                    key[1],
                    reason,
                )
            else:
                acked.append(key)
        if acked:
            self.outbox.acknowledge(acked)
            self.acknowledged += len(acked)
        while self._waiting and len(self._inflight) < self.window:
            ns, seq = self._waiting.popleft()
            payload = self.outbox.payload(ns, seq)
            if payload is None:
                continue
            self._inflight[self.connection.publish(topic_of(ns), payload)] = (ns, seq)
        return acked
