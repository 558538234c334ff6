"""Many payloads of one stream decoded at once: the collector's write path.

``decode_many`` gives, payload for payload, what ``wire.decode_batch`` gives: the same
batch, or a ``WireError`` with the same reason and text. It reads the header fields of all
payloads with array operations on their concatenation and unpacks every code in one pass,
so a one-reading message costs a microsecond or two instead of some fifteen. A payload that
any check here finds wrong, or whose shape this path leaves alone (codes wider than 32
bits, payloads that are not ``bytes``), is decoded again by ``decode_batch`` alone, which
says exactly why it is refused: the checks here only decide which payloads take the fast
path, never what a payload means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from zeal.wire import (
    FINGERPRINT_BYTES,
    MAX_COUNT,
    MAX_PAYLOAD_BYTES,
    MAX_TIMESTAMP,
    VERSION,
    Batch,
    WireError,
    WireParams,
    decode_batch,
    wire_fingerprint,
)

__all__ = ["Batches", "decode_many", "starts_of"]

_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]
_BOOL = npt.NDArray[np.bool_]
#: Payload bytes decoded per pass: bounds the working memory (a few arrays of 8 bytes per
#: payload byte) whatever a transaction holds.
_CHUNK_BYTES = 1 << 22
#: Codes up to this width are cut out of a 5-byte window; wider ones take decode_batch.
_MAX_WINDOW_BITS = 32
#: The smallest well-formed payload: header, fingerprint, three one-byte varints, a byte
#: of codes.
_MIN_BYTES = 1 + FINGERPRINT_BYTES + 3 + 1
_IRREGULAR = 0x01


@dataclass(frozen=True, eq=False)
class Batches:
    """Decoded batches side by side. Batch ``i`` came from payload ``index[i]``; its
    sequence number is ``sequences[i]``, its readings are ``timestamps`` and ``codes`` from
    ``starts[i]`` to ``starts[i + 1]``."""

    index: _I64
    sequences: _U64
    starts: _I64
    timestamps: _I64
    codes: _U64

    def __post_init__(self) -> None:
        for name in ("index", "sequences", "starts", "timestamps", "codes"):
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return int(self.index.size)

    @property
    def counts(self) -> _I64:
        """Readings per batch."""
        return np.diff(self.starts)

    def batch(self, i: int, fingerprint: bytes) -> Batch:
        """Batch ``i`` as ``decode_batch`` gives it (with its payload's `fingerprint`)."""
        part = slice(int(self.starts[i]), int(self.starts[i + 1]))
        return Batch(
            fingerprint,
            int(self.sequences[i]),
            self.timestamps[part].copy(),
            self.codes[part].copy(),
        )


def starts_of(counts: Sequence[int] | npt.NDArray[np.integer[Any]]) -> _I64:
    """Where each batch's readings start, and where the last ends (``Batches.starts``),
    from the readings per batch."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def decode_many(
    payloads: Sequence[bytes], params: WireParams, *, stream: str, devices: Sequence[str]
) -> tuple[Batches, dict[int, WireError]]:
    """Decode payload ``i`` from ``devices[i]`` on `stream`, for every ``i``: the batches
    that decode (in order) and the error of each payload that does not, by position."""
    if len(payloads) != len(devices):
        raise ValueError(f"{len(payloads)} payloads but {len(devices)} devices")
    known = {d: wire_fingerprint(params, stream, d) for d in dict.fromkeys(devices)}
    fingerprints = [known[d] for d in devices]
    parts: list[Batches] = []
    errors: dict[int, WireError] = {}
    fast = params.payload_bits <= _MAX_WINDOW_BITS and all(type(p) is bytes for p in payloads)
    first = 0
    while first < len(payloads):
        last, size = first, 0
        while last < len(payloads) and (
            last == first or size + len(payloads[last]) <= _CHUNK_BYTES
        ):
            size += len(payloads[last])
            last += 1
        if fast:
            part, refused = _vectorized(payloads[first:last], fingerprints[first:last], params)
        else:
            part, refused = _empty(), np.arange(last - first)
        parts.append(_shifted(part, first))
        found, failed = _one_by_one(payloads, params, stream, devices, (first + refused).tolist())
        parts.append(found)
        errors.update(failed)
        first = last
    return _merge(parts), errors


def _one_by_one(
    payloads: Sequence[bytes],
    params: WireParams,
    stream: str,
    devices: Sequence[str],
    positions: list[int],
) -> tuple[Batches, dict[int, WireError]]:
    """``decode_batch`` on each of `positions`: its batches, and its errors by position."""
    batches: list[tuple[int, Batch]] = []
    errors: dict[int, WireError] = {}
    for i in positions:
        try:
            batches.append((i, decode_batch(payloads[i], params, stream=stream, device=devices[i])))
        except WireError as exc:
            errors[i] = exc
    if not batches:
        return _empty(), errors
    counts = [len(b) for _, b in batches]
    return Batches(
        np.array([i for i, _ in batches], dtype=np.int64),
        np.array([b.sequence for _, b in batches], dtype=np.uint64),
        starts_of(counts),
        np.concatenate([b.timestamps for _, b in batches]),
        np.concatenate([b.codes for _, b in batches]),
    ), errors


def _empty() -> Batches:
    return Batches(
        np.zeros(0, np.int64),
        np.zeros(0, np.uint64),
        np.zeros(1, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0, np.uint64),
    )


def _shifted(part: Batches, by: int) -> Batches:
    if by == 0:
        return part
    return Batches(part.index + by, part.sequences, part.starts, part.timestamps, part.codes)


def _merge(parts: list[Batches]) -> Batches:
    """The batches of `parts` in one, ordered by payload position."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return _empty()
    if len(parts) == 1:
        return parts[0]
    index = np.concatenate([p.index for p in parts])
    order = np.argsort(index, kind="stable")
    counts = np.concatenate([p.counts for p in parts])[order]
    offsets = np.concatenate([p.starts[:-1] + s for p, s in _reading_offsets(parts)])[order]
    starts = starts_of(counts)
    within = np.arange(int(starts[-1])) - np.repeat(starts[:-1], counts)
    take = np.repeat(offsets, counts) + within
    return Batches(
        index[order],
        np.concatenate([p.sequences for p in parts])[order],
        starts,
        np.concatenate([p.timestamps for p in parts])[take],
        np.concatenate([p.codes for p in parts])[take],
    )


def _reading_offsets(parts: list[Batches]) -> list[tuple[Batches, int]]:
    """Each part with the position of its first reading in the parts' concatenation."""
    out, at = [], 0
    for p in parts:
        out.append((p, at))
        at += int(p.starts[-1])
    return out


def _varints(
    buf: npt.NDArray[np.uint8], term: _I64, starts: _I64, limits: _I64
) -> tuple[_U64, _I64, _BOOL]:
    """The varint at each of `starts`, as ``wire._Reader.varint`` reads it (LEB128 in its
    shortest form, below 2**64, ending before `limits`): values, the positions after them,
    and whether each is well formed. `term` lists the positions of the bytes below 0x80,
    the only bytes a varint can end with."""
    k = np.searchsorted(term, starts)
    found = k < term.size
    ends = term[np.minimum(k, max(term.size - 1, 0))] if term.size else starts
    ok = found & (ends < limits) & (ends - starts < 10)
    length = np.where(ok, ends - starts + 1, 1)
    last = buf[np.where(ok, ends, 0)]
    ok &= (length == 1) | (last != 0)  # shortest form
    ok &= (length < 10) | (last <= 1)  # below 2**64
    values = np.zeros(starts.size, dtype=np.uint64)
    for t in range(int(length.max(initial=1))):
        take = ok & (t < length)
        byte = buf[np.where(take, starts + t, 0)].astype(np.uint64) & np.uint64(0x7F)
        values |= np.where(take, byte << np.uint64(7 * t), np.uint64(0))
    return values, ends + 1, ok


def _vectorized(  # noqa: PLR0915 (the byte layout, field by field, as decode_batch reads it)
    payloads: Sequence[bytes], fingerprints: list[bytes], params: WireParams
) -> tuple[Batches, _I64]:
    """The payloads that pass every check, decoded together, and the positions of the
    others (for decode_batch to refuse, or in rare shapes to decode)."""
    n, bits = len(payloads), params.payload_bits
    lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
    buf = np.frombuffer(b"".join(payloads) + bytes(8), dtype=np.uint8)  # slack for windows
    limits = np.cumsum(lengths)
    good = (lengths >= _MIN_BYTES) & (lengths <= MAX_PAYLOAD_BYTES)
    at = np.where(good, limits - lengths, 0)
    head = buf[at]
    flags = head & 0x0F
    good &= ((head >> 4) == VERSION) & (flags <= _IRREGULAR)
    expected = np.frombuffer(b"".join(fingerprints), dtype=np.uint8).reshape(n, FINGERPRINT_BYTES)
    good &= (buf[at[:, None] + 1 + np.arange(FINGERPRINT_BYTES)] == expected).all(axis=1)
    term = np.flatnonzero(buf < 0x80)  # never empty: the slack is zeros
    sequences, pos, ok = _varints(buf, term, at + 1 + FINGERPRINT_BYTES, limits)
    good &= ok
    counts, pos, ok = _varints(buf, term, np.where(good, pos, 0), limits)
    good &= ok & (counts >= 1) & (counts <= MAX_COUNT)
    counts = np.where(good, counts, 1).astype(np.int64)
    bases, pos, ok = _varints(buf, term, np.where(good, pos, 0), limits)
    good &= ok & (bases < MAX_TIMESTAMP)
    # Periodic batches of several readings carry a period, irregular ones count - 1 deltas;
    # both are kept below 2**48 here, so that no sum below can wrap.
    periods = np.zeros(n, dtype=np.uint64)
    spaced = np.flatnonzero(good & (flags == 0) & (counts > 1))
    if spaced.size:
        periods[spaced], pos[spaced], ok = _varints(buf, term, pos[spaced], limits[spaced])
        good[spaced] &= ok & (periods[spaced] < MAX_TIMESTAMP)
    irregular = np.flatnonzero(good & (flags == _IRREGULAR) & (counts > 1))
    steps = counts[irregular] - 1
    deltas = np.zeros(0, dtype=np.uint64)
    if irregular.size:
        owner = np.repeat(np.arange(irregular.size), steps)
        j = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
        k = np.searchsorted(term, pos[irregular])[owner] + j  # the j-th varint ends at term[k]
        starts = np.where(j == 0, pos[irregular][owner], term[np.clip(k - 1, 0, term.size - 1)] + 1)
        deltas, after, ok = _varints(buf, term, starts, limits[irregular][owner])
        ok &= deltas < MAX_TIMESTAMP
        good[irregular] &= np.bincount(owner, weights=~ok, minlength=irregular.size) == 0
        pos[irregular] = after[np.cumsum(steps) - 1]
    good &= limits - pos == (counts * bits + 7) // 8  # else truncated, or trailing bytes
    # Readings of the payloads still good: timestamps, then codes from 5-byte windows.
    live = np.flatnonzero(good)
    counts, pos = counts[live], pos[live]
    starts = starts_of(counts)
    owner = np.repeat(np.arange(live.size), counts)
    j = np.arange(int(starts[-1])) - starts[:-1][owner]
    step = np.where(j > 0, periods[live][owner], np.uint64(0))
    if irregular.size:
        kept = np.repeat(good[irregular], steps)
        step[(np.isin(live, irregular)[owner]) & (j > 0)] = deltas[kept]
    running = np.cumsum(step, dtype=np.uint64)  # within a payload, differences are exact
    stamps = bases[live][owner] + running - running[starts[:-1]][owner]
    bit = 8 * pos[owner] + j * bits
    window = np.zeros(bit.size, dtype=np.uint64)
    for t in range(5):
        window = (window << np.uint64(8)) | buf[(bit >> 3) + t].astype(np.uint64)
    shift = (40 - (bit & 7) - bits).astype(np.uint64)
    codes = (window >> shift) & np.uint64((1 << bits) - 1)
    pad = (counts * bits + 7) // 8 * 8 - counts * bits
    fine = (buf[limits[live] - 1] & ((1 << pad) - 1)) == 0
    fine &= stamps[starts[1:] - 1] < MAX_TIMESTAMP
    wrong = (codes < np.uint64(params.code_min)) | (codes > np.uint64(params.code_max))
    fine &= np.bincount(owner, weights=wrong, minlength=live.size) == 0
    if not fine.all():  # drop them, and their readings
        readings = np.repeat(fine, counts)
        stamps, codes, counts, live = stamps[readings], codes[readings], counts[fine], live[fine]
        starts = starts_of(counts)
    good[:] = False
    good[live] = True
    return Batches(
        live.astype(np.int64),
        sequences[live],
        starts,
        stamps.astype(np.int64),
        codes,
    ), np.flatnonzero(~good)
