"""The records the edge keeps and shows: a sealed batch (encoded, ready to commit), a
batch awaiting its PUBACK, a halt, and what ``zeal-edge status`` shows per namespace."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Halt", "NamespaceStatus", "PendingBatch", "SealedBatch"]


@dataclass(frozen=True)
class SealedBatch:
    """A batch perturbed and encoded, to be committed to the outbox in one transaction with
    its sequence number, its privacy spend and the source position it reached."""

    namespace: str
    sequence: int
    payload: bytes
    readings: int
    spend_micro: int  # integer micro-epsilon: new draws (every reading of a plain stream) x cost
    offset: int | None = None  # the file source's replay position after its last reading
    days: tuple[tuple[int, int], ...] = ()  # (UTC day of the timestamps, micro-epsilon)
    hours: tuple[tuple[int, int], ...] = ()  # (UTC hour of the timestamps, micro-epsilon)
    memo: str | None = None  # a longitudinal stream's memo table after these draws (secret)


@dataclass(frozen=True)
class Halt:
    """Why an agent stopped sending a stream, and for which configuration."""

    reason: str
    message: str
    since_ms: int
    identity: str | None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Halt:
        data: dict[str, Any] = json.loads(text)
        reason, message = str(data["reason"]), str(data["message"])
        return cls(reason, message, int(data["since_ms"]), data["identity"])


@dataclass(frozen=True)
class PendingBatch:
    """An encoded batch in the outbox, sent again with the same bytes until acknowledged."""

    namespace: str
    sequence: int
    payload: bytes
    readings: int


@dataclass(frozen=True)
class NamespaceStatus:
    """What ``zeal-edge status`` shows for one stream and device."""

    namespace: str
    stream: str
    device: str
    next_sequence: int
    last_acked: int | None
    outbox_batches: int
    outbox_readings: int
    sent_batches: int
    sent_readings: int
    skipped_budget: int
    last_skip_ms: int | None
    fingerprint: str | None
    cost_micro: int | None
    cap_micro: int | None
    window_s: int | None
    skipped_invalid: int = 0
    halt: Halt | None = None
    server_rejects: dict[str, int] | None = None
    day_cap_micro: int | None = None  # the stream's policy per UTC day (None: no policy)
    skipped_policy: int = 0  # readings skipped at it
    clipped_low: int = 0  # readings below the stream's range, sent as its lower end
    clipped_high: int = 0  # readings above it, sent as its upper end
    server_key: str | None = None  # the key its server's messages must verify under
    unverified: int = 0  # messages ignored: not signed by that key
    #: Signed messages of its server ignored, by why (stale, not for it, not sent by it)
    ignored: dict[str, int] | None = None
