"""a store whose cost follows the readings: segment rows carry their own exact sums (the
per-device aggregates and bucket totals go), dedup rows carry their first reading and are
pruned behind each stream's dedup horizon

Revision ID: 0007
Revises: 0006

Every segment row is kept as it is (its three columns become the sections of ``data``:
encoding 0 for a raw part, 1 for a compacted bucket) and gains the count and limb sums of
its readings, computed here from its codes. Before anything is dropped, every (bucket,
device)'s readings in the segments are checked against its aggregate row and every bucket
against its total, as ``zeal-server verify`` did: a database where they disagree is not
converted (the upgrade stops with the first mismatch, and nothing changes), so every figure
served after the upgrade is the one served before. The collector's housekeeping then merges
the old rows into chunks, a few days at a time (``zeal-server compact`` does all at once).

The format written here is read by zeal_server.store.segments for good: it is frozen with this
file, which therefore decodes the old columns itself.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator
from typing import Any, NoReturn

import numpy as np
import sqlalchemy as sa
import zstandard
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_LIMB = 24
_MASK = np.uint64((1 << _LIMB) - 1)
#: The dedup rows from before this revision know their arrival, not their first reading:
#: this bound (the default clock lead, 10 minutes) stands for the latter.
_LEAD_MS = 600_000
_SUMS = ["n", "s0", "s1", "s2", "q0", "q1", "q2", "q3"]
_END = 1 << 63


class MismatchError(RuntimeError):
    """The segments disagree with the aggregates: the database is not converted."""


def _dtype(bits: int) -> np.dtype[Any]:
    return np.dtype(np.uint8 if bits <= 8 else "<u2" if bits <= 16 else "<u4")


def _limb_vector(codes: np.ndarray) -> list[int]:
    """[count, sum limbs (3), square limbs (4)], each limb summed over the readings (codes
    of at most 28 bits: a square fits in uint64)."""
    squares = codes * codes
    sums = [int(((codes >> np.uint64(_LIMB * i)) & _MASK).sum()) for i in range(3)]
    quads = [int(((squares >> np.uint64(_LIMB * i)) & _MASK).sum()) for i in range(3)]
    return [int(codes.size), *sums, *quads, 0]


def _value(limbs: list[int]) -> int:
    return sum(int(v) << (_LIMB * i) for i, v in enumerate(limbs))


def _triple(limbs: list[int]) -> tuple[int, int, int]:
    return int(limbs[0]), _value(limbs[1:4]), _value(limbs[4:8])


def _section(blob: bytes, packed: bool) -> bytes:
    return struct.pack("<BI", int(packed), len(blob)) + blob


def _segments(bind: sa.Connection, table: str) -> Generator[list[Any], None, None]:
    """The old segment rows of one (stream, bucket) at a time, in (stream, bucket) order."""
    rows = bind.execute(
        sa.text(
            "SELECT id, stream_id, bucket, compacted, codes, timestamps, devices "
            f"FROM {table} ORDER BY stream_id, bucket, id"
        ).execution_options(yield_per=500)
    )
    group: list[Any] = []
    with rows:  # closed however the reading ends (a mismatch raises in the middle)
        for row in rows:
            if group and (row.stream_id, row.bucket) != (group[0].stream_id, group[0].bucket):
                yield group
                group = []
            group.append(row)
    if group:
        yield group


def _keyed(
    bind: sa.Connection, sql: str
) -> Generator[tuple[tuple[int, int], list[Any]], None, None]:
    """Rows of `sql` (ordered by stream_id, bucket) grouped by (stream, bucket)."""
    rows = bind.execute(sa.text(sql).execution_options(yield_per=2000))
    key: tuple[int, int] | None = None
    group: list[Any] = []
    with rows:
        for row in rows:
            if key is not None and (row.stream_id, row.bucket) != key:
                yield key, group
                group = []
            key = (row.stream_id, row.bucket)
            group.append(row)
    if key is not None:
        yield key, group


class _Ordered:
    """Rows grouped by (stream, bucket), in order, taken bucket by bucket: a group with
    readings that no segment bucket asks for is a mismatch."""

    def __init__(self, groups: Generator[tuple[tuple[int, int], list[Any]], None, None]) -> None:
        self.groups = groups
        self.head = next(groups, None)

    def take(self, key: tuple[int, int]) -> list[Any]:
        found: list[Any] = []
        while self.head is not None and self.head[0] <= key:
            if self.head[0] == key:
                found = self.head[1]
            elif any(r.n for r in self.head[1]):
                _mismatch(self.head[0], "sums of a bucket without segments")
            self.head = next(self.groups, None)
        return found


def _bits(bind: sa.Connection) -> dict[int, int]:
    rows = bind.execute(sa.text("SELECT id, payload_bits FROM streams")).all()
    return {int(i): int(b) for i, b in rows}


def _check(bind: sa.Connection) -> None:
    """Every (bucket, device)'s readings in the segments against its aggregate row, and every
    bucket against its total (before anything is changed: SQLite runs DDL outside the
    transaction, so a mismatch must be found first)."""
    bits = _bits(bind)
    aggregates = _Ordered(
        _keyed(
            bind,
            "SELECT stream_id, bucket, device_id, n, s0, s1, s2, q0, q1, q2, q3 "
            "FROM aggregates ORDER BY stream_id, bucket, device_id",
        )
    )
    totals = _Ordered(
        _keyed(
            bind,
            "SELECT stream_id, bucket, n, s0, s1, s2, q0, q1, q2, q3 FROM bucket_totals "
            "ORDER BY stream_id, bucket",
        )
    )
    segments = _segments(bind, "segments")
    try:
        _match(segments, aggregates, totals, bits)
    finally:  # the three readings are closed, whether they matched or not
        for reading in (segments, aggregates.groups, totals.groups):
            reading.close()


def _match(
    segments: Iterator[list[Any]], aggregates: _Ordered, totals: _Ordered, bits: dict[int, int]
) -> None:
    for group in segments:
        key = (group[0].stream_id, group[0].bucket)
        found = {d: _triple(v) for d, v in _rows(group, bits[key[0]])[1].items()}
        stored = {
            r.device_id: _triple([getattr(r, c) for c in _SUMS])
            for r in aggregates.take(key)
            if r.n
        }
        for device in sorted(set(stored) | set(found)):
            if stored.get(device) != found.get(device):
                _mismatch(
                    key,
                    f"device id {device}: aggregates {stored.get(device)} != segments "
                    f"{found.get(device)}",
                )
        total = next((_triple([getattr(r, c) for c in _SUMS]) for r in totals.take(key)), None)
        summed = tuple(sum(v[i] for v in found.values()) for i in range(3))
        if (total or (0, 0, 0)) != summed:
            _mismatch(key, f"bucket total {total} != segments {summed}")
    aggregates.take((_END, _END))  # whatever is left has no segments
    totals.take((_END, _END))


def _copy(bind: sa.Connection, new: sa.Table) -> None:
    """The old segment rows into the new table, 500 at a time."""
    bits = _bits(bind)
    out: list[dict[str, Any]] = []
    for group in _segments(bind, "segments_0006"):
        out.extend(_rows(group, bits[group[0].stream_id])[0])
        if len(out) >= 500:
            bind.execute(new.insert(), out)
            out = []
    if out:
        bind.execute(new.insert(), out)


def _rows(group: list[Any], width: int) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """The new rows of one bucket's old segment rows, and the bucket's limb vectors per
    device."""
    unzip = zstandard.ZstdDecompressor()
    per_device: dict[int, list[int]] = {}
    out = []
    for row in group:
        blobs = (bytes(row.codes), bytes(row.timestamps), bytes(row.devices))
        raw = [unzip.decompress(b) for b in blobs] if row.compacted else list(blobs)
        codes = np.frombuffer(raw[0], dtype=_dtype(width)).astype(np.uint64)
        devices = np.frombuffer(raw[2], dtype="<i4").astype(np.int64)
        for device in np.unique(devices).tolist():
            mine = _limb_vector(codes[devices == device])
            acc = per_device.get(int(device), [0] * 8)
            per_device[int(device)] = [a + b for a, b in zip(acc, mine, strict=True)]
        out.append(
            {
                "stream_id": row.stream_id,
                "first_bucket": row.bucket,
                "last_bucket": row.bucket,
                "tag": row.id,
                "encoding": 1 if row.compacted else 0,
                "data": b"".join(_section(b, bool(row.compacted)) for b in blobs),
                **dict(zip(_SUMS, _limb_vector(codes), strict=True)),
            }
        )
    return out, per_device


def _mismatch(key: tuple[int, int], what: str) -> NoReturn:
    raise MismatchError(
        f"not converted: stream id {key[0]}, bucket {key[1]}: {what}. The segments and the "
        "aggregates disagree (run `zeal-server verify` with the previous release); the "
        "database is left as it was."
    )


def upgrade() -> None:
    bind = op.get_bind()
    _check(bind)
    op.rename_table("segments", "segments_0006")
    new = op.create_table(
        "segments",
        sa.Column("stream_id", sa.Integer(), sa.ForeignKey("streams.id"), nullable=False),
        sa.Column("first_bucket", sa.BigInteger(), nullable=False),
        sa.Column("last_bucket", sa.BigInteger(), nullable=False),
        sa.Column("tag", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("encoding", sa.SmallInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        *(sa.Column(c, sa.BigInteger(), nullable=False) for c in _SUMS),
        sa.PrimaryKeyConstraint(
            "stream_id", "first_bucket", "last_bucket", "tag", name="segments_key"
        ),
    )
    if bind.dialect.name == "postgresql":
        # Chunks are sized to stay inline in a page: no TOAST table pages or index for them.
        op.execute("ALTER TABLE segments ALTER COLUMN data SET STORAGE MAIN")
    _copy(bind, new)
    op.drop_table("segments_0006")
    op.drop_table("aggregates")
    op.drop_table("bucket_totals")
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("first_ms", sa.BigInteger(), nullable=True))
    op.execute(f"UPDATE batches SET first_ms = received_ms + {_LEAD_MS}")
    with op.batch_alter_table("batches") as batches:
        batches.alter_column("first_ms", existing_type=sa.BigInteger(), nullable=False)
        batches.drop_column("received_ms")
    op.create_index("ix_batches_first_ms", "batches", ["first_ms"])
    with op.batch_alter_table("streams") as streams:
        streams.add_column(sa.Column("horizon_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError(
        "revision 0007 drops the per-device aggregates: restore the backup taken before "
        "the upgrade to go back"
    )
