"""Streams, devices and tags in the database: create, find, configure, delete, group;
the rejects table. Repository functions: the caller owns the session and the transaction.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

from sqlalchemy import (
    Select,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from zeal import (
    ParameterError,
    Zeal,
    ZealWarning,
)
from zeal.streamconfig import check_name, config_document
from zeal_server.errors import ServerError
from zeal_server.models import (
    Aggregate,
    BatchSeen,
    BucketTotal,
    Device,
    DeviceTag,
    Installation,
    Reject,
    Segment,
    Stream,
)

#: Widest codes the store accepts (the limb layout's no-overflow guarantee).
MAX_SERVER_BITS = 28


class StoreError(ServerError, ValueError):
    """A request the store cannot satisfy (unknown or duplicate stream, bad parameters)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def params_of(stream: Stream) -> Zeal:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        return Zeal(
            lower=stream.lower,
            upper=stream.upper,
            epsilon=stream.epsilon,
            exponent=stream.exponent,
            sampler=stream.sampler,
        )


def insert_for(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def derive_params(
    lower: float,
    upper: float,
    epsilon: float,
    payload_bits: int | None = None,
    exponent: int | None = None,
) -> Zeal:
    """The mechanism a stream with these parameters gets; StoreError names what is wrong."""
    try:
        params = Zeal(
            lower=lower, upper=upper, epsilon=epsilon, payload_bits=payload_bits, exponent=exponent
        )
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    if params.payload_bits > MAX_SERVER_BITS:
        raise StoreError(
            f"payload_bits={params.payload_bits} exceeds the store's limit of {MAX_SERVER_BITS}"
        )
    return params


def create_stream(
    session: Session,
    *,
    name: str,
    lower: float,
    upper: float,
    epsilon: float,
    payload_bits: int | None = None,
    exponent: int | None = None,
    bucket_seconds: int = 60,
    description: str = "",
    unit: str = "",
    enrolled_only: bool = False,
    retention_days: int | None = None,
) -> Stream:
    """Create a stream; its parameters are fixed for good (a change is a new stream). Its
    retention (not a privacy parameter) may change later (set_retention)."""
    try:
        check_name("stream", name)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    params = derive_params(lower, upper, epsilon, payload_bits, exponent)
    if isinstance(bucket_seconds, bool) or not 1 <= bucket_seconds <= 86400:
        raise StoreError(f"bucket_seconds must be in [1, 86400], got {bucket_seconds!r}")
    check_unit(unit)
    check_retention(retention_days)
    if session.scalar(select(Stream.id).where(Stream.name == name)) is not None:
        raise StoreError(
            f"stream {name!r} already exists; its parameters cannot change "
            "(create a new stream for new parameters)"
        )
    stream = Stream(
        name=name,
        lower=params.lower,
        upper=params.upper,
        epsilon=params.epsilon,
        exponent=params.exponent,
        payload_bits=params.payload_bits,
        sampler=params.sampler,
        fingerprint=params.fingerprint.hex(),
        bucket_seconds=bucket_seconds,
        description=description,
        unit=unit,
        created_ms=now_ms(),
        enrolled_only=bool(enrolled_only),
        retention_days=retention_days,
    )
    session.add(stream)
    session.flush()
    return stream


def check_retention(days: object) -> int | None:
    """Validate a retention: None (keep everything) or whole days, 1 to 36,500."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 36_500:
        raise StoreError(f"retention_days must be 1 to 36500 whole days or none, got {days!r}")
    return days


def set_retention(session: Session, stream: Stream, days: int | None) -> None:
    """Change how long the stream's buckets are kept (the collector applies it within a
    minute; what is older is then deleted for good)."""
    stream.retention_days = check_retention(days)
    session.flush()


def check_unit(unit: object) -> str:
    """A unit is short printable text without markup characters, e.g. degF, kWh, mg/dL."""
    if not isinstance(unit, str) or len(unit) > 32 or not all(c.isprintable() for c in unit):
        raise StoreError(f"unit must be at most 32 printable characters (e.g. degF), got {unit!r}")
    if any(c in unit for c in "<>&\"'"):
        raise StoreError(f"unit must not contain < > & or quotes, got {unit!r}")
    return unit


def delete_stream(session: Session, stream: Stream) -> int:
    """Delete a stream with everything stored for it; returns how many readings it held."""
    readings = int(
        session.scalar(
            select(func.coalesce(func.sum(BucketTotal.n), 0)).where(
                BucketTotal.stream_id == stream.id
            )
        )
        or 0
    )
    devices = select(Device.id).where(Device.stream_id == stream.id).scalar_subquery()
    session.execute(delete(BatchSeen).where(BatchSeen.device_id.in_(devices)))
    session.execute(delete(DeviceTag).where(DeviceTag.device_id.in_(devices)))
    for table in (Aggregate, BucketTotal, Segment):
        session.execute(delete(table).where(table.stream_id == stream.id))
    session.execute(delete(Device).where(Device.stream_id == stream.id))
    session.execute(delete(Reject).where(Reject.stream == stream.name))
    session.execute(delete(Stream).where(Stream.id == stream.id))
    return readings


def installation_id(session: Session) -> str:
    """This database's id (see models.Installation)."""
    value = session.scalar(select(Installation.id))
    if value is None:
        raise StoreError("the database has no installation id: run `zeal-server migrate`")
    return str(value)


def config_of(session: Session, stream: Stream, server: str | None = None) -> dict[str, Any]:
    """The stream's configuration document, naming this server and the creation time."""
    return config_document(
        stream.name,
        params_of(stream),
        server=server or installation_id(session),
        created_ms=stream.created_ms,
        unit=stream.unit,
    )


def stream_by_name(session: Session, name: str) -> Stream | None:
    return session.scalar(select(Stream).where(Stream.name == name))


def list_streams(session: Session) -> list[Stream]:
    return list(session.scalars(select(Stream).order_by(Stream.name)))


def new_device_row(stream_id: int, name: str, when: int) -> dict[str, Any]:
    """The columns of a device row that has sent nothing yet."""
    counters = dict.fromkeys(("readings", "batches", "bytes", "duplicates", "sequence_resets"), 0)
    return {
        "stream_id": stream_id,
        "name": name,
        "tags": "{}",
        "first_seen_ms": when,
        "last_seen_ms": when,
        **counters,
    }


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


def rejects(session: Session, stream: str | None = None) -> dict[str, int]:
    query = select(Reject.reason, func.sum(Reject.count)).group_by(Reject.reason)
    if stream is not None:
        query = query.where(Reject.stream == stream)
    return {str(r): int(c) for r, c in session.execute(query)}
