"""Device profiles for the firmware library (edge/firmware): everything a sensor needs to
privatize and encode on the chip, as one small checked blob, so the device never computes
exp, log or a hash.

A profile is 104 bytes, little-endian::

    offset size field
     0      2   magic "ZF"
     2      1   version (1)
     3      1   length (104)
     4      1   payload_bits k          5  1  cell_bits F        6  1  frac_bits G
     7      1   reserved (0)
     8      4   code_min               12  4  code_max
    16      8   w_lo                   24  8  w_hi
    32      8   cells                  40  8  band               48  8  top
    56      8   lower (IEEE 754 binary64)                        64  8  upper
    72      8   start_at_upper                                   80  8  slope
    88      8   unit: a reading r on the device stands for r * unit
    96      4   wire fingerprint of this stream and device (zeal.wire.wire_fingerprint)
   100      4   CRC-32 (IEEE 802.3, as zlib.crc32) of bytes 0..99

The integer fields are the exact grid sampler's tables (zeal._core.grid.GridSampler). The five
binary64 values place the band as GridSampler.fixed_starts does; the C library does that
float64 arithmetic in integers, rounding as IEEE 754 does, so a reading's code distribution
is the Python sampler's for the float64 value float(r) * unit, exactly (docs/firmware.md).
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from zeal._core.mechanism import Zeal
from zeal.errors import ParameterError
from zeal.wire import wire_fingerprint

__all__ = ["PROFILE_BYTES", "PROFILE_VERSION", "c_header", "profile_bytes"]

PROFILE_VERSION: Final = 1
PROFILE_BYTES: Final = 104
_LAYOUT: Final = struct.Struct("<2sBBBBBBII5Q5d4s")
#: The widest code the firmware library handles (codes are uint32_t on the device).
MAX_FIRMWARE_BITS: Final = 32


def profile_bytes(params: Zeal, *, stream: str, device: str, unit: float) -> bytes:
    """The device profile of `device` on stream `stream`, whose integer readings r stand
    for r * `unit` (ParameterError for a stream the firmware cannot run: the paper sampler,
    or codes wider than 32 bits; and for a unit outside [2**-64, 2**64])."""
    if not (isinstance(unit, int | float) and 2.0**-64 <= unit <= 2.0**64):
        raise ParameterError(f"the reading unit must be in [2**-64, 2**64], got {unit!r}")
    grid = params.grid_sampler
    if grid is None:
        raise ParameterError(
            "the firmware library runs the exact grid sampler only; this stream uses the "
            f"{params.sampler!r} sampler"
        )
    if params.payload_bits > MAX_FIRMWARE_BITS:
        raise ParameterError(
            f"the firmware library handles codes of up to {MAX_FIRMWARE_BITS} bits; this "
            f"stream has {params.payload_bits}"
        )
    body = _LAYOUT.pack(
        b"ZF",
        PROFILE_VERSION,
        PROFILE_BYTES,
        grid.payload_bits,
        grid.cell_bits,
        grid.frac_bits,
        0,
        params.code_min,
        params.code_max,
        grid.w_lo,
        grid.w_hi,
        grid.cells,
        grid.band,
        grid.top,
        float(params.lower),
        grid.upper,
        grid.start_at_upper,
        grid.slope,
        float(unit),
        wire_fingerprint(params, stream, device),
    )
    return body + struct.pack("<I", zlib.crc32(body))


def c_header(profile: bytes, *, name: str = "zeal_profile_blob") -> str:
    """A C header defining the profile as a const byte array (for flashing with firmware)."""
    rows = [
        "    " + ", ".join(f"0x{b:02x}" for b in profile[i : i + 12]) + ","
        for i in range(0, len(profile), 12)
    ]
    return (
        "/* Zeal device profile (generated; see docs/firmware.md). */\n"
        f"static const unsigned char {name}[{len(profile)}] = {{\n" + "\n".join(rows) + "\n};\n"
    )
