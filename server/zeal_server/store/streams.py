"""Streams in the database: create, find, configure, delete; the installation id and the
rejects table (devices: zeal_server.store.fleet). Repository functions: the caller owns the
session and the transaction.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    delete,
    func,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from zeal import (
    ParameterError,
    Zeal,
    ZealWarning,
)
from zeal.mqtt.streamconfig import config_document, tombstone_document
from zeal.policy import DEFAULT_MAX_EPSILON_PER_DAY
from zeal.protocol import BUCKET_SECONDS, EPSILON_CEILING, check_name
from zeal.signed import CONFIG_PURPOSE, ENDORSEMENTS
from zeal_server.errors import StoreError
from zeal_server.store.models import (
    Device,
    DevicePeriod,
    DeviceTag,
    Installation,
    LoRaWANBinding,
    Reject,
    Segment,
    Stream,
)
from zeal_server.store.signing import endorsements, signer

#: Widest codes the store accepts (the limb layout's no-overflow guarantee).
MAX_SERVER_BITS = 28


def now_ms() -> int:
    return int(time.time() * 1000)


def next_revision(stream: Stream) -> int:
    """The revision of a change of the stream's configuration made now: its time in ms, or
    the previous revision + 1 if that is not later (a clock set back, two changes in one
    ms), so it always grows, across a restore from a backup too (zeal.mqtt.streamconfig)."""
    return max(now_ms(), (stream.revision or 0) + 1)


def params_of(stream: Stream) -> Zeal:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        return Zeal(
            lower=stream.lower,
            upper=stream.upper,
            epsilon=stream.epsilon,
            exponent=stream.exponent,
            sampler=stream.sampler,
            max_epsilon_per_day=stream.max_epsilon_per_day,
            grid_points=stream.grid_points,
        )


def insert_for(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def derive_params(
    lower: float,
    upper: float,
    epsilon: float,
    payload_bits: int | None = None,
    *,
    exponent: int | None = None,
    max_epsilon_per_day: float | None = DEFAULT_MAX_EPSILON_PER_DAY,
    grid_points: int | None = None,
) -> Zeal:
    """The mechanism a stream with these parameters gets; StoreError names what is wrong."""
    try:
        params = Zeal(
            lower=lower,
            upper=upper,
            epsilon=epsilon,
            payload_bits=payload_bits,
            exponent=exponent,
            max_epsilon_per_day=max_epsilon_per_day,
            grid_points=grid_points,
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
    max_epsilon_per_day: float = DEFAULT_MAX_EPSILON_PER_DAY,
    grid_points: int | None = None,
) -> Stream:
    """Create a stream; its mechanism is fixed for good (a change is a new stream). Its
    retention (set_retention) and its privacy policy (set_policy) may change later."""
    try:
        check_name("stream", name)
    except ParameterError as exc:
        raise StoreError(str(exc)) from exc
    params = derive_params(
        lower,
        upper,
        epsilon,
        payload_bits,
        exponent=exponent,
        max_epsilon_per_day=max_epsilon_per_day,
        grid_points=grid_points,
    )
    loss = max(params.epsilon, params.realized_epsilon or 0.0)
    if loss > EPSILON_CEILING:
        raise StoreError(
            f"epsilon {loss:g} per reading exceeds the ceiling {EPSILON_CEILING:g} "
            "(zeal.protocol.EPSILON_CEILING) that agents refuse to exceed by default"
        )
    least, most = BUCKET_SECONDS
    if isinstance(bucket_seconds, bool) or not least <= bucket_seconds <= most:
        raise StoreError(f"bucket_seconds must be in [{least}, {most}], got {bucket_seconds!r}")
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
        max_epsilon_per_day=params.max_epsilon_per_day,
        grid_points=params.grid_points,
    )
    stream.revision = stream.created_ms
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


def set_policy(session: Session, stream: Stream, max_epsilon_per_day: float) -> Zeal:
    """Change the stream's privacy policy. Its fingerprint changes with it: devices are
    refused (fingerprint_mismatch) until they take the new configuration; what is stored
    stays as it is (the mechanism is the same)."""
    params = derive_params(
        stream.lower,
        stream.upper,
        stream.epsilon,
        exponent=stream.exponent,
        max_epsilon_per_day=max_epsilon_per_day,
        grid_points=stream.grid_points,
    )
    stream.max_epsilon_per_day = params.max_epsilon_per_day
    stream.fingerprint = params.fingerprint.hex()
    stream.revision = next_revision(stream)
    session.flush()
    return params


def check_unit(unit: object) -> str:
    """A unit is short printable text without markup characters, e.g. degF, kWh, mg/dL."""
    if not isinstance(unit, str) or len(unit) > 32 or not all(c.isprintable() for c in unit):
        raise StoreError(f"unit must be at most 32 printable characters (e.g. degF), got {unit!r}")
    if any(c in unit for c in "<>&\"'"):
        raise StoreError(f"unit must not contain < > & or quotes, got {unit!r}")
    return unit


def delete_stream(session: Session, stream: Stream) -> int:
    """Delete a stream with everything stored for it; returns how many readings it held.

    The stream row is locked first: a collector storing for it holds it share-locked (the
    dedup horizon, ingest), so the two take their locks in one order."""
    session.execute(select(Stream.id).where(Stream.id == stream.id).with_for_update())
    readings = int(
        session.scalar(
            select(func.coalesce(func.sum(Segment.n), 0)).where(Segment.stream_id == stream.id)
        )
        or 0
    )
    devices = select(Device.id).where(Device.stream_id == stream.id).scalar_subquery()
    session.execute(delete(DeviceTag).where(DeviceTag.device_id.in_(devices)))
    session.execute(delete(DevicePeriod).where(DevicePeriod.device_id.in_(devices)))
    session.execute(delete(Segment).where(Segment.stream_id == stream.id))
    session.execute(delete(Device).where(Device.stream_id == stream.id))
    session.execute(delete(Reject).where(Reject.stream == stream.name))
    session.execute(delete(LoRaWANBinding).where(LoRaWANBinding.stream_id == stream.id))
    session.execute(delete(Stream).where(Stream.id == stream.id))
    return readings


def installation_id(session: Session) -> str:
    """This database's id (see models.Installation)."""
    value = session.scalar(select(Installation.id))
    if value is None:
        raise StoreError("the database has no installation id: run `zeal-server migrate`")
    return str(value)


def config_of(session: Session, stream: Stream, server: str | None = None) -> dict[str, Any]:
    """The stream's configuration document, naming this server, the creation time and any
    release, signed with the installation's key (store.signing)."""
    document = config_document(
        stream.name,
        params_of(stream),
        server=server or installation_id(session),
        created_ms=stream.created_ms,
        unit=stream.unit,
        released_ms=stream.released_ms,
        revision=stream.revision,
    )
    return _signed(session, document)


def _signed(session: Session, document: dict[str, Any]) -> dict[str, Any]:
    """A configuration or tombstone signed with the installation's key, with the chain of
    endorsements that leads to it when the key was rotated (store.signing)."""
    chain = endorsements(session)
    if chain:
        document = {**document, ENDORSEMENTS: chain}
    return signer(session).sign(document, CONFIG_PURPOSE)


def tombstone_of(session: Session, name: str, created_ms: int) -> dict[str, Any]:
    """The signed tombstone of stream `name` created at `created_ms`, deleted now."""
    document = tombstone_document(
        name, server=installation_id(session), created_ms=created_ms, deleted_ms=now_ms()
    )
    return _signed(session, document)


def release_stream(session: Session, stream: Stream) -> int:
    """Release the agents halted on the stream (it deleted or created anew under them,
    their policy ceiling passed): its configuration says so from now on, signed, and they
    adopt it. Returns the release time (ms)."""
    stream.released_ms = now_ms()
    stream.revision = next_revision(stream)
    session.flush()
    return stream.released_ms


def stream_by_name(session: Session, name: str) -> Stream | None:
    return session.scalar(select(Stream).where(Stream.name == name))


def list_streams(session: Session) -> list[Stream]:
    return list(session.scalars(select(Stream).order_by(Stream.name)))


def rejects(session: Session, stream: str | None = None) -> dict[str, int]:
    query = select(Reject.reason, func.sum(Reject.count)).group_by(Reject.reason)
    if stream is not None:
        query = query.where(Reject.stream == stream)
    return {str(r): int(c) for r, c in session.execute(query)}


def device_rejects(session: Session, stream: str, devices: list[str]) -> dict[str, dict[str, int]]:
    """Rejects of each of `devices` on `stream`, by reason (devices without any left out)."""
    query = select(Reject.device, Reject.reason, Reject.count).where(
        Reject.stream == stream, Reject.device.in_(devices)
    )
    found: dict[str, dict[str, int]] = {}
    for device, reason, count in session.execute(query):
        found.setdefault(device, {})[reason] = int(count)
    return found


@dataclass(frozen=True)
class Sender:
    """A name rejected messages were published under, on one stream: how many, when last,
    by reason, and whether it is a device of the stream (one that stored readings)."""

    device: str
    messages: int
    last_ms: int
    reasons: dict[str, int]
    known: bool


def rejected_senders(session: Session, stream: str, limit: int) -> tuple[list[Sender], int, int]:
    """The `limit` names with the most rejected messages on `stream` (the latest first among
    equals), and how many other names there are and what they sent, summed. The rejects
    table is bounded per stream whatever names clients invent (ingest.rejectkeys: beyond its
    pool, names count under "*"), and so is this answer."""
    totals = (
        select(Reject.device, func.sum(Reject.count), func.max(Reject.last_ms))
        .where(Reject.stream == stream)
        .group_by(Reject.device)
    )
    top = session.execute(
        totals.order_by(func.sum(Reject.count).desc(), func.max(Reject.last_ms).desc())
        .order_by(Reject.device)
        .limit(limit)
    ).all()
    names = [str(d) for d, _, _ in top]
    reasons: dict[str, dict[str, int]] = {}
    for device, reason, count in session.execute(
        select(Reject.device, Reject.reason, Reject.count).where(
            Reject.stream == stream, Reject.device.in_(names)
        )
    ):
        reasons.setdefault(str(device), {})[str(reason)] = int(count)
    known = set(
        session.scalars(
            select(Device.name)
            .join(Stream, Stream.id == Device.stream_id)
            .where(Stream.name == stream, Device.name.in_(names))
        )
    )
    everyone = session.execute(
        select(
            func.count(func.distinct(Reject.device)), func.coalesce(func.sum(Reject.count), 0)
        ).where(Reject.stream == stream)
    ).one()
    senders = [
        Sender(str(d), int(n), int(last), dict(sorted(reasons.get(str(d), {}).items())), d in known)
        for d, n, last in top
    ]
    others = int(everyone[0]) - len(senders)
    return senders, others, int(everyone[1]) - sum(s.messages for s in senders)


def name_problem(kind: str, name: str) -> str | None:
    """Why NATS cannot carry `name` as a stream or device name (None: it can)."""
    if "." in name:
        return (
            f"{kind} names cannot contain '.' on a NATS deployment (ZEAL_NATS_URL is set): "
            f"NATS maps the MQTT topic to a subject whose tokens '.' separates; got {name!r}"
        )
    return None
