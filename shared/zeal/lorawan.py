"""The LoRaWAN wire profile: a batch of codes in as few bytes of FRMPayload as it takes.

On LoRaWAN the network already carries most of what a wire-v2 payload (``zeal.wire``)
spells out, so the profile sends only the rest (``docs/wire-format.md``, "LoRaWAN
profile", has the layout and the test vectors)::

    tag | n     2 bytes  the first 12 bits of the wire fingerprint (stream parameters,
                         stream name, device), then 4 bits n: 0 one reading; 1..14
                         n + 1 readings; 15 the count follows as a varint (16 .. 65535)
    count       varint   only if n == 15
    spacing     varint   only if more than one reading: seconds between readings
    codes       bytes    the codes, payload_bits each, MSB first, zero padding (as v2)

What is not sent, and where it comes from instead:

- the device: the LoRaWAN DevEUI, authenticated by the frame's MIC (the collector maps it
  to a Zeal device name);
- the stream: the FPort (or the application) the uplink arrives on;
- the sequence and redelivery: the frame counter (FCnt) and the network server's
  deduplication of the frames several gateways heard;
- the time: the reception time the network stamps; the last reading is stamped with it
  and each earlier one ``spacing`` seconds before the next.

The tag refuses a payload made with stale or foreign parameters: it holds 12 of the wire
fingerprint's 32 bits, so a device whose parameters are not the stream's passes with
probability 2^-12 (1 in 4,096) per configuration and device, where wire v2's 4 bytes give
2^-32. The tag is fixed for a configuration and device, so such a pass would repeat for
every uplink of that device until its configuration changes.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from zeal.errors import WireError
from zeal.wire import (
    Batch,
    WireParams,
    _codes,
    _pack,
    _payload_bytes,
    _Reader,
    _varint,
    wire_fingerprint,
)

__all__ = [
    "MAX_COUNT",
    "MAX_PAYLOAD_BYTES",
    "MAX_SPACING_SECONDS",
    "TAG_BITS",
    "decode_lorawan",
    "encode_lorawan",
    "lorawan_size",
]

#: Bits of the wire fingerprint sent as the tag: a foreign payload passes with 2^-TAG_BITS.
TAG_BITS: Final = 12
#: The largest FRMPayload any LoRaWAN region allows (242 bytes at the fastest data rates).
MAX_PAYLOAD_BYTES: Final = 242
MAX_COUNT: Final = 65535
#: Seconds between readings at most (a uint32 on the device).
MAX_SPACING_SECONDS: Final = (1 << 32) - 1
_SHORT: Final = 15  # n values 0..14 hold the count; 15 says a varint follows
_MAX_TIMESTAMP: Final = 1 << 48


def _tag(params: WireParams, stream: str, device: str) -> int:
    """The 12-bit tag in the high bits of a 16-bit word (low 4 bits zero)."""
    fingerprint = wire_fingerprint(params, stream, device)
    return (fingerprint[0] << 8 | fingerprint[1]) & 0xFFF0


def lorawan_size(payload_bits: int, count: int, spacing_seconds: int = 0) -> int:
    """Bytes of FRMPayload that `count` readings of `payload_bits` bits take."""
    head = 2 + (len(_varint(count)) if count > _SHORT else 0)
    head += len(_varint(spacing_seconds)) if count > 1 else 0
    return head + (count * payload_bits + 7) // 8


def encode_lorawan(
    params: WireParams,
    *,
    stream: str,
    device: str,
    codes: npt.ArrayLike,
    spacing_seconds: int = 0,
) -> bytes:
    """One uplink's FRMPayload: `codes` of readings `spacing_seconds` apart, the last one
    read just before the uplink. Raises WireError (``bad_count``, ``bad_timestamp`` for
    the spacing, ``bad_code``, ``too_large``) when they cannot be encoded."""
    values = np.asarray(codes)
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise WireError("bad_count", "codes must be a 1-D array of integers")
    count = int(values.size)
    if not 1 <= count <= MAX_COUNT:
        raise WireError("bad_count", f"an uplink holds 1 to {MAX_COUNT} readings, got {count}")
    if isinstance(spacing_seconds, bool) or not isinstance(spacing_seconds, int):
        raise WireError("bad_timestamp", f"spacing must be whole seconds, got {spacing_seconds!r}")
    if not 0 <= spacing_seconds <= MAX_SPACING_SECONDS:
        raise WireError(
            "bad_timestamp",
            f"spacing must be in [0, {MAX_SPACING_SECONDS}] s, got {spacing_seconds}",
        )
    if int(values.min()) < params.code_min or int(values.max()) > params.code_max:
        raise WireError(
            "bad_code", f"codes must be in [{params.code_min}, {params.code_max}] for this stream"
        )
    size = lorawan_size(params.payload_bits, count, spacing_seconds)
    if size > MAX_PAYLOAD_BYTES:
        raise WireError(
            "too_large",
            f"{count} readings take {size} bytes, over LoRaWAN's {MAX_PAYLOAD_BYTES}",
        )
    word = _tag(params, stream, device) | (count - 1 if count <= _SHORT else _SHORT)
    out = bytearray(word.to_bytes(2, "big"))
    if count > _SHORT:
        out += _varint(count)
    if count > 1:
        out += _varint(spacing_seconds)
    return bytes(out) + _pack(values.astype(np.uint64), params.payload_bits)


def decode_lorawan(
    payload: bytes,
    params: WireParams,
    *,
    stream: str,
    device: str,
    frame_counter: int,
    received_ms: int,
) -> Batch:
    """Decode and check an uplink's FRMPayload from `device` on `stream`.

    The batch's sequence is the frame counter, its fingerprint the full wire fingerprint
    the tag matched, and its timestamps end at `received_ms` (ms since the Unix epoch).
    Raises WireError with the reasons of ``zeal.wire.decode_batch`` that apply.
    """
    if isinstance(frame_counter, bool) or not isinstance(frame_counter, int):
        raise TypeError(f"frame_counter must be an integer, got {frame_counter!r}")
    if not 0 <= frame_counter < 1 << 32:
        raise ValueError(f"frame_counter must be in [0, 2**32), got {frame_counter}")
    data = _payload_bytes(payload, MAX_PAYLOAD_BYTES)
    if len(data) < 2:
        raise WireError("truncated", "payload ends inside the tag")
    word = int.from_bytes(data[:2], "big")
    expected = _tag(params, stream, device)
    if word & 0xFFF0 != expected:
        raise WireError(
            "fingerprint_mismatch",
            f"payload tag {word >> 4:03x} is not {expected >> 4:03x} of stream {stream!r} and "
            f"device {device!r} (stale parameters, or a payload of another device or stream)",
        )
    reader = _Reader(data, 2)
    n = word & 0x0F
    count = n + 1
    if n == _SHORT:
        count = reader.varint("count")
        if not _SHORT < count <= MAX_COUNT:  # a shorter count has its own n
            raise WireError(
                "bad_count", f"a varint count must be in [16, {MAX_COUNT}], got {count}"
            )
    spacing = reader.varint("spacing") if count > 1 else 0
    if spacing > MAX_SPACING_SECONDS:
        raise WireError("bad_timestamp", f"spacing {spacing} s exceeds {MAX_SPACING_SECONDS}")
    if not 0 <= received_ms < _MAX_TIMESTAMP:
        raise WireError("bad_timestamp", f"reception time {received_ms} ms is outside [0, 2**48)")
    first = received_ms - (count - 1) * spacing * 1000
    if first < 0:
        raise WireError("bad_timestamp", f"the first reading would be at {first} ms")
    codes = _codes(data[reader.position :], count, params)
    timestamps = first + spacing * 1000 * np.arange(count, dtype=np.int64)
    return Batch(wire_fingerprint(params, stream, device), frame_counter, timestamps, codes)
