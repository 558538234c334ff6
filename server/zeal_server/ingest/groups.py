"""A transaction's messages side by side: per stream, the batches that passed every check
before the store, with their devices (``Group``); the rounds they are stored in; the time
checks (``implausible``); and what happened to each message (``Outcome``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from zeal.wirebatches import Batches, starts_of
from zeal_server.store.writes import StreamEntry

__all__ = [
    "Arrived",
    "Group",
    "Limits",
    "Message",
    "Outcome",
    "implausible",
    "rounds",
    "select_batches",
]


class Arrived(Protocol):
    """A data message as ingest reads it: where it was published, what it carries, and when
    it arrived (ms). ``Message`` is one; so is the collector's ``broker.inbox.Received``,
    handed over as it is."""

    @property
    def topic(self) -> str: ...

    @property
    def payload(self) -> bytes: ...

    @property
    def received_ms(self) -> int: ...


class Message(NamedTuple):
    """A data message to store (``Ingest.add_many``)."""

    topic: str
    payload: bytes
    received_ms: int


class Outcome(NamedTuple):
    """What happened to one message: stored, duplicate, or rejected with a reason (a tuple:
    one is made per message).

    ``reset`` marks a stored batch whose sequence number the device had used before for
    other content; ``last_sequence`` is then the highest sequence stored from the device.
    """

    status: str  # "stored" | "duplicate" | "rejected"
    reason: str | None = None
    stream: str = ""
    device: str = ""
    readings: int = 0
    sequence: int | None = None
    reset: bool = False
    last_sequence: int | None = None


class Limits(Protocol):
    """The time limits of an ingest (``Ingest`` has them)."""

    max_future_ms: int | None
    max_age_ms: int | None
    backfill_ms: int | None
    max_buckets: int | None


@dataclass
class Group:
    """Messages of one stream that passed every check before the store, in topic order:
    message ``positions[i]`` from device ``names[i]`` (id ``device_ids[i]``) holds batch
    ``i``."""

    entry: StreamEntry
    stream: str
    positions: list[int]
    names: list[str]
    batches: Batches
    device_ids: npt.NDArray[np.int64]
    received: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    digests: npt.NDArray[np.int64]
    #: Who sent each under its device's name (store.budgets.Account): whose cap it spends;
    #: None when every one is its device itself (the usual: no tuple per message).
    accounts: list[tuple[str, str]] | None

    def select(self, keep: npt.NDArray[np.bool_]) -> Group:
        """The messages `keep` marks."""
        if keep.all():
            return self
        chosen = np.flatnonzero(keep).tolist()
        return Group(
            self.entry,
            self.stream,
            [self.positions[i] for i in chosen],
            [self.names[i] for i in chosen],
            select_batches(self.batches, keep),
            self.device_ids[keep],
            self.received[keep],
            self.sizes[keep],
            self.digests[keep],
            None if self.accounts is None else [self.accounts[i] for i in chosen],
        )


def select_batches(batches: Batches, keep: npt.NDArray[np.bool_]) -> Batches:
    """The batches `keep` marks, side by side."""
    if keep.all():
        return batches
    counts = batches.counts[keep]
    readings = np.repeat(keep, batches.counts)
    return Batches(
        batches.index[keep],
        batches.sequences[keep],
        starts_of(counts),
        batches.timestamps[readings],
        batches.codes[readings],
    )


def implausible(
    limits: Limits, entry: StreamEntry, batches: Batches, received: npt.NDArray[np.int64]
) -> list[str | None]:
    """Why each well-formed batch is still refused (its times), or None."""
    first = batches.timestamps[batches.starts[:-1]]  # stamps never decrease
    last = batches.timestamps[batches.starts[1:] - 1]
    reasons = np.full(len(batches), "", dtype=object)
    checks = []
    if limits.max_buckets is not None:
        wide = last // entry.bucket_ms - first // entry.bucket_ms >= limits.max_buckets
        for k in np.flatnonzero(wide).tolist():
            stamps = batches.timestamps[batches.starts[k] : batches.starts[k + 1]]
            buckets = stamps // entry.bucket_ms
            wide[k] = 1 + int(np.count_nonzero(np.diff(buckets))) > limits.max_buckets
        checks.append(("too_many_buckets", wide))
    if limits.max_future_ms is not None:
        checks.append(("future_timestamp", last > received + limits.max_future_ms))
    if limits.max_age_ms is not None:
        checks.append(("too_old", first < received - limits.max_age_ms))
    if entry.retention_ms is not None:  # deleted at once else; and a replay must not return
        checks.append(("too_old", first < received - entry.retention_ms))
    if entry.horizon_ms is not None:  # its gaps may be given up: a copy must not return
        checks.append(("too_old", first < entry.horizon_ms))
    if limits.backfill_ms is not None:
        checks.append(("before_stream", first < entry.created_ms - limits.backfill_ms))
    for reason, failed in reversed(checks):  # the first check that fails names it
        reasons[failed] = reason
    return [r or None for r in reasons.tolist()]


def rounds(groups: list[Group]) -> list[list[Group]]:
    """Split the groups so that no round holds one (device, sequence) twice: a device's
    messages go into a later round from its first repeated sequence on (rarely more than
    one round)."""
    found: list[list[Group]] = [[]]
    for group in groups:
        pairs = list(zip(group.device_ids.tolist(), group.batches.sequences.tolist(), strict=True))
        if len(set(pairs)) == len(pairs):
            found[0].append(group)
            continue
        current: dict[int, tuple[int, set[int]]] = {}
        numbers = []
        for device, sequence in pairs:
            number, used = current.get(device, (0, set()))
            if sequence in used:
                number, used = number + 1, set()
            used.add(sequence)
            current[device] = (number, used)
            numbers.append(number)
        chosen = np.array(numbers)
        for number in range(int(chosen.max()) + 1):
            if number == len(found):
                found.append([])
            found[number].append(group.select(chosen == number))
    return found
