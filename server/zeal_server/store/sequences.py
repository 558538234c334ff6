"""Exactly-once per device, in a few bytes per device: what each device has stored of its
sequence numbers (``SequenceState``, columns of its ``devices`` row), and what never
arrived (``missing``) or came out of order (``late``).

A device numbers its batches 0, 1, 2, ... (an agent's outbox; a LoRaWAN frame counter).
The state is a *floor*: every sequence below it is settled, stored or given up; a bitmap
of the sequences stored above it (the out-of-order window, ``WINDOW`` sequences); the
highest sequence stored (the *head*); and the sequence and content digest of the last
``RECENT`` batches stored. A batch is new without a look at anything else when its sequence
is above the head, or in the window and not stored. Otherwise its sequence was used before
and the question is its content: the same batch again (a lost PUBACK, a redelivery: a
duplicate, nothing stored) or a device whose outbox started again (other content: stored,
counted as a sequence reset). The recent digests answer for the last batches (where almost
every redelivery falls); the store itself answers for the others (``Holdings``: are the
batch's readings, timestamps and codes, already among the device's?), which is exact for
any depth, at the cost of reading the segments of the batch's buckets.

A gap in the window is counted ``missing`` once it can no longer be filled: when the
stream's dedup horizon passes the newest batch the device stored (a batch from the gap
would be refused as too old; ``settle``), or when the head runs ``WINDOW`` sequences past
it. A batch stored below the head is counted ``late``. docs/server.md ("Exactly once")
gives the bytes per device.

A device continues its sequence: its next batch is at most ``MAX_SEQUENCE_JUMP`` (65,536)
above the highest it stored (above -1 for a device that never stored anything), and at
most ``MAX_SEQUENCE`` (2**63 - 1; zeal.protocol). A batch beyond either is a *jump* (a
broken or hostile device, one batch at 2**63 - 1): it is stored and counted as a sequence
reset, its digest kept among the recent, but the state does not move to it, so nothing is
counted missing and the device's next honest batch is new. A batch that continues a recent
jump (at most ``WINDOW`` above it) re-bases the state there: a device that really
renumbered (an outbox carried to a stream created anew, a LoRaWAN device bound after months
on the air) is followed after its second batch. A jump sent again is told by the store
itself (``Holdings``), as any sequence used before.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from zeal.protocol import MAX_SEQUENCE, MAX_SEQUENCE_JUMP
from zeal_server.store.export import segment_columns
from zeal_server.store.models import Device, Stream

__all__ = [
    "RECENT",
    "WINDOW",
    "Holdings",
    "SequenceState",
    "as_signed",
    "as_unsigned",
    "load",
    "payload_digests",
    "prune",
    "settle",
    "state_columns",
]

#: Sequences above the floor that the bitmap covers: the out-of-order window.
WINDOW = 256
#: Batches whose (sequence, digest) is kept: redeliveries of these need no store lookup.
RECENT = 4
#: Where ``missing`` stops (a BIGINT column; a device may jump its sequence by 2**64 - 1).
MAX_COUNT = (1 << 63) - 1
_PAIR = struct.Struct("<Qq")
_U64 = 1 << 64


def payload_digests(payloads: list[bytes]) -> npt.NDArray[np.int64]:
    """BLAKE2b-64 of each payload as a signed 64-bit integer (the content key), as an array
    (one join of the digests, not a Python integer per message)."""
    blake2b = hashlib.blake2b
    joined = b"".join([blake2b(p, digest_size=8).digest() for p in payloads])
    return np.frombuffer(joined, dtype=">i8").astype(np.int64)


def as_signed(value: int) -> int:
    """An unsigned 64-bit sequence as the signed integer a BIGINT column holds."""
    return value - _U64 if value >= 1 << 63 else value


def as_unsigned(value: int) -> int:
    return value + _U64 if value < 0 else value


@dataclass
class SequenceState:
    """One device's sequence state (see the module). Sequences are unsigned here."""

    floor: int | None = None
    head: int | None = None
    #: Bit i: sequence floor + i is stored (bit 0 never is: the floor would move past it).
    bits: int = 0
    #: (sequence, digest) of the last batches stored, oldest first.
    recent: list[tuple[int, int]] = field(default_factory=list)
    #: The newest first reading of a stored batch (ms).
    newest_ms: int | None = None
    missing: int = 0
    late: int = 0

    def is_new(self, sequence: int) -> bool:
        """True when no batch with this sequence was ever stored from the device."""
        if self.floor is None or self.head is None or sequence > self.head:
            return True
        offset = sequence - self.floor
        return 0 <= offset < WINDOW and not (self.bits >> offset) & 1

    def recent_digest(self, sequence: int, digest: int) -> bool:
        """True when the batch is one of the last stored (same sequence, same content)."""
        return (sequence, digest) in self.recent

    def _reference(self) -> int | None:
        """What a batch's sequence is measured against (module docstring): the head, -1
        for a device that never stored anything, None for one whose state was pruned away
        (revision 0012: any sequence continues it)."""
        if self.head is not None:
            return self.head
        return -1 if self.newest_ms is None else None

    def limit(self) -> int:
        """The highest sequence that continues the device's (a batch above it is a jump,
        or the continuation of a recent one)."""
        reference = self._reference()
        if reference is None:
            return MAX_SEQUENCE
        return min(MAX_SEQUENCE, reference + MAX_SEQUENCE_JUMP)

    def _beyond(self, sequence: int) -> bool:
        """True when `sequence` is further above the device's than a continuation may be."""
        reference = self._reference()
        return reference is not None and sequence > reference + MAX_SEQUENCE_JUMP

    def _rebase_point(self, sequence: int) -> int | None:
        """The recent jump that `sequence` continues (at most WINDOW above it), if any."""
        for jumped, _ in self.recent:
            if self._beyond(jumped) and jumped < sequence <= jumped + WINDOW:
                return jumped
        return None

    def jumps(self, sequence: int) -> bool:
        """True when a batch at `sequence` would be a jump (module docstring): past
        MAX_SEQUENCE, or more than MAX_SEQUENCE_JUMP above the device's sequence without
        continuing a recent jump."""
        if sequence > MAX_SEQUENCE:
            return True
        return self._beyond(sequence) and self._rebase_point(sequence) is None

    def store(self, sequence: int, digest: int, first_ms: int, *, reset: bool = False) -> bool:
        """Record a stored batch; True if it came after a higher sequence (late; a batch
        after a reset is not late, its sequence is another outbox's). A jump (``jumps``)
        is remembered among the recent batches only."""
        if self.jumps(sequence):  # its newest reading is not the sequence's either
            self.recent = [*self.recent, (sequence, digest)][-RECENT:]
            return False
        base = self._rebase_point(sequence) if self._beyond(sequence) else None
        if base is not None:  # continues a recent jump: the device renumbered
            self.settle()
            self.floor, self.head, self.bits = base + 1, base, 0
        late = not reset and self.head is not None and sequence < self.head
        if self.floor is None:  # its first batch: a small sequence counts from 0 (a device
            # whose state was pruned away, revision 0012, has a newest reading: from there)
            self.floor = 0 if sequence < WINDOW and self.newest_ms is None else sequence
        offset = sequence - self.floor
        if offset >= WINDOW:  # the head runs past the window: its oldest gaps are given up
            self._advance(sequence - WINDOW + 1)
            offset = sequence - self.floor
        if offset >= 0:
            self.bits |= 1 << offset
            self._normalize()
        self.head = sequence if self.head is None else max(self.head, sequence)
        self.recent = [*self.recent, (sequence, digest)][-RECENT:]
        self.newest_ms = first_ms if self.newest_ms is None else max(self.newest_ms, first_ms)
        self.late += int(late)
        return late

    def continued_by(self, run: npt.NDArray[np.uint64]) -> bool:
        """True when `run` (sequences in arrival order) continues the device's sequence
        without a gap: no gap now, and the run is head + 1, head + 2, ... (or 0, 1, ... for
        a device's first batches)."""
        if self.floor is None:
            start = 0 if self.newest_ms is None else None
        else:
            start = self.floor if self.bits == 0 and self.head == self.floor - 1 else None
        if start is None or int(run[0]) != start or start + len(run) - 1 > MAX_SEQUENCE:
            return False
        return len(run) == 1 or bool((np.diff(run.astype(np.int64)) == 1).all())

    def extend(
        self, run: npt.NDArray[np.uint64], digests: npt.NDArray[np.int64], newest: int
    ) -> None:
        """Record the stored batches `run` that ``continued_by`` accepted, at once: what
        ``store`` would make of them one by one."""
        last = int(run[-1])
        self.floor, self.head = last + 1, last
        pairs = zip(run[-RECENT:].tolist(), digests[-RECENT:].tolist(), strict=True)
        self.recent = [*self.recent, *pairs][-RECENT:]
        self.newest_ms = newest if self.newest_ms is None else max(self.newest_ms, newest)

    def settle(self) -> int:
        """Give up every gap below the head (none of its batches can be accepted any more):
        the sequences counted missing."""
        if self.floor is None or self.head is None:
            return 0
        before = self.missing
        self._advance(self.head + 1)
        return self.missing - before

    def _advance(self, floor: int) -> None:
        """Move the floor up to `floor`, counting the gaps it passes as missing."""
        assert self.floor is not None
        if floor <= self.floor:
            return
        passed = floor - self.floor
        if passed >= self.bits.bit_length():  # the whole bitmap (a jump may be 2**64 long)
            stored, self.bits = self.bits.bit_count(), 0
        else:
            stored = (self.bits & ((1 << passed) - 1)).bit_count()
            self.bits >>= passed
        self.missing = min(self.missing + passed - stored, MAX_COUNT)
        self.floor = floor
        self._normalize()

    def _normalize(self) -> None:
        assert self.floor is not None
        run = (~self.bits & (self.bits + 1)).bit_length() - 1  # trailing ones
        if run > 0:
            self.bits >>= run
            self.floor += run

    def gaps(self) -> int:
        """Sequences between the floor and the head not stored (yet)."""
        if self.floor is None or self.head is None or self.head < self.floor:
            return 0
        return self.head - self.floor + 1 - self.bits.bit_count()

    @staticmethod
    def from_row(row: Any) -> SequenceState:
        """From the ``state_columns`` of a devices row."""
        floor, head, bits, recent, newest, missing, late = row
        pairs = [_PAIR.unpack_from(recent, i) for i in range(0, len(recent or b""), _PAIR.size)]
        return SequenceState(
            None if floor is None else as_unsigned(floor),
            None if head is None else as_unsigned(head),
            int.from_bytes(bits or b"", "little"),
            [(int(s), int(d)) for s, d in pairs],
            newest,
            int(missing or 0),
            int(late or 0),
        )

    def values(self) -> dict[str, Any]:
        """Its columns' values, by parameter name (``writes``' device statement)."""
        floor, bits = self.floor, self.bits
        if floor == _U64:  # past the last sequence: kept as the last one, stored (bit 0)
            floor, bits = _U64 - 1, 1
        return {
            "floor": None if floor is None else as_signed(floor),
            "head": None if self.head is None else as_signed(self.head),
            "bits": bits.to_bytes((bits.bit_length() + 7) // 8, "little") or None,
            "recent": b"".join(_PAIR.pack(s, d) for s, d in self.recent) or None,
            "newest": self.newest_ms,
            "missing": self.missing,
            "late": self.late,
        }


def state_columns() -> list[Any]:
    return [
        Device.seq_floor,
        Device.seq_head,
        Device.seq_bits,
        Device.seq_recent,
        Device.seq_newest_ms,
        Device.missing,
        Device.late,
    ]


def load(session: Session, device_ids: Iterable[int]) -> dict[int, SequenceState]:
    """The devices' states, their rows locked until the commit on PostgreSQL (FOR NO KEY
    UPDATE, in id order: every collector takes them in one order, first in its transaction,
    so two never store the same device's batches at once)."""
    chosen = sorted(set(device_ids))
    found: dict[int, SequenceState] = {}
    for first in range(0, len(chosen), 500):
        query = (
            select(Device.id, *state_columns())
            .where(Device.id.in_(chosen[first : first + 500]))
            .order_by(Device.id)
            .with_for_update(key_share=True)
        )
        for device_id, *row in session.execute(query):
            found[int(device_id)] = SequenceState.from_row(row)
    return found


class Holdings:
    """Whether a batch's readings are already stored from its device: the segments of its
    buckets, read once per transaction."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._read: dict[tuple[int, int, int], tuple[Any, ...]] = {}

    def holds(
        self,
        stream_id: int,
        device_id: int,
        timestamps: npt.NDArray[np.int64],
        codes: npt.NDArray[np.uint64],
    ) -> bool:
        """True when every (timestamp, code) of the batch is among the device's readings."""
        stream = self.session.get(Stream, stream_id)
        if stream is None or not len(timestamps):
            return False
        size = stream.bucket_seconds * 1000
        first, stop = int(timestamps[0]) // size, int(timestamps[-1]) // size + 1
        key = (stream_id, first, stop)
        if key not in self._read:
            parts = [c for _, c in segment_columns(self.session, stream, first, stop)]
            self._read[key] = tuple(parts)
        have: dict[tuple[int, int], int] = {}
        for part in self._read[key]:
            mine = part.devices == device_id
            for pair in zip(part.timestamps[mine].tolist(), part.codes[mine].tolist(), strict=True):
                have[pair] = have.get(pair, 0) + 1
        for pair in zip(timestamps.tolist(), codes.tolist(), strict=True):
            if have.get(pair, 0) == 0:
                return False
            have[pair] -= 1
        return True


def settle(session: Session, stream_id: int, horizon_ms: int) -> int:
    """Give up the gaps of the stream's devices whose newest stored batch lies before
    `horizon_ms` (a batch from such a gap is refused as too old): the sequences counted
    missing."""
    query = (
        select(Device.id, *state_columns())
        .where(
            Device.stream_id == stream_id,
            Device.seq_newest_ms < horizon_ms,
            Device.seq_floor <= Device.seq_head,  # gaps (never so for a wrapped sequence)
        )
        .order_by(Device.id)
        .with_for_update(key_share=True)
    )
    counted = 0
    for device_id, *row in session.execute(query).all():
        state = SequenceState.from_row(row)
        counted += state.settle()
        values = state.values()
        session.execute(
            update(Device)
            .where(Device.id == device_id)
            .values(seq_floor=values["floor"], seq_bits=values["bits"], missing=values["missing"])
        )
    return counted


def prune(session: Session, stream_id: int, horizon_ms: int) -> None:
    """Move the stream's dedup horizon up to `horizon_ms` (never back) and give up the gaps
    behind it (``settle``).

    The ingest reads the horizon in its own transaction, the stream row share-locked on
    PostgreSQL, and refuses a batch with a reading before it (``too_old``): a collector
    whose import window is wider, or whose clock is behind, never stores a batch from a gap
    counted missing here, nor one whose segments retention may have deleted."""
    session.execute(
        update(Stream)
        .where(Stream.id == stream_id)
        .where(or_(Stream.horizon_ms.is_(None), Stream.horizon_ms < horizon_ms))
        .values(horizon_ms=horizon_ms)
    )
    settle(session, stream_id, horizon_ms)
