"""Column encodings of a segment.

Codes are stored one per byte (two or four for wider codes): measured on Seattle data at 6
bits, zstandard then codes them within 1 % of their empirical entropy, where packing the
bits first costs 4 % more. Timestamps are delta-encoded int64 (periodic batches become runs
of one delta); device ids are int32 (runs, after sorting by device). Compacted columns are
zstandard level 3; fresh parts are kept raw (compressing 60 bytes gains nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import zstandard

__all__ = ["Columns", "code_dtype", "decode_columns", "encode_columns"]

_LEVEL = 3


def code_dtype(payload_bits: int) -> np.dtype[np.unsignedinteger]:
    """The narrowest byte-aligned unsigned type for codes of this width."""
    if payload_bits <= 8:
        return np.dtype(np.uint8)
    if payload_bits <= 16:
        return np.dtype("<u2")
    return np.dtype("<u4")


@dataclass(frozen=True)
class Columns:
    codes: npt.NDArray[np.uint64]
    timestamps: npt.NDArray[np.int64]
    devices: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.codes.size)

    def sorted(self) -> Columns:
        order = np.lexsort((self.timestamps, self.devices))
        return Columns(self.codes[order], self.timestamps[order], self.devices[order])

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        return Columns(
            np.concatenate([p.codes for p in parts]),
            np.concatenate([p.timestamps for p in parts]),
            np.concatenate([p.devices for p in parts]),
        )


def encode_columns(
    columns: Columns, payload_bits: int, *, compress: bool
) -> tuple[bytes, bytes, bytes]:
    codes = columns.codes.astype(code_dtype(payload_bits)).tobytes()
    deltas = np.diff(columns.timestamps, prepend=np.int64(0)).astype("<i8").tobytes()
    devices = columns.devices.astype("<i4").tobytes()
    if not compress:
        return codes, deltas, devices
    compressor = zstandard.ZstdCompressor(level=_LEVEL)
    return compressor.compress(codes), compressor.compress(deltas), compressor.compress(devices)


def decode_columns(
    codes: bytes, timestamps: bytes, devices: bytes, payload_bits: int, *, compressed: bool
) -> Columns:
    if compressed:
        decompressor = zstandard.ZstdDecompressor()
        codes, timestamps, devices = (
            decompressor.decompress(b) for b in (codes, timestamps, devices)
        )
    return Columns(
        np.frombuffer(codes, dtype=code_dtype(payload_bits)).astype(np.uint64),
        np.cumsum(np.frombuffer(timestamps, dtype="<i8")).astype(np.int64),
        np.frombuffer(devices, dtype="<i4").astype(np.int64),
    )
