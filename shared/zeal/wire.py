"""Wire format v2: one batch of codes from one device, as sent over MQTT.

Byte layout (``docs/wire-format.md`` has the full description and test vectors)::

    header      1 byte   version (high nibble, 2) | flags (low nibble; bit 0: irregular)
    fingerprint 4 bytes  SHA-256(parameter fingerprint | "/" | stream | "/" | device)[:4]:
                         binds the parameters, the stream's name and the device
    sequence    varint   per-device batch sequence number, 0 .. 2**64-1
    count       varint   readings in the batch, 1 .. 65535
    base time   varint   first timestamp, milliseconds since the Unix epoch, < 2**48
    period      varint   periodic and count > 1: milliseconds between readings
    deltas      varints  irregular: count - 1 non-negative differences in milliseconds
    codes       bytes    count codes of payload_bits bits each, MSB first, zero padding

Varints are unsigned LEB128 in their shortest form. The payload width is not sent: the
fingerprint binds it. Nothing derived from readings other than the codes is in a payload.

Decoding checks everything and raises :class:`WireError` with a machine-readable
``reason`` (one of :data:`REASONS`); it never returns a batch that differs from what was
encoded and never raises anything else.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Final, Protocol, get_args

import numpy as np
import numpy.typing as npt

from zeal.errors import WireError, WireReason

__all__ = [
    "FINGERPRINT_BYTES",
    "MAX_COUNT",
    "MAX_PAYLOAD_BYTES",
    "REASONS",
    "VERSION",
    "Batch",
    "CodecParams",
    "WireError",
    "WireParams",
    "decode_batch",
    "encode_batch",
    "wire_fingerprint",
]

VERSION: Final = 2
FINGERPRINT_BYTES: Final = 4
MAX_COUNT: Final = 65535
MAX_TIMESTAMP: Final = 1 << 48
MAX_PAYLOAD_BYTES: Final = 1 << 20
_IRREGULAR: Final = 0x01

#: Every reason a payload can be refused for, in the order the decoder checks.
REASONS: Final = get_args(WireReason)


class WireParams(Protocol):
    """What the codec needs of a stream: a Zeal instance provides it."""

    @property
    def fingerprint(self) -> bytes: ...
    @property
    def payload_bits(self) -> int: ...
    @property
    def code_min(self) -> int: ...
    @property
    def code_max(self) -> int: ...


@dataclass(frozen=True)
class CodecParams:
    """Stand-alone codec parameters (any width 1..64), e.g. for tests and tools."""

    fingerprint: bytes
    payload_bits: int
    code_min: int = 0
    code_max: int = -1  # -1: all codes of the width

    def __post_init__(self) -> None:
        if not 1 <= self.payload_bits <= 64:
            raise ValueError(f"payload_bits must be in [1, 64], got {self.payload_bits}")
        if self.code_max == -1:
            object.__setattr__(self, "code_max", (1 << self.payload_bits) - 1)
        if len(self.fingerprint) < FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint needs at least {FINGERPRINT_BYTES} bytes")


@dataclass(frozen=True, eq=False)
class Batch:
    """A decoded batch: fingerprint (wire bytes), sequence, timestamps (ms), codes."""

    fingerprint: bytes
    sequence: int
    timestamps: npt.NDArray[np.int64]
    codes: npt.NDArray[np.uint64]

    def __post_init__(self) -> None:
        for name in ("timestamps", "codes"):
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return int(self.codes.size)

    @property
    def periodic(self) -> bool:
        """Whether the timestamps are evenly spaced (encoded with one period)."""
        return _period(self.timestamps) is not None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Batch)
            and self.fingerprint == other.fingerprint
            and self.sequence == other.sequence
            and np.array_equal(self.timestamps, other.timestamps)
            and np.array_equal(self.codes, other.codes)
        )

    __hash__ = None  # type: ignore[assignment]


def wire_fingerprint(params: WireParams, stream: str, device: str) -> bytes:
    """The 4 fingerprint bytes of a payload from `device` on stream `stream` (of `params`).

    Binding the stream's name and the device makes a payload valid only on its own topic: a
    batch replayed under another device's name, or on another stream with the same
    parameters, fails with ``fingerprint_mismatch`` (wire v1 bound only the device).
    """
    return _wire_fingerprint(params.fingerprint, stream, device)


@functools.lru_cache(maxsize=1 << 16)  # a collector decodes the same devices' batches over again
def _wire_fingerprint(fingerprint: bytes, stream: str, device: str) -> bytes:
    digest = hashlib.sha256(fingerprint + b"/" + stream.encode() + b"/" + device.encode())
    return digest.digest()[:FINGERPRINT_BYTES]


def _period(timestamps: npt.NDArray[np.int64]) -> int | None:
    if timestamps.size < 2:
        return 0
    steps = np.diff(timestamps)
    return int(steps[0]) if bool(np.all(steps == steps[0])) else None


# -- varints ----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class _Reader:
    def __init__(self, data: bytes, position: int) -> None:
        self.data, self.position = data, position

    def varint(self, what: str) -> int:
        value = shift = 0
        for i in range(10):
            if self.position >= len(self.data):
                raise WireError("truncated", f"payload ends inside the {what}")
            byte = self.data[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if i and byte == 0:
                    raise WireError("bad_varint", f"the {what} is not in its shortest form")
                if value >= 1 << 64:
                    raise WireError("bad_varint", f"the {what} exceeds 64 bits")
                return value
        raise WireError("bad_varint", f"the {what} is longer than 10 bytes")


# -- bit packing ----------------------------------------------------------------------------


def _pack(codes: npt.NDArray[np.uint64], bits: int) -> bytes:
    shifted = (codes << np.uint64(64 - bits)).astype(">u8")
    planes = np.unpackbits(shifted.view(np.uint8)).reshape(codes.size, 64)[:, :bits]
    return np.packbits(planes.ravel()).tobytes()


def _unpack(data: bytes, count: int, bits: int) -> npt.NDArray[np.uint64]:
    if count == 1:  # one reading: an integer shift, not bit planes
        value = int.from_bytes(data, "big")
        spare = 8 * len(data) - bits
        if value & ((1 << spare) - 1):
            raise WireError("bad_padding", "padding bits after the last code are not zero")
        return np.array([value >> spare], dtype=np.uint64)
    planes = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if planes[count * bits :].any():
        raise WireError("bad_padding", "padding bits after the last code are not zero")
    full = np.zeros((count, 64), dtype=np.uint8)
    full[:, 64 - bits :] = planes[: count * bits].reshape(count, bits)
    codes: npt.NDArray[np.uint64] = np.packbits(full, axis=1).view(">u8").astype(np.uint64).ravel()
    return codes


# -- encode / decode --------------------------------------------------------------------


def encode_batch(
    params: WireParams,
    *,
    stream: str,
    device: str,
    sequence: int,
    timestamps: npt.ArrayLike,
    codes: npt.ArrayLike,
) -> bytes:
    """Encode one batch; evenly spaced timestamps use the periodic form.

    Raises WireError (reason ``bad_count``, ``bad_timestamp``, ``bad_code`` or
    ``bad_varint`` for the sequence) when the batch cannot be encoded.
    """
    if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence < 1 << 64:
        raise WireError(
            "bad_varint", f"sequence must be an integer in [0, 2**64), got {sequence!r}"
        )
    stamps = np.asarray(timestamps)
    values = np.asarray(codes)
    if stamps.ndim != 1 or values.ndim != 1 or stamps.size != values.size:
        raise WireError("bad_count", "timestamps and codes must be 1-D and of equal length")
    if not 1 <= values.size <= MAX_COUNT:
        raise WireError("bad_count", f"a batch holds 1 to {MAX_COUNT} readings, got {values.size}")
    if stamps.dtype.kind not in "iu" or values.dtype.kind not in "iu":
        raise WireError("bad_count", "timestamps and codes must be integers")
    if int(stamps.min()) < 0 or int(stamps.max()) >= MAX_TIMESTAMP:
        raise WireError("bad_timestamp", f"timestamps must be in [0, 2**48) ms, got {stamps}")
    stamps = stamps.astype(np.int64)
    if stamps.size > 1 and bool(np.any(np.diff(stamps) < 0)):
        raise WireError("bad_timestamp", "timestamps must not decrease within a batch")
    if int(values.min()) < params.code_min or int(values.max()) > params.code_max:
        raise WireError(
            "bad_code", f"codes must be in [{params.code_min}, {params.code_max}] for this stream"
        )
    period = _period(stamps)
    head = bytearray([VERSION << 4 | (0 if period is not None else _IRREGULAR)])
    head += wire_fingerprint(params, stream, device)
    head += _varint(sequence) + _varint(int(values.size)) + _varint(int(stamps[0]))
    if period is None:
        head += b"".join(_varint(int(d)) for d in np.diff(stamps))
    elif stamps.size > 1:
        head += _varint(period)
    return bytes(head) + _pack(values.astype(np.uint64), params.payload_bits)


def decode_batch(payload: bytes, params: WireParams, *, stream: str, device: str) -> Batch:
    """Decode and validate a payload from `device` on `stream` against its parameters."""
    data = _payload_bytes(payload, MAX_PAYLOAD_BYTES)
    version, flags = data[0] >> 4, data[0] & 0x0F
    if version != VERSION:
        older = (
            " (an agent from before stream names were bound: upgrade it)" if version == 1 else ""
        )
        raise WireError(
            "bad_version", f"version {version} is not supported (expected {VERSION}){older}"
        )
    if flags & ~_IRREGULAR:
        raise WireError("bad_flags", f"reserved flag bits are set: {flags:#x}")
    if len(data) < 1 + FINGERPRINT_BYTES:
        raise WireError("truncated", "payload ends inside the fingerprint")
    fingerprint = data[1 : 1 + FINGERPRINT_BYTES]
    expected = wire_fingerprint(params, stream, device)
    if fingerprint != expected:
        raise WireError(
            "fingerprint_mismatch",
            f"payload fingerprint {fingerprint.hex()} is not {expected.hex()} of stream "
            f"{stream!r} and device {device!r} (stale parameters, or a payload of another "
            "device or stream)",
        )
    reader = _Reader(data, 1 + FINGERPRINT_BYTES)
    sequence = reader.varint("sequence number")
    count = reader.varint("count")
    if not 1 <= count <= MAX_COUNT:
        raise WireError("bad_count", f"count {count} is outside [1, {MAX_COUNT}]")
    base = reader.varint("base time")
    if flags & _IRREGULAR:
        steps = [reader.varint("timestamp delta") for _ in range(count - 1)]
        stamps = np.cumsum([base, *steps], dtype=object)
        last = int(stamps[-1])
    else:
        period = reader.varint("period") if count > 1 else 0
        last = base + period * (count - 1)
        stamps = None
    if last >= MAX_TIMESTAMP:
        raise WireError("bad_timestamp", f"timestamp {last} ms is beyond 2**48 ms")
    timestamps = (
        np.array(stamps, dtype=np.int64)
        if stamps is not None
        else base + period * np.arange(count, dtype=np.int64)
    )
    return Batch(fingerprint, sequence, timestamps, _codes(data[reader.position :], count, params))


def _payload_bytes(payload: object, limit: int) -> bytes:
    """A payload's bytes, refused when there are none or more than `limit`."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise WireError("empty", f"payload must be bytes, got {type(payload).__name__}")
    data = bytes(payload)
    if not data:
        raise WireError("empty", "payload is empty")
    if len(data) > limit:
        raise WireError("too_large", f"payload of {len(data)} bytes exceeds {limit}")
    return data


def _codes(data: bytes, count: int, params: WireParams) -> npt.NDArray[np.uint64]:
    """The codes section that ends a payload: exactly its bytes, zero padding, in range."""
    bits = params.payload_bits
    code_bytes = (count * bits + 7) // 8
    if len(data) < code_bytes:
        raise WireError(
            "truncated", f"{count} codes of {bits} bits need {code_bytes} bytes, got {len(data)}"
        )
    if len(data) > code_bytes:
        raise WireError("trailing_bytes", f"{len(data) - code_bytes} bytes after the last code")
    codes = _unpack(data, count, bits)
    if int(codes.min()) < params.code_min or int(codes.max()) > params.code_max:
        bad = int(codes.min()) if int(codes.min()) < params.code_min else int(codes.max())
        raise WireError("bad_code", f"code {bad} is outside [{params.code_min}, {params.code_max}]")
    return codes
