"""What devices, collectors and the API agree on besides the bytes: names, limits, reasons.

The topic layout lives in :mod:`zeal.mqtt.topics` and the payload layout in :mod:`zeal.wire`;
this module holds the rest of the contract, each rule written once:

- **names**: stream and device names are single MQTT topic levels (:func:`check_name`);
- **parameter limits**: what a stream's parameters may be (the mechanism checks them, the
  server's API schemas and settings import the same numbers);
- **reject reasons**: the closed catalogue of why a message is refused, the wire decoder's
  reasons (:data:`zeal.wire.REASONS`) and the collector's. A reason outside it is a bug:
  the collector refuses to record one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from zeal.errors import ParameterError
from zeal.wire import REASONS as WIRE_REASONS

__all__ = [
    "BUCKET_SECONDS",
    "COLLECTOR_REASONS",
    "EPSILON_CEILING",
    "EPSILON_MAX",
    "EXPONENT",
    "GRID_POINTS",
    "MAX_SEQUENCE",
    "MAX_SEQUENCE_JUMP",
    "MEMO_PAYLOAD_BITS",
    "NAME_MAX_LENGTH",
    "NAME_PATTERN",
    "PAYLOAD_BITS",
    "REJECT_REASONS",
    "check_grid_points",
    "check_name",
]

NAME_MAX_LENGTH: Final = 64
#: Stream and device names are single MQTT topic levels: no wildcards, no separators.
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

#: Largest privacy budget per reading a stream may declare (epsilon is in (0, EPSILON_MAX]).
EPSILON_MAX: Final = 20.0
#: The deployments' ceiling on the privacy loss per reading: a server creates no stream
#: above it, and an agent refuses a configuration above it unless raised (--max-epsilon).
#: One number on both sides, so that what a server creates a default agent accepts.
EPSILON_CEILING: Final = 5.0
#: Inclusive bounds of a stream's payload width in bits (the library's; a server may allow
#: fewer, see ``zeal_server.store.streams.MAX_SERVER_BITS``).
PAYLOAD_BITS: Final = (2, 52)
#: Inclusive bounds of the binade exponent E_U* a stream may name (float64's own range).
EXPONENT: Final = (-1000, 1022)
#: Inclusive bounds of a stream's time aggregation bucket, in seconds (one second to a day).
#: A longitudinal stream's grid (zeal.longitudinal): from its two ends to 1,024 values, so a
#: device's memo table stays within 2 KiB (two bytes a value, edge/firmware).
GRID_POINTS: Final = (2, 1024)
#: Its codes must fit the firmware's two-byte memo entries, 0xFFFF meaning "not drawn".
MEMO_PAYLOAD_BITS: Final = 16
BUCKET_SECONDS: Final = (1, 86_400)
#: The highest batch sequence number a device uses: an agent's outbox keeps it in SQLite's
#: signed 64-bit INTEGER (the wire's varint carries up to 2**64 - 1, which the collector
#: reads but never tells a device to continue from).
MAX_SEQUENCE: Final = (1 << 63) - 1
#: How far above the highest sequence a device has stored its next batch may be and still
#: count as continuing it (the sequences between counted missing): 65,536 batches, 45 days
#: of a LoRaWAN frame a minute. A batch further up is a *jump* (zeal_server.store.sequences):
#: stored, counted as a sequence reset, and not taken as the device's position.
MAX_SEQUENCE_JUMP: Final = 1 << 16

_WIRE_MEANINGS: Final = {
    "empty": "the payload is empty",
    "too_large": "the payload is over 1 MiB",
    "bad_version": "the payload's wire format version is not one this server reads",
    "bad_flags": "the payload sets flags this version does not define",
    "truncated": "the payload ends before its header or body does",
    "fingerprint_mismatch": "the batch was encoded for other stream parameters, another "
    "stream or another device",
    "bad_varint": "a variable-length integer in the payload is malformed",
    "bad_count": "the batch's reading count is zero or over 65,535",
    "bad_timestamp": "a timestamp is negative, beyond 2**48 ms, or decreasing",
    "bad_padding": "the last code byte has nonzero padding bits",
    "bad_code": "a code is outside the stream's code range",
    "trailing_bytes": "bytes follow the last code",
}

#: Reasons the collector adds to the wire's: at the door (before decoding) and at the writer.
COLLECTOR_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "bad_topic": "the topic is not a data topic (zeal.mqtt.topics) with valid names",
        "retained": "the message was retained on a data topic",
        "rate_limited": "the device used up its reject budget; shed without decoding",
        "unknown_stream": "the topic names a stream this server does not have",
        "not_enrolled": "the stream accepts enrolled devices only, and this one is not",
        "too_many_buckets": "the batch spans more buckets than ZEAL_MAX_BUCKETS_PER_BATCH",
        "future_timestamp": "a reading is stamped beyond arrival + ZEAL_MAX_FUTURE_SECONDS",
        "too_old": "a reading is stamped before arrival - ZEAL_MAX_AGE_SECONDS",
        "before_stream": "a reading is stamped before the stream was created "
        "(less ZEAL_BACKFILL_SECONDS)",
        "over_budget": "the batch would take its device past the stream's privacy policy "
        "(max_epsilon_per_day: readings per UTC day of their timestamps)",
        "device_cap": "the batch would take its device past its daily cap across all its "
        "streams (ZEAL_DEVICE_MAX_EPSILON_PER_DAY, or the device's or a tag's own cap)",
        "bad_event": "a message on ChirpStack's uplink topic is not an uplink event Zeal "
        "reads (not an UplinkEvent in JSON or protobuf, or without its time)",
        "bad_device_name": "a LoRaWAN device's ChirpStack name is not a valid Zeal device name "
        "(its binding names devices by device_name)",
        "transport_mismatch": "the device name belongs to a device that sends another way on "
        "this stream (an MQTT device named like a LoRaWAN DevEUI or ChirpStack name, or the "
        "other way round): refused, never merged into it",
        "undecodable": "reading the message raised an error the server did not expect (a "
        "server bug, logged with its traceback); the message is counted and acknowledged, "
        "and ingest goes on",
    }
)

#: Every reason a message can be rejected for, with what it means (wire reasons first).
REJECT_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {**{reason: _WIRE_MEANINGS[reason] for reason in WIRE_REASONS}, **COLLECTOR_REASONS}
)


def check_name(kind: str, name: object) -> str:
    """Validate a stream or device name (1-64 of A-Z a-z 0-9 _ . -, not starting with . _ -)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ParameterError(
            f"{kind} name {name!r} is invalid: use 1 to {NAME_MAX_LENGTH} letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        )
    return name


def check_grid_points(grid_points: object, payload_bits: int) -> int | None:
    """A longitudinal stream's number of grid values (None: a plain stream), checked
    against GRID_POINTS and the code width its memo entries hold."""
    if grid_points is None:
        return None
    low, high = GRID_POINTS
    if isinstance(grid_points, bool) or not isinstance(grid_points, int):
        raise ParameterError(
            f"grid_points must be an integer in [{low}, {high}], got {grid_points!r}"
        )
    if not low <= grid_points <= high:
        raise ParameterError(f"grid_points={grid_points} is outside [{low}, {high}]")
    if payload_bits > MEMO_PAYLOAD_BITS:
        raise ParameterError(
            f"a longitudinal stream's codes are at most {MEMO_PAYLOAD_BITS} bits "
            f"(this one's are {payload_bits}): choose a narrower payload_bits"
        )
    return int(grid_points)
