"""A stream's devices in the database: rows, enrolment, tags and groups, pages of the device
list, and the totals a stream's figures are made of. Repository functions: the caller owns
the session and the transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Select, delete, func, insert, select, update
from sqlalchemy.orm import Session

from zeal import ParameterError
from zeal.policy import DAY_MS, HOUR_MS
from zeal.protocol import check_name
from zeal_server.errors import StoreError
from zeal_server.store.accounts import ACCOUNT_COLUMNS, accounts
from zeal_server.store.models import Device, DevicePeriod, DeviceTag, Stream
from zeal_server.store.streams import insert_for, now_ms
from zeal_server.store.versions import bump_caps

__all__ = [
    "ACCOUNT_ORDER",
    "DEVICE_ORDER",
    "LORAWAN",
    "MAX_TAGS",
    "MAX_TAG_KEY",
    "MAX_TAG_VALUE",
    "MQTT",
    "StreamTotals",
    "add_devices",
    "check_tags",
    "count_devices",
    "device_by_name",
    "device_ids",
    "device_page",
    "devices_of",
    "enroll",
    "group_devices",
    "groups",
    "new_device_row",
    "set_tags",
    "set_transports",
    "stream_totals",
    "streams_at_a_glance",
]


#: How a device's data arrive (``Device.transport``): MQTT (or JetStream, which devices
#: reach over MQTT too), or LoRaWAN uplinks from ChirpStack.
MQTT, LORAWAN = 0, 1


def new_device_row(
    stream_id: int, name: str, when: int, transport: int | None = None
) -> dict[str, Any]:
    """The columns of a device row that has sent nothing yet."""
    counters = dict.fromkeys(
        ("readings", "batches", "bytes", "duplicates", "sequence_resets", "missing", "late"), 0
    )
    return {
        "stream_id": stream_id,
        "name": name,
        "tags": "{}",
        "first_seen_ms": when,
        "last_seen_ms": when,
        "transport": transport,
        **counters,
    }


def device_ids(
    session: Session, stream_id: int, names: list[str]
) -> dict[str, tuple[int, int | None]]:
    """The ids and transports of those of `names` that are devices of the stream (a query
    per 500)."""
    found: dict[str, tuple[int, int | None]] = {}
    for first in range(0, len(names), 500):
        chosen = names[first : first + 500]
        query = select(Device.name, Device.id, Device.transport).where(
            Device.stream_id == stream_id, Device.name.in_(chosen)
        )
        found.update((name, (device_id, way)) for name, device_id, way in session.execute(query))
    return found


def add_devices(
    session: Session, stream_id: int, first_seen: dict[str, int], transports: dict[str, int]
) -> None:
    """Create the devices named in `first_seen` (first seen at the times it gives, by the
    transports `transports` gives) that do not exist yet, in name order: every collector
    locks new rows in one order."""
    session.execute(
        insert_for(session)(Device).on_conflict_do_nothing(),
        [
            new_device_row(stream_id, n, first_seen[n], transports.get(n))
            for n in sorted(first_seen)
        ],
    )


def set_transports(session: Session, transports: dict[int, int]) -> None:
    """Record how devices (by id) send, where it is not known yet (devices from before
    revision 0011, or enrolled before their first message)."""
    for device_id, transport in sorted(transports.items()):
        session.execute(
            update(Device)
            .where(Device.id == device_id, Device.transport.is_(None))
            .values(transport=transport)
        )


def devices_of(session: Session, stream: Stream) -> list[Device]:
    return list(
        session.scalars(select(Device).where(Device.stream_id == stream.id).order_by(Device.name))
    )


#: Tags one device may carry, and their sizes.
MAX_TAGS = 32
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 200


def check_tags(tags: dict[str, str]) -> None:
    """StoreError unless `tags` fits: at most MAX_TAGS, keys 1-64 characters without ':',
    values at most 200 characters."""
    if len(tags) > MAX_TAGS:
        raise StoreError(f"a device carries at most {MAX_TAGS} tags, got {len(tags)}")
    for key, value in tags.items():
        if not (0 < len(key) <= MAX_TAG_KEY and len(value) <= MAX_TAG_VALUE and ":" not in key):
            raise StoreError(
                f"tag {key[:MAX_TAG_KEY]!r}: keys are 1-{MAX_TAG_KEY} characters without ':', "
                f"values at most {MAX_TAG_VALUE}"
            )


def enroll(session: Session, stream: Stream, name: str) -> tuple[Device, bool]:
    """The device `name` of `stream`, created (enrolled) if it is new: (device, created).
    StoreError for an invalid name."""
    try:
        check_name("device", name)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    device = session.scalar(
        select(Device).where(Device.stream_id == stream.id, Device.name == name)
    )
    if device is not None:
        return device, False
    device = Device(**new_device_row(stream.id, name, now_ms()))
    session.add(device)
    session.flush()
    return device, True


def set_tags(session: Session, device: Device, tags: dict[str, str]) -> None:
    """Replace a device's tags (both the JSON column and the rows groups are queried by)."""
    check_tags(tags)
    device.tags = json.dumps(tags, sort_keys=True)
    session.execute(delete(DeviceTag).where(DeviceTag.device_id == device.id))
    if tags:
        session.execute(
            insert(DeviceTag),
            [{"device_id": device.id, "key": k, "value": v} for k, v in tags.items()],
        )
    bump_caps(session)  # a tag's cap may now apply to it, or no longer


def group_devices(session: Session, stream: Stream, group: str) -> Select[Any]:
    """The ids of the devices whose tags match ``key:value``, as a subquery to filter by
    (no list of ids travels to the database, however large the group). StoreError if the
    group is malformed or matches no device."""
    key, sep, value = group.partition(":")
    if not sep or not key:
        raise StoreError(f"group {group!r} must look like key:value (e.g. site:aarhus)")
    tagged = select(DeviceTag.device_id).where(DeviceTag.key == key, DeviceTag.value == value)
    ours = tagged.join(Device, Device.id == DeviceTag.device_id).where(
        Device.stream_id == stream.id
    )
    if session.scalar(ours.limit(1)) is None:
        raise StoreError(f"group {group!r} matches no device of stream {stream.name!r}")
    # A device id belongs to one stream, and every sum also filters on the stream: the
    # members of other streams in `tagged` match nothing, and the join is saved.
    return tagged


def groups(session: Session, stream: Stream) -> dict[str, int]:
    """Every ``key:value`` tag pair of the stream's devices, with how many devices carry it."""
    rows = session.execute(
        select(DeviceTag.key, DeviceTag.value, func.count())
        .join(Device, Device.id == DeviceTag.device_id)
        .where(Device.stream_id == stream.id)
        .group_by(DeviceTag.key, DeviceTag.value)
    )
    return dict(sorted((f"{k}:{v}", int(n)) for k, v, n in rows))


def device_by_name(session: Session, stream: Stream, name: str) -> Device | None:
    return session.scalar(select(Device).where(Device.stream_id == stream.id, Device.name == name))


def count_devices(session: Session, stream: Stream) -> int:
    return (
        session.scalar(
            select(func.count()).select_from(Device).where(Device.stream_id == stream.id)
        )
        or 0
    )


#: The columns the device list can be sorted by (epsilon spent orders as readings: it is
#: readings times the stream's epsilon).
DEVICE_ORDER = {
    "name": Device.name,
    "first_seen": Device.first_seen_ms,
    "last_seen": Device.last_seen_ms,
    "readings": Device.readings,
    "epsilon_spent": Device.readings,
    "missing": Device.missing,
}


#: The device's account across streams the list can be sorted by too (store.accounts).
ACCOUNT_ORDER = {f"account_{c}" for c, _ in ACCOUNT_COLUMNS}


def device_page(
    session: Session,
    stream: Stream,
    *,
    sort: str,
    descending: bool,
    limit: int,
    offset: int,
    today: int = 0,
) -> list[Device]:
    """One page of the stream's devices, ordered by `sort` (a key of DEVICE_ORDER, or of
    ACCOUNT_ORDER: its account across streams up to UTC day `today`), ties by name."""
    query = select(Device).where(Device.stream_id == stream.id)
    if sort in ACCOUNT_ORDER:
        found = accounts(today)
        query = query.outerjoin(found, found.c.name == Device.name)
        column: Any = func.coalesce(found.c[sort.removeprefix("account_")], 0)
    else:
        column = DEVICE_ORDER[sort]
    primary = column.desc() if descending else column.asc()
    return list(session.scalars(query.order_by(primary, Device.name).limit(limit).offset(offset)))


@dataclass(frozen=True)
class StreamTotals:
    """What a stream has received, summed over its devices."""

    readings: int
    messages: int
    received_bytes: int
    devices: int
    active_devices: int  # heard from in the last hour
    last_seen_ms: int | None
    duplicates: int
    sequence_resets: int
    missing: int
    late: int


class Glance(NamedTuple):
    """A stream's figures on /metrics."""

    name: str
    readings: int
    devices: int
    missing: int
    late: int


def streams_at_a_glance(session: Session) -> list[Glance]:
    """Readings received, devices known, batches missing and late of every stream, by name,
    in one statement (/metrics)."""
    total = [func.coalesce(func.sum(c), 0) for c in (Device.readings, Device.missing, Device.late)]
    rows = session.execute(
        select(Stream.name, total[0], func.count(Device.id), *total[1:])
        .outerjoin(Device, Device.stream_id == Stream.id)
        .group_by(Stream.name)
        .order_by(Stream.name)
    ).all()
    return [Glance(str(name), *(int(v) for v in values)) for name, *values in rows]


def last_seen_per_device(session: Session) -> list[tuple[str, str, int]]:
    """(stream name, device name, when its last message arrived, ms) of every device, in one
    statement (/metrics)."""
    rows = session.execute(
        select(Stream.name, Device.name, Device.last_seen_ms)
        .join(Stream, Device.stream_id == Stream.id)
        .order_by(Stream.name, Device.name)
    ).all()
    return [(str(stream), str(device), int(last)) for stream, device, last in rows]


def stream_totals(session: Session, stream: Stream) -> StreamTotals:
    """The stream's devices' counters summed (what was received and stored, whatever
    retention deleted since)."""
    readings, messages, received, last_ms, active, duplicates, resets, missing, late = (
        session.execute(
            select(
                func.coalesce(func.sum(Device.readings), 0),
                func.coalesce(func.sum(Device.batches), 0),
                func.coalesce(func.sum(Device.bytes), 0),
                func.max(Device.last_seen_ms),
                func.count().filter(Device.last_seen_ms >= now_ms() - 3_600_000),
                func.coalesce(func.sum(Device.duplicates), 0),
                func.coalesce(func.sum(Device.sequence_resets), 0),
                func.coalesce(func.sum(Device.missing), 0),
                func.coalesce(func.sum(Device.late), 0),
            ).where(Device.stream_id == stream.id)
        ).one()
    )
    return StreamTotals(
        readings=int(readings),
        messages=int(messages),
        received_bytes=int(received),
        devices=count_devices(session, stream),
        active_devices=int(active or 0),
        last_seen_ms=None if last_ms is None else int(last_ms),
        duplicates=int(duplicates),
        sequence_resets=int(resets),
        missing=int(missing),
        late=int(late),
    )


def readings_on_day(session: Session, device_ids: list[int], day: int) -> dict[int, int]:
    """Readings stored per device (of `device_ids`) stamped in UTC day `day`: the ledger of
    the stream's privacy policy."""
    if not device_ids:
        return {}
    rows = session.execute(
        select(DevicePeriod.device_id, DevicePeriod.readings).where(
            DevicePeriod.device_id.in_(device_ids),
            DevicePeriod.hours == DAY_MS // HOUR_MS,
            DevicePeriod.period == day,
        )
    )
    return {int(d): int(n) for d, n in rows}


def hours_at_cap(session: Session, device_ids: list[int], day: int, cap: int) -> set[int]:
    """The devices (of `device_ids`) with `cap` readings stamped in some UTC hour of day
    `day`: the policy's hourly ledger."""
    if not device_ids:
        return set()
    first = day * (DAY_MS // HOUR_MS)
    rows = session.scalars(
        select(DevicePeriod.device_id).where(
            DevicePeriod.device_id.in_(device_ids),
            DevicePeriod.hours == 1,
            DevicePeriod.period >= first,
            DevicePeriod.period < first + DAY_MS // HOUR_MS,
            DevicePeriod.readings >= cap,
        )
    )
    return {int(d) for d in rows}
