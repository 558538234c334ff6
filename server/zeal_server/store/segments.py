"""How a segment row holds its readings (``Segment.data``), and their exact limb sums
(byte diagrams and test vectors: docs/store-format.md).

A segment row holds readings of one stream: codes, millisecond timestamps and device ids.
Its ``data`` is a few *sections*, each a one-byte flag (bit 0: zstandard frame), a 4-byte
little-endian length and the bytes. Three encodings (``Segment.encoding``):

* ``PART`` (0): what one transaction adds to one bucket, in arrival order, raw (compressing a
  few dozen bytes gains nothing): codes as little-endian u8/u16/u32/u64 (the narrowest for
  the stream's width), timestamps as int64 deltas from 0, devices as int32.
* ``LEGACY`` (1): a bucket compacted before schema revision 0007: the same three sections,
  each a zstandard frame, sorted by (device, time).
* ``CHUNK`` (2): readings of a run of buckets, sorted by (device, time), in six sections
  after a header (readings, runs, base time): the runs' device ids as deltas, the runs'
  lengths, each run's first timestamp minus the base, each run's least step between its
  timestamps, the other timestamps as their step less their run's least one, and the
  codes. Each integer section is the narrowest little-endian unsigned type its values fit,
  one type byte first, then zstandard (level 19) when that is smaller. A device reading at a
  steady rate leaves only its clock's jitter (0 to 4 for 1,000 +- 2 ms at 1 Hz): one byte a
  reading, which zstandard's entropy coder takes down to about its entropy; codes are coded
  within 2 % of their empirical entropy (1.5 % measured, docs/server.md), where packing
  their bits first costs more.

The sums: ``limb_sums`` gives, per group of readings, the count and the sums of codes and of
squared codes as 24-bit limbs (``models.LIMB_BITS``): every limb sum stays below 2**63 for
fewer than 2**39 readings, so limb sums of any rows add up exactly in int64 or in SQL.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from zeal import exact_sum, exact_sum_squares
from zeal_server.store.models import LIMB_BITS, SQUARE_LIMBS, SUM_LIMBS

__all__ = [
    "CHUNK",
    "LEGACY",
    "LIMBS",
    "PART",
    "Columns",
    "code_dtype",
    "decode",
    "decode_runs",
    "encode_chunk",
    "encode_part",
    "limb_sums",
    "runs_of",
    "section_sizes",
]

PART, LEGACY, CHUNK = 0, 1, 2
#: Values per limb vector: the count, the sum limbs, the square limbs (models' columns).
LIMBS = 1 + SUM_LIMBS + SQUARE_LIMBS
#: zstandard's level for chunks: at 19 it codes a section of small integers close to its
#: entropy (2.4 bits for 5 equally likely values, where level 3 spends 3), at some 0.3 ms
#: for a chunk's section, once, when it is compacted.
_LEVEL = 19
_MASK = np.uint64((1 << LIMB_BITS) - 1)
_SECTION = struct.Struct("<BI")
_HEADER = struct.Struct("<IIq")
_threads = threading.local()
_TYPES: tuple[np.dtype[Any], ...] = tuple(np.dtype(f"<u{n}") for n in (1, 2, 4, 8))


def code_dtype(payload_bits: int) -> np.dtype[np.unsignedinteger]:
    """The narrowest byte-aligned unsigned type for codes of this width."""
    return next(t for t in _TYPES if 8 * t.itemsize >= payload_bits)


@dataclass(frozen=True)
class Columns:
    codes: npt.NDArray[np.uint64]
    timestamps: npt.NDArray[np.int64]
    devices: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.codes.size)

    def sorted(self) -> Columns:
        """By (device, time), codes breaking ties: one order for the same readings."""
        return self.take(np.lexsort((self.codes, self.timestamps, self.devices)))

    def take(self, index: npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> Columns:
        return Columns(self.codes[index], self.timestamps[index], self.devices[index])

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        return Columns(
            np.concatenate([p.codes for p in parts]),
            np.concatenate([p.timestamps for p in parts]),
            np.concatenate([p.devices for p in parts]),
        )


def _sections(*blobs: tuple[bytes, bool]) -> bytes:
    return b"".join(_SECTION.pack(int(packed), len(b)) + b for b, packed in blobs)


def _split(data: bytes, wanted: tuple[int, ...] | None = None) -> list[bytes]:
    """The sections of `data`, decompressed (those not `wanted` left empty)."""
    out: list[bytes] = []
    at = 0
    unzip = _decompressor()
    while at < len(data):
        packed, size = _SECTION.unpack_from(data, at)
        at += _SECTION.size
        if wanted is not None and len(out) not in wanted:
            out.append(b"")
        else:
            blob = data[at : at + size]
            out.append(unzip.decompress(blob) if packed & 1 else blob)
        at += size
    return out


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (one is not safe to share between threads, and making one
    costs more than decompressing a section)."""
    found: zstandard.ZstdDecompressor | None = getattr(_threads, "unzip", None)
    if found is None:
        found = _threads.unzip = zstandard.ZstdDecompressor()
    return found


def section_sizes(data: bytes) -> list[int]:
    """The stored bytes of each section of `data` (headers left out); the codes come last."""
    sizes, at = [], 0
    while at < len(data):
        _, size = _SECTION.unpack_from(data, at)
        sizes.append(size)
        at += _SECTION.size + size
    return sizes


def _squeezed(raw: bytes) -> tuple[bytes, bool]:
    """`raw` as a zstandard frame when that is smaller."""
    packed = zstandard.ZstdCompressor(level=_LEVEL, write_content_size=True).compress(raw)
    return (packed, True) if len(packed) < len(raw) else (raw, False)


def _ints(values: npt.NDArray[np.int64]) -> bytes:
    """Non-negative integers in the narrowest unsigned type, its index byte first."""
    top = int(values.max()) if values.size else 0
    kind = next(i for i, t in enumerate(_TYPES) if top < 1 << (8 * t.itemsize))
    return bytes([kind]) + values.astype(_TYPES[kind]).tobytes()


def _read_ints(blob: bytes) -> npt.NDArray[np.int64]:
    return np.frombuffer(blob, dtype=_TYPES[blob[0]], offset=1).astype(np.int64)


def encode_part(columns: Columns, payload_bits: int) -> bytes:
    """A transaction's readings of one bucket, raw, in their order (``PART``)."""
    return _sections(
        (columns.codes.astype(code_dtype(payload_bits)).tobytes(), False),
        (np.diff(columns.timestamps, prepend=np.int64(0)).astype("<i8").tobytes(), False),
        (columns.devices.astype("<i4").tobytes(), False),
    )


def runs_of(devices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each run of equal device ids starts (`devices` sorted), and the end."""
    change = np.flatnonzero(devices[1:] != devices[:-1]) + 1
    return np.concatenate([[0], change, [devices.size]]).astype(np.int64)


def encode_chunk(columns: Columns, payload_bits: int) -> bytes:
    """Readings sorted by (device, time) as a ``CHUNK`` (see the module docstring)."""
    bounds = runs_of(columns.devices)
    starts = bounds[:-1]
    stamps = columns.timestamps
    base = int(stamps.min())
    run_devices = columns.devices[starts]
    steps = np.diff(stamps, prepend=stamps[:1])
    steps[starts] = 0
    run_of = np.repeat(np.arange(starts.size), np.diff(bounds))
    within = np.ones(stamps.size, dtype=bool)
    within[starts] = False
    least = np.full(starts.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(least, run_of[within], steps[within])
    least[least == np.iinfo(np.int64).max] = 0  # a run of one reading has no step
    header = _HEADER.pack(len(columns), starts.size, base)
    return _sections(
        (header, False),
        _squeezed(_ints(np.diff(run_devices, prepend=np.int64(0)))),
        _squeezed(_ints(np.diff(bounds))),
        _squeezed(_ints(stamps[starts] - base)),
        _squeezed(_ints(least)),
        _squeezed(_ints(steps[within] - least[run_of[within]])),
        _squeezed(columns.codes.astype(code_dtype(payload_bits)).tobytes()),
    )


def decode(data: bytes, encoding: int, payload_bits: int) -> Columns:
    """The readings a segment row holds (a chunk's and a legacy row's sorted by (device,
    time), a part's in arrival order)."""
    sections = _split(data)
    if encoding in (PART, LEGACY):
        return Columns(
            np.frombuffer(sections[0], dtype=code_dtype(payload_bits)).astype(np.uint64),
            np.cumsum(np.frombuffer(sections[1], dtype="<i8")).astype(np.int64),
            np.frombuffer(sections[2], dtype="<i4").astype(np.int64),
        )
    codes, run_devices, lengths, count = _chunk_runs(sections, payload_bits, encoding)
    base = _HEADER.unpack(sections[0])[2]
    firsts = _read_ints(sections[3]) + base
    least = np.repeat(_read_ints(sections[4]), lengths)
    increments = np.zeros(count, dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    within = np.ones(count, dtype=bool)
    within[at] = False
    increments[within] = _read_ints(sections[5]) + least[within]
    running = np.cumsum(increments)
    stamps = np.repeat(firsts - running[at], lengths) + running
    return Columns(codes, stamps, np.repeat(run_devices, lengths))


def decode_runs(
    data: bytes, encoding: int, payload_bits: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A row's codes with its runs of one device (ids and lengths), without its timestamps:
    what a sum over all of a row's readings needs (a part's runs are of its arrival order)."""
    if encoding in (PART, LEGACY):
        columns = decode(data, encoding, payload_bits)
        bounds = np.concatenate(
            [[0], np.flatnonzero(columns.devices[1:] != columns.devices[:-1]) + 1, [len(columns)]]
        ).astype(np.int64)
        return columns.codes, columns.devices[bounds[:-1]], np.diff(bounds)
    sections = _split(data, (0, 1, 2, 6))
    codes, run_devices, lengths, _ = _chunk_runs(sections, payload_bits, encoding)
    return codes, run_devices, lengths


def _chunk_runs(
    sections: list[bytes], payload_bits: int, encoding: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
    if encoding != CHUNK:
        raise ValueError(f"unknown segment encoding {encoding}")
    codes = np.frombuffer(sections[-1], dtype=code_dtype(payload_bits)).astype(np.uint64)
    count, runs, _ = _HEADER.unpack(sections[0])
    run_devices = np.cumsum(_read_ints(sections[1]))
    lengths = _read_ints(sections[2])
    if codes.size != count or run_devices.size != runs or int(lengths.sum()) != count:
        raise ValueError("a chunk's sections disagree with its header")
    return codes, run_devices, lengths, count


def limb_sums(
    codes: npt.NDArray[np.uint64], starts: npt.NDArray[np.int64], payload_bits: int
) -> npt.NDArray[np.int64]:
    """Per group of `codes` (group ``g`` from ``starts[g]`` to the next start; `starts`
    ascending, the first 0), the limb vector [count, sum limbs..., square limbs...].

    Codes of up to 32 bits are summed with array operations (a square fits in uint64, and
    each 24-bit limb of it sums below 2**63); wider ones group by group in exact integers."""
    groups = starts.size
    out = np.zeros((groups, LIMBS), dtype=np.int64)
    if groups == 0 or codes.size == 0:
        return out
    out[:, 0] = np.diff(np.append(starts, codes.size))
    if payload_bits > 32:
        ends = np.append(starts[1:], codes.size)
        for g, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            part = codes[a:b]
            out[g, 1:] = _limbs(exact_sum(part, payload_bits), SUM_LIMBS) + _limbs(
                exact_sum_squares(part, payload_bits), SQUARE_LIMBS
            )
        return out
    squares = codes * codes
    for i in range(SUM_LIMBS):
        out[:, 1 + i] = np.add.reduceat((codes >> np.uint64(LIMB_BITS * i)) & _MASK, starts)
    for i in range(SQUARE_LIMBS):
        limb = (squares >> np.uint64(LIMB_BITS * i)) & _MASK if i < 3 else squares * 0
        out[:, 1 + SUM_LIMBS + i] = np.add.reduceat(limb, starts)
    return out


def _limbs(value: int, count: int) -> list[int]:
    limbs = [(value >> (LIMB_BITS * i)) & int(_MASK) for i in range(count)]
    if value >> (LIMB_BITS * count):
        raise OverflowError(f"{value} needs more than {count} limbs")
    return limbs
