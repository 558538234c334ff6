"""From perturbed readings to PUBACKs, the one path a batch takes (agent and simulator).

The :class:`Batcher` encodes drafts with their namespace's next sequence numbers and
commits them to the outbox in one transaction (payloads, sequences, privacy spend, source
position), then hands them to the :class:`Pipeline`, which feeds paho from the outbox;
acknowledgements empty the outbox.

At most ``window`` batches are handed to paho at a time, oldest first; the rest wait in the
outbox (on disk), so an outage costs disk, not memory. A batch leaves the outbox only when
its PUBACK confirms it. A batch whose PUBACK carries an error (e.g. not authorized) stays in
the outbox and is not retried by this process: retrying at once would only loop; the next
start tries again.

A PUBACK that says "no matching subscribers" (MQTT v5 reason code 16) is not a delivery:
no session subscribes to the data topics, so the broker dropped the batch. That happens
when the collector's persistent session is gone (the broker lost it with its persistence
file, or a clean start under the collector's login wiped it) while the collector is away.
Such a batch stays in the outbox and is sent again, after a pause of ``RETRY_FIRST``
seconds doubling to ``RETRY_MOST`` while it lasts, during which no newer batch is sent
either; once the collector subscribes again, the broker confirms it. An MQTT 3.1.1 broker
says nothing of the kind (its PUBACK has no reason code), so under 3.1.1 such a batch is
taken as delivered (docs/edge-agent.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zeal import Zeal, encode_batch
from zeal.mqtt.topics import data_topic
from zeal.policy import DAY_MS, HOUR_MS, tally
from zeal_edge.budget import micro_epsilon
from zeal_edge.errors import OutboxError
from zeal_edge.mqtt import Connection
from zeal_edge.outbox import Outbox
from zeal_edge.records import SealedBatch

__all__ = ["Batcher", "Draft", "Pipeline", "topic_of", "which_batches"]

log = logging.getLogger(__name__)
#: Seconds before an unheard batch (no subscriber) is sent again, doubling up to RETRY_MOST.
RETRY_FIRST, RETRY_MOST = 1.0, 30.0


def topic_of(namespace: str) -> str:
    """The data topic of a namespace (stream/device): zeal/v1/{stream}/{device}/up."""
    stream, device = namespace.split("/", 1)
    return data_topic(stream, device)


def which_batches(keys: list[tuple[str, int]]) -> str:
    """Batches of one device in a log line: "batch #7" or "3 batches, #7 to #9"."""
    sequences = sorted(seq for _, seq in keys)
    if len(sequences) == 1:
        return f"batch #{sequences[0]}"
    return f"{len(sequences)} batches, #{sequences[0]} to #{sequences[-1]}"


class Pipeline:
    """Publishes outbox batches and books their acknowledgements (one thread)."""

    def __init__(
        self,
        outbox: Outbox,
        connection: Connection,
        *,
        window: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outbox, self.connection, self.window = outbox, connection, window
        self.clock = clock
        self._waiting: deque[tuple[str, int]] = deque(outbox.pending_keys())
        self._inflight: dict[int, tuple[str, int]] = {}
        #: Batches the broker had no subscriber for: sent again at ``_resume_at``.
        self._unheard: list[tuple[str, int]] = []
        self._resume_at: float | None = None
        self._pause = RETRY_FIRST
        self._unheard_logged = -1e18
        self.refused = 0
        self.unheard = 0
        self.acknowledged = 0

    def committed(self, keys: list[tuple[str, int]]) -> None:
        """Batches just committed to the outbox, to be published after the older ones."""
        self._waiting.extend(keys)

    @property
    def unacknowledged(self) -> int:
        return len(self._waiting) + len(self._inflight) + len(self._unheard)

    def pump(self) -> list[tuple[str, int]]:
        """Book acknowledgements, then hand waiting batches to paho up to the window
        (none while unheard batches wait for their pause to end).

        Returns the batches the broker confirmed since the last call.
        """
        acked: list[tuple[str, int]] = []
        while not self.connection.acks.empty():
            ack = self.connection.acks.get_nowait()
            key = self._inflight.pop(ack.mid, None)
            if key is None:
                continue
            if ack.outcome == "refused":
                self.refused += 1
                log.error(
                    "broker refused batch %s #%d (%s); kept in the outbox for the next start",
                    key[0],
                    key[1],
                    ack.reason,
                )
            elif ack.outcome == "unheard":
                self._hold(key)
            else:
                acked.append(key)
        if acked:
            self.outbox.acknowledge(acked)
            self.acknowledged += len(acked)
            if self._resume_at is None:
                self._pause = RETRY_FIRST  # delivered again: the next outage starts short
        self._resume_if_due()
        while self._resume_at is None and self._waiting and len(self._inflight) < self.window:
            ns, seq = self._waiting.popleft()
            payload = self.outbox.payload(ns, seq)
            if payload is None:
                continue
            self._inflight[self.connection.publish(topic_of(ns), payload)] = (ns, seq)
        return acked

    def _hold(self, key: tuple[str, int]) -> None:
        """A batch the broker dropped for want of a subscriber: kept, sent again later."""
        self.unheard += 1
        self._unheard.append(key)
        if self._resume_at is None:
            self._resume_at = self.clock() + self._pause
            self._pause = min(2 * self._pause, RETRY_MOST)
        now = self.clock()
        if now - self._unheard_logged >= 60:
            self._unheard_logged = now
            log.warning(
                "the broker has no subscriber for batch %s #%d (%s): the collector's session "
                "is not on the broker (its server is away and the broker lost or wiped the "
                "session), so the batch was dropped there. It stays in the outbox and is sent "
                "again in %.0f s, until the collector is back (logged once a minute)",
                key[0],
                key[1],
                "no matching subscribers",
                self._resume_at - now,
            )

    def _resume_if_due(self) -> None:
        """Once the pause is over, put the unheard batches back first, oldest first."""
        if self._resume_at is None or self.clock() < self._resume_at:
            return
        self._resume_at = None
        self._waiting.extendleft(sorted(self._unheard, reverse=True))
        self._unheard.clear()


@dataclass(frozen=True)
class Draft:
    """One namespace's perturbed readings, to become one batch."""

    namespace: str
    timestamps: Sequence[int] | npt.NDArray[np.int64]
    codes: npt.NDArray[np.uint64]  # as Zeal.perturb returns them
    offset: int | None = None  # a file source's replay position after these readings
    #: A longitudinal stream's readings that made a new draw (None: every one costs, as in
    #: a plain stream) and the memo table after them (zeal.longitudinal; secret).
    fresh: npt.NDArray[np.bool_] | None = None
    memo: str | None = None


class Batcher:
    """Encode, commit, then publish: drafts become sealed batches in the outbox (one
    transaction for all of them) and wait there for their PUBACK."""

    def __init__(self, outbox: Outbox, pipeline: Pipeline) -> None:
        self.outbox, self.pipeline = outbox, pipeline

    def commit(self, params: Zeal, drafts: Sequence[Draft], *, now_ms: int) -> list[SealedBatch]:
        """Seal and commit `drafts` (at most one per namespace), and queue them for
        publishing. Sequence numbers are read from the outbox each time, so they follow
        any change made there (a sequence reset moves them on); OutboxError if the
        outbox changed meanwhile, and then nothing is committed."""
        cost = micro_epsilon(params.epsilon)
        following = self.outbox.next_sequences()
        sealed = []
        for draft in drafts:
            stream, device = draft.namespace.split("/", 1)
            sequence = following.get(draft.namespace)
            if sequence is None:
                raise OutboxError(f"the outbox has no stream namespace {draft.namespace!r}")
            payload = encode_batch(
                params,
                stream=stream,
                device=device,
                sequence=sequence,
                timestamps=draft.timestamps,
                codes=draft.codes,
            )
            count = len(draft.codes)
            stamps = np.asarray(draft.timestamps, dtype=np.int64)
            if draft.fresh is not None:  # a memoized repeat costs nothing
                stamps = stamps[draft.fresh]
            days = tuple((d, cost * k) for d, k in tally(stamps, DAY_MS))
            hours = tuple((h, cost * k) for h, k in tally(stamps, HOUR_MS))
            sealed.append(
                SealedBatch(
                    draft.namespace,
                    sequence,
                    payload,
                    count,
                    cost * len(stamps),
                    draft.offset,
                    days=days,
                    hours=hours,
                    memo=draft.memo,
                )
            )
        self.outbox.commit_batches(sealed, now_ms=now_ms, fingerprint=params.fingerprint.hex())
        self.pipeline.committed([(b.namespace, b.sequence) for b in sealed])
        return sealed
