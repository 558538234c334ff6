"""ChirpStack uplink events with each field at the limits of its type, and mutated ones.

:func:`limit_events` walks ``UplinkEvent``'s descriptor (chirpstack-api's schema, so a field
added to it is covered too) and makes, from a storable base event, one event per field and
extreme value: integers at the ends of their type, floats infinite and NaN, strings and
bytes empty, zero-filled and near the collector's 64 KB event limit, enums at values the
schema does not define, repeated fields and maps with thousands of entries, nested
messages present and empty (Timestamps and Durations are messages: their seconds and nanos
reach far outside protobuf's valid range). Each is marshaled as protobuf and, where
protobuf's JSON mapping can print it, as JSON; :data:`JSON_LIMITS` adds what that mapping
refuses to print (times beyond year 9999, numbers out of their range).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
from chirpstack_api.integration import UplinkEvent
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["JSON_LIMITS", "json_limits", "limit_events", "mutated"]

#: The collector sheds an event larger than this at the door (MAX_EVENT, 64 KB): big values
#: stay under it so that they reach the writer.
BIG = 45_000
#: Nested messages are walked this deep (Struct and Value nest each other without end).
DEPTH = 4

_F = FieldDescriptor
_INTS = {
    _F.TYPE_INT32: (-(2**31), -1, 2**31 - 1),
    _F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _F.TYPE_INT64: (-(2**63), -1, 2**62, 2**63 - 1),
    _F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    _F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    _F.TYPE_UINT32: (0, 2**31, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
    _F.TYPE_UINT64: (0, 2**64 - 1),
    _F.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (float("inf"), float("-inf"), float("nan"), -0.0, 3.4e38)
_STRINGS = ("", "\x00", "\U0010ffff" * 1000, "../" * 20, "x" * BIG)
_BYTES = (b"", b"\x00" * 300, b"\xff" * BIG)
#: Entries in a repeated field or a map.
MANY = 2000


def _extremes(field: FieldDescriptor) -> tuple[Any, ...]:
    """A scalar field's extreme values."""
    if field.type in _INTS:
        return _INTS[field.type]
    if field.type in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return _FLOATS
    if field.type == _F.TYPE_BOOL:
        return (True,)
    if field.type == _F.TYPE_STRING:
        return _STRINGS
    if field.type == _F.TYPE_BYTES:
        return _BYTES
    if field.type == _F.TYPE_ENUM:
        defined = tuple(v.number for v in field.enum_type.values)
        return (*defined, max(defined) + 1, 2**31 - 1, -(2**31))
    raise AssertionError(f"no extremes for {field.full_name}")


def _target(event: Message, path: tuple[FieldDescriptor, ...]) -> Message:
    """The message holding the last field of `path` (made present on the way)."""
    message = event
    for field in path[:-1]:
        if _repeated(field):
            container = getattr(message, field.name)
            message = container.add() if not _is_map(field) else container["k"]
        else:
            message = getattr(message, field.name)
        message.SetInParent()
    return message


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated) if hasattr(field, "is_repeated") else field.label == 3


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _set(event: Message, path: tuple[FieldDescriptor, ...], value: Any) -> bool:
    """Set the scalar at `path` (in a repeated field: MANY entries of it; a map's key or
    value: one entry with it); False when protobuf refuses the value for the field's type."""
    field = path[-1]
    try:
        if len(path) >= 2 and _is_map(path[-2]):
            entries = getattr(_target(event, path[:-1]), path[-2].name)
            if field.name == "key":
                entries[value] = "v"
            else:
                entries["k"] = value
            return True
        holder = _target(event, path)
        if _repeated(field):
            getattr(holder, field.name).extend([value] * MANY)
        else:
            setattr(holder, field.name, value)
    except (ValueError, TypeError):
        return False
    return True


def _fields(
    descriptor: Descriptor, path: tuple[FieldDescriptor, ...] = ()
) -> Iterator[tuple[FieldDescriptor, ...]]:
    """Every field path, nested messages down to DEPTH levels; a map's key and value (or,
    when its values are messages, their fields)."""
    for field in descriptor.fields:
        here = (*path, field)
        yield here
        if len(here) >= DEPTH or field.message_type is None:
            continue
        if _is_map(field):
            key, value = (field.message_type.fields_by_name[n] for n in ("key", "value"))
            if value.message_type is None:
                yield (*here, key)
                yield (*here, value)
            else:
                yield from _fields(value.message_type, here)
        else:
            yield from _fields(field.message_type, here)


def _variants(base: UplinkEvent) -> Iterator[tuple[str, UplinkEvent]]:
    for path in _fields(base.DESCRIPTOR):
        name = ".".join(f.name for f in path)
        field = path[-1]
        if field.message_type is not None:
            event = UplinkEvent()
            event.CopyFrom(base)
            holder = _target(event, path)
            if _repeated(field):
                container = getattr(holder, field.name)
                for k in range(MANY):
                    container.add() if not _is_map(field) else container[f"k{k}"]
            else:
                getattr(holder, field.name).SetInParent()
                if not path[:-1]:  # a top-level message, cleared
                    event.ClearField(field.name)
                    yield f"{name}=absent", event
                    event = UplinkEvent()
                    event.CopyFrom(base)
                    getattr(event, field.name).Clear()
                    getattr(event, field.name).SetInParent()
            yield f"{name}=empty", event
            continue
        for value in _extremes(field):
            event = UplinkEvent()
            event.CopyFrom(base)
            if _set(event, path, value):
                yield f"{name}={str(value)[:20]}", event


def limit_events(base: UplinkEvent) -> list[tuple[str, bytes]]:
    """(what it is, body) for every field of `base` at each of its type's limits, in
    protobuf and, where it prints, in JSON."""
    bodies = []
    for name, event in _variants(base):
        bodies.append((f"protobuf {name}", event.SerializeToString()))
        try:
            text = json_format.MessageToJson(event)
        except (ValueError, TypeError, json_format.SerializeToJsonError):
            continue  # an invalid Timestamp or Duration has no JSON form: JSON_LIMITS
        bodies.append((f"json {name}", text.encode()))
    return bodies


#: JSON fields at limits protobuf's JSON printer never writes (set on the base's JSON).
JSON_LIMITS: tuple[tuple[str, Any], ...] = (
    ("time", "0001-01-01T00:00:00Z"),
    ("time", "9999-12-31T23:59:59.999999999Z"),
    ("time", "10000-01-01T00:00:00Z"),
    ("time", "1969-12-31T23:59:59Z"),
    ("time", "1970-01-01T00:00:00+99:99"),
    ("time", 1e400),
    ("time", {"seconds": 2**62}),
    ("fCnt", 2**32),
    ("fCnt", -1),
    ("fCnt", 1.5),
    ("fPort", 2**64),
    ("dr", "NaN"),
    ("data", "!!not base64!!"),
    ("data", "A" * BIG),
    ("deviceInfo", None),
    ("deviceInfo", []),
    ("rxInfo", [{"gwTime": "99999-01-01T00:00:00Z"}]),
    ("rxInfo", [{"timeSinceGpsEpoch": "315576000001s"}]),
    ("txInfo", {"modulation": {"lora": {"codeRate": "CR_UNDEFINED_999"}}}),
    ("object", json.loads("[" * 200 + "]" * 200)),
)


def json_limits(base: UplinkEvent) -> list[tuple[str, bytes]]:
    """The base event in JSON with each of JSON_LIMITS set."""
    document = json.loads(json_format.MessageToJson(base))
    bodies = []
    for key, value in JSON_LIMITS:
        changed = {**document, key: value}
        bodies.append((f"json {key}={str(value)[:20]}", json.dumps(changed).encode()))
    return bodies


def mutated(bodies: list[bytes], count: int, rng: np.random.Generator) -> Iterator[bytes]:
    """`count` copies of `bodies` (in turn), each with 1 to 8 bytes changed, inserted or cut."""
    for i in range(count):
        body = bytearray(bodies[i % len(bodies)])
        for _ in range(int(rng.integers(1, 9))):
            at = int(rng.integers(0, len(body)))
            action = int(rng.integers(0, 3))
            if action == 0:
                body[at] = int(rng.integers(0, 256))
            elif action == 1:
                body.insert(at, int(rng.integers(0, 256)))
            else:
                del body[at]
        yield bytes(body)
