"""Database tables (SQLAlchemy 2.0). Schema changes go through Alembic (``migrations/``).

Exact sums: every segment row keeps the count of its readings and the sums of their codes and
of their squared codes as 24-bit *limbs* (``total = sum(limb_i * 2**(24 i))``), each limb
summed over the row's readings (zeal_server.store.segments.limb_sums), so every column stays below
2**63 for fewer than 2**39 readings, SQL ``SUM`` over any rows cannot overflow on SQLite or
PostgreSQL, and Python recombines the totals exactly. docs/server.md gives the layout and
what each byte of it pays for.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "LIMB_BITS",
    "SQUARE_LIMBS",
    "SUM_LIMBS",
    "Base",
    "CapsVersion",
    "Device",
    "DeviceCertificate",
    "DevicePeriod",
    "DeviceTag",
    "Installation",
    "LoRaWANBinding",
    "Principal",
    "PrincipalDay",
    "Reject",
    "Segment",
    "Stream",
    "TagBudget",
]

#: ``bytes`` by another name: inside ``Device`` the name is its byte counter.
Blob = bytes

LIMB_BITS = 24
SUM_LIMBS = 3
SQUARE_LIMBS = 4


class Base(DeclarativeBase):
    pass


class Stream(Base):
    __tablename__ = "streams"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    lower: Mapped[float] = mapped_column(Float)
    upper: Mapped[float] = mapped_column(Float)
    epsilon: Mapped[float] = mapped_column(Float)
    exponent: Mapped[int] = mapped_column(Integer)
    payload_bits: Mapped[int] = mapped_column(Integer)
    sampler: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str] = mapped_column(String(16))
    bucket_seconds: Mapped[int] = mapped_column(Integer)
    description: Mapped[str] = mapped_column(String(500), default="")
    #: What the readings measure in, e.g. degF or kWh (shown beside every figure).
    unit: Mapped[str] = mapped_column(String(32), default="")
    created_ms: Mapped[int] = mapped_column(BigInteger)
    #: Only devices enrolled beforehand (``PUT .../devices/{device}``) may send: the broker's
    #: ACL lets a device publish to any stream under its own name, this closes a stream.
    enrolled_only: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Whole buckets older than this many days are deleted by the collector's housekeeping
    #: (and readings older than that are refused); None keeps everything.
    retention_days: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    #: The privacy policy (zeal.policy): epsilon one device may spend per UTC day of its
    #: readings' timestamps. None only for streams made before policies existed.
    max_epsilon_per_day: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    #: The dedup horizon: a batch with a reading stamped before this is refused (too_old),
    #: and its devices' gaps behind it are counted missing (zeal_server.store.sequences.prune).
    #: It only moves forward (the import window, then the retention); None before the first prune.
    horizon_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    #: When the operator released the agents halted on this stream (``zeal-server streams
    #: release``): its configuration then says so, signed, and they adopt it. None: never.
    released_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    #: Which change of its configuration this is (zeal.mqtt.streamconfig: agents ignore an
    #: older one): the time of the change in ms, or the previous revision + 1 if that is
    #: not later (store.streams.next_revision). Revision 0014 gave every stream its own.
    revision: Mapped[int] = mapped_column(BigInteger, default=0)
    #: A longitudinal stream's grid values (zeal.longitudinal; revision 0018): its devices
    #: send one memoized code per grid value. None: a plain stream.
    grid_points: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("stream_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stream_id: Mapped[int] = mapped_column(ForeignKey("streams.id"))
    name: Mapped[str] = mapped_column(String(64))
    tags: Mapped[str] = mapped_column(Text, default="{}")
    first_seen_ms: Mapped[int] = mapped_column(BigInteger)
    last_seen_ms: Mapped[int] = mapped_column(BigInteger)
    readings: Mapped[int] = mapped_column(BigInteger, default=0)
    batches: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    #: Batches received again (same sequence, same content) and dropped: a lost PUBACK.
    duplicates: Mapped[int] = mapped_column(BigInteger, default=0)
    #: Batches stored although their sequence number was taken by other content: the
    #: device's outbox was reset (or two agents share its id).
    sequence_resets: Mapped[int] = mapped_column(BigInteger, default=0)
    #: How its data arrive, from its first message on (store.fleet: MQTT 0, LoRaWAN 1; None
    #: for a device not heard from since revision 0011): a message by the other way under
    #: its name is refused (transport_mismatch), never merged into it.
    transport: Mapped[int | None] = mapped_column(SmallInteger, nullable=True, default=None)
    # Its sequence state (zeal_server.store.sequences, revision 0012): what exactly-once
    # needs, in place of a row per batch. Sequences as signed 64-bit integers.
    #: Every sequence below it is settled (stored, or counted missing); None: none yet.
    seq_floor: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    #: The highest sequence stored.
    seq_head: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    #: Bitmap of the sequences stored above the floor (little-endian; None: empty).
    seq_bits: Mapped[Blob | None] = mapped_column(LargeBinary, nullable=True, default=None)
    #: A longitudinal stream's codes this device has sent, one bit each (revision 0018,
    #: zeal_server.ingest.memo): a reading costs only when its code is new. None: none.
    memo_codes: Mapped[Blob | None] = mapped_column(LargeBinary, nullable=True, default=None)
    #: (sequence, BLAKE2b-64 digest) of the last batches stored, 16 bytes each.
    seq_recent: Mapped[Blob | None] = mapped_column(LargeBinary, nullable=True, default=None)
    #: The newest first reading of a stored batch (ms): its gaps are given up once the
    #: stream's dedup horizon passes it.
    seq_newest_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    #: Sequences that never arrived, counted once they no longer can (sequences.settle).
    missing: Mapped[int] = mapped_column(BigInteger, default=0)
    #: Batches stored after a higher sequence of the device (out of order).
    late: Mapped[int] = mapped_column(BigInteger, default=0)


class DevicePeriod(Base):
    """Readings stored per device and UTC day (``hours`` 24), and per device and UTC hour
    (``hours`` 1), of their timestamps: the collector's privacy ledger (zeal_server.store.ledger).
    A day's count times the stream's micro-epsilon per reading is the loss spent that day;
    an hour's count is held to the policy's hourly cap (zeal.policy.readings_per_hour).
    One table for both periods (revision 0009): a table costs a heap page and an index
    page before its first row holds anything."""

    __tablename__ = "device_periods"

    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), primary_key=True)
    #: The period's length in hours: 24 for a UTC day, 1 for a UTC hour.
    hours: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    #: The period's number since 1970 (days for a day, hours for an hour).
    period: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    readings: Mapped[int] = mapped_column(BigInteger)


class Principal(Base):
    """Who spends a device's privacy cap across streams (revisions 0013, 0014): a device
    name and the identity that sent under it. ``identity`` is "" for the device itself (its
    own login where the broker says who published, or nobody's where it cannot),
    ``login:NAME`` for another broker login publishing under the name, ``lorawan:DEVEUI``
    for a LoRaWAN device: each has a ledger of its own, so no one else spends the device's
    day. Its privacy loss over every stream with a policy is held to one daily cap
    (zeal_server.store.budgets): the name's own ``max_epsilon_per_day`` (kept on the name's
    "" row), else the lowest of its tags' (``TagBudget``), else the server's
    ZEAL_DEVICE_MAX_EPSILON_PER_DAY."""

    __tablename__ = "principals"
    __table_args__ = (UniqueConstraint("name", "identity", name="principals_name_identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    identity: Mapped[str] = mapped_column(String(100), default="")
    #: The name's own daily cap in epsilon (on its "" row); None: its tags' or the default.
    max_epsilon_per_day: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    #: Its own caps over any 30 and any 365 consecutive UTC days (revision 0017), likewise.
    max_epsilon_per_30_days: Mapped[float | None] = mapped_column(
        Float, nullable=True, default=None
    )
    max_epsilon_per_365_days: Mapped[float | None] = mapped_column(
        Float, nullable=True, default=None
    )
    #: Micro-epsilon of its days no longer kept (folded in when their rows go: store.ledger
    #: keeps KEEP_DAYS behind the import window), and the first day it ever spent on once
    #: one was folded (None: its first is still among its rows).
    retired_micro: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    first_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)


class PrincipalDay(Base):
    """Micro-epsilon a device spent per UTC day of its readings' timestamps over all its
    streams with a policy: the collector's ledger of the device cap (store.ledger)."""

    __tablename__ = "principal_days"

    principal_id: Mapped[int] = mapped_column(ForeignKey("principals.id"), primary_key=True)
    #: The UTC day (days since 1970).
    period: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    micro: Mapped[int] = mapped_column(BigInteger)


class PrincipalHour(Base):
    """Micro-epsilon a device spent per UTC hour of its readings' timestamps over all its
    streams with a policy: the ledger of the device hour rule (store.ledger; revision 0017),
    kept as long as the import window accepts a reading stamped in the hour."""

    __tablename__ = "principal_hours"

    principal_id: Mapped[int] = mapped_column(ForeignKey("principals.id"), primary_key=True)
    #: The UTC hour (hours since 1970).
    period: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    micro: Mapped[int] = mapped_column(BigInteger)


class CapsVersion(Base):
    """One row: a counter raised with every change a device's cap depends on
    (store.versions), so that collectors read caps again only when one changed."""

    __tablename__ = "caps_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, default=0)


class TagBudget(Base):
    """Caps for the devices carrying a tag (key, value) in any stream: per UTC day, and
    over any 30 and 365 consecutive UTC days (revision 0017; None: not capped there)."""

    __tablename__ = "tag_budgets"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(200), primary_key=True)
    max_epsilon_per_day: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_epsilon_per_30_days: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_epsilon_per_365_days: Mapped[float | None] = mapped_column(Float, nullable=True)


class DeviceTag(Base):
    """One tag of a device (the same pairs as ``Device.tags``): groups are queried by join."""

    __tablename__ = "device_tags"
    __table_args__ = (Index("ix_device_tags_key_value", "key", "value"),)

    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))


class _Sums:
    """The exact sums: count, then limbs of the sum of codes (s*) and of squares (q*)."""

    n: Mapped[int] = mapped_column(BigInteger)
    s0: Mapped[int] = mapped_column(BigInteger)
    s1: Mapped[int] = mapped_column(BigInteger)
    s2: Mapped[int] = mapped_column(BigInteger)
    q0: Mapped[int] = mapped_column(BigInteger)
    q1: Mapped[int] = mapped_column(BigInteger)
    q2: Mapped[int] = mapped_column(BigInteger)
    q3: Mapped[int] = mapped_column(BigInteger)


class Segment(_Sums, Base):
    """Readings of one stream: codes, timestamps and device ids (zeal_server.store.segments).

    A transaction adds one raw part per bucket it touches; compaction merges a day's closed
    buckets into chunks sorted by (device, time), each small enough to stay inline in a
    PostgreSQL page (``data`` is stored MAIN there: no TOAST). A row covers the buckets
    ``first_bucket`` to ``last_bucket`` and never crosses a period (``compaction.period``);
    its sums are those of all its readings. ``tag`` tells apart rows that start and end in
    the same buckets (random for new rows).
    """

    __tablename__ = "segments"

    stream_id: Mapped[int] = mapped_column(ForeignKey("streams.id"), primary_key=True)
    first_bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tag: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    encoding: Mapped[int] = mapped_column(SmallInteger)
    #: Last: SQLite reads a column stored after a blob that overflows its page only by
    #: reading the blob's overflow chain (revision 0008).
    data: Mapped[bytes] = mapped_column(LargeBinary, sort_order=1)


class Reject(Base):
    """Counts of rejected messages by stream, device and reason (names as on the topic)."""

    __tablename__ = "rejects"

    stream: Mapped[str] = mapped_column(String(128), primary_key=True)
    device: Mapped[str] = mapped_column(String(128), primary_key=True)
    reason: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)
    last_ms: Mapped[int] = mapped_column(BigInteger)


class Installation(Base):
    """One row: this database's id, named as ``server`` in configurations and notices.

    Every collector on one database shares it, so agents can tell the server that created
    their stream from another one on the same broker.
    """

    __tablename__ = "installation"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    #: The Ed25519 seed (hex) the server signs configurations and notices with
    #: (store.signing). Secret: a database backup holds it.
    signing_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: The chain from its first key to the current one, JSON, oldest first (zeal.signed's
    #: endorsements; ``zeal-server key rotate``); None: never rotated.
    endorsements: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)


class LoRaWANBinding(Base):
    """Where a ChirpStack application's uplinks go (zeal_server.broker.chirpstack.uplinks): those on
    ``f_port`` (0: every port not bound on its own) go to the stream, under the device's
    DevEUI (``device_names`` "dev_eui", 16 hex digits) or its ChirpStack device name
    ("device_name"). Deleted with the stream."""

    __tablename__ = "lorawan_bindings"

    #: ChirpStack's application id (a UUID in v4).
    application_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: The LoRaWAN FPort (1 to 223), or 0 for any port of the application.
    f_port: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    stream_id: Mapped[int] = mapped_column(ForeignKey("streams.id"))
    device_names: Mapped[str] = mapped_column(String(16))
    created_ms: Mapped[int] = mapped_column(BigInteger)


class DeviceCertificate(Base):
    """A client certificate issued to a device (revision 0015; zeal_server.broker.
    certificates): the broker takes its common name as the device's login. Kept so that
    revoking the device can name every serial of it in the revocation list the broker
    reads; the certificate itself (public) and never a private key."""

    __tablename__ = "device_certificates"

    #: The serial number, lower-case hex without leading zeros.
    serial: Mapped[str] = mapped_column(String(40), primary_key=True)
    device: Mapped[str] = mapped_column(String(64), index=True)
    issued_ms: Mapped[int] = mapped_column(BigInteger)
    not_after_ms: Mapped[int] = mapped_column(BigInteger)
    #: When it was revoked; None: valid until not_after_ms.
    revoked_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
