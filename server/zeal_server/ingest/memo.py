"""What a longitudinal stream's readings cost at the collector (zeal.longitudinal): a device
sends the code it memoized for a grid value every time it meets that value, so the collector
books a reading only when its code is one its device has not sent in the stream before (and
not earlier in the same batch). The codes a device has sent are a bitmap on its row
(``devices.memo_codes``, one bit per code, revision 0018), extended with every batch
stored.

A device's batches of one transaction are priced in their order, each against the bitmap
and the codes of its earlier batches there (a backlog sent at once pays for each code once).

What that books is what the collector can see: two grid values whose draws gave the same
code are one code here (the agent books both). It can be less than the device's draws in
one more case, of a device that breaks its own ledger: a code its batch carried that the
policy refused still counts as seen for its later batches of the same transaction (an
honest agent never has a batch refused at the policy; the device harms only its own
privacy). It can be more: two collectors storing one device's batches at once may each add
their own codes to the bitmap, the later write keeping only its own, and a code is then
booked again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from zeal.wirebatches import Batches, starts_of
from zeal_server.store.models import Device

__all__ = ["Seen", "fresh_batches", "read_seen", "remember"]

#: Device id to its bitmap of codes sent (bit c of byte c // 8, little-endian).
Seen = dict[int, bytearray]


def _bits(payload_bits: int) -> int:
    return max(1, (1 << payload_bits) // 8)


def read_seen(session: Session, device_ids: npt.NDArray[np.int64], payload_bits: int) -> Seen:
    """The bitmaps of these devices (empty for a device that has sent none)."""
    ids = sorted(set(device_ids.tolist()))
    size = _bits(payload_bits)
    found = {
        int(i): bytearray(bits or b"").ljust(size, b"\0")
        for i, bits in session.execute(
            select(Device.id, Device.memo_codes).where(Device.id.in_(ids))
        )
    }
    return {i: found.get(i, bytearray(size)) for i in ids}


def _fresh(codes: npt.NDArray[np.uint64], bitmap: bytearray) -> npt.NDArray[np.bool_]:
    """Which of one batch's codes are sent for the first time: not in the bitmap, and the
    first of their value in the batch."""
    values = codes.astype(np.int64)
    _, first = np.unique(values, return_index=True)
    mask = np.zeros(values.size, dtype=bool)
    mask[first] = True
    bits = np.frombuffer(bytes(bitmap), dtype=np.uint8)
    known: npt.NDArray[np.uint8] = (bits[values >> 3] >> (values & 7).astype(np.uint8)) & 1
    fresh: npt.NDArray[np.bool_] = mask & (known == 0)
    return fresh


def _add(bitmap: bytearray, codes: npt.NDArray[np.uint64]) -> bool:
    """Set the codes' bits; whether any was new."""
    new = False
    for code in np.unique(codes).tolist():
        byte, bit = code >> 3, 1 << (code & 7)
        if not bitmap[byte] & bit:
            bitmap[byte] |= bit
            new = True
    return new


def fresh_batches(batches: Batches, device_ids: npt.NDArray[np.int64], seen: Seen) -> Batches:
    """The batches with only the readings that cost (each batch against its device's
    bitmap as it stands), for the privacy ledgers."""
    keep = np.zeros(batches.codes.size, dtype=bool)
    working = {device: bytearray(bits) for device, bits in seen.items()}
    for i, device in enumerate(device_ids.tolist()):
        part = slice(int(batches.starts[i]), int(batches.starts[i + 1]))
        keep[part] = _fresh(batches.codes[part], working[device])
        _add(working[device], batches.codes[part])
    owner = np.repeat(np.arange(len(batches)), batches.counts)
    counts = np.bincount(owner[keep], minlength=len(batches))
    return Batches(
        batches.index,
        batches.sequences,
        starts_of(counts.astype(np.int64)),
        batches.timestamps[keep],
        batches.codes[keep],
    )


def remember(
    session: Session,
    batches: Batches,
    device_ids: npt.NDArray[np.int64],
    stored: npt.NDArray[np.bool_],
    seen: Seen,
) -> None:
    """Add the codes of the stored batches to their devices' bitmaps."""
    changed: set[int] = set()
    for i in np.flatnonzero(stored).tolist():
        device = int(device_ids[i])
        if _add(seen[device], batches.codes[batches.starts[i] : batches.starts[i + 1]]):
            changed.add(device)
    for device in sorted(changed):
        session.execute(
            update(Device).where(Device.id == device).values(memo_codes=bytes(seen[device]))
        )
