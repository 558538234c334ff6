"""a sequence state per device in place of a dedup row per batch; missing and late batches

Revision ID: 0012
Revises: 0011

Exactly-once kept a row per batch received within the import window (``batches``, some
140 bytes each with its indexes). A device's sequence state (zeal_server.store.sequences)
replaces them: a floor below which every sequence is settled, a bitmap of the sequences
stored above it (the out-of-order window, 256 sequences), the highest stored, the
(sequence, digest) of the last four batches stored, and the newest first reading. This
revision computes each device's state from its dedup rows and drops the table.

What the rows knew carries over: the floor is the lowest gap above the device's lowest
kept sequence (a gap more than 256 sequences below its highest is given up, not counted:
whether it was missing before the rows were pruned is not known), and the last four batches
with a digest (rows from before revision 0002 have none: a redelivery of theirs is told
by the store's own readings, as for any older batch). ``missing`` and ``late`` start at 0.
A device whose rows were all pruned keeps no state (the import window has passed its
batches) but the time of its last message, so that its next sequence is not taken for its
first.
"""

from __future__ import annotations

import struct
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

WINDOW = 256
RECENT = 4
_DEVICES_AT_ONCE = 100
_PAIR = struct.Struct("<Qq")
_U64 = 1 << 64


def _unsigned(value: int) -> int:
    return value + _U64 if value < 0 else value


def _signed(value: int) -> int:
    return value - _U64 if value >= 1 << 63 else value


def _state(rows: list[Any]) -> dict[str, Any]:
    """The state columns of one device from its dedup rows (sequence, generation, digest,
    first_ms)."""
    stored = {_unsigned(r[0]) for r in rows}
    head = max(stored)
    floor = min(stored)
    while floor in stored:
        floor += 1
    if head - floor >= WINDOW:
        floor = head - WINDOW + 1
        while floor in stored:
            floor += 1
    bits = sum(1 << (s - floor) for s in stored if floor <= s < floor + WINDOW)
    latest = sorted((r for r in rows if r[2] is not None), key=lambda r: (_unsigned(r[0]), r[1]))
    recent = b"".join(_PAIR.pack(_unsigned(r[0]), r[2]) for r in latest[-RECENT:])
    return {
        "floor": _signed(floor),
        "head": _signed(head),
        "bits": bits.to_bytes((bits.bit_length() + 7) // 8, "little") or None,
        "recent": recent or None,
        "newest": max(r[3] for r in rows),
    }


def upgrade() -> None:
    # Plain ADD COLUMNs (SQLite would otherwise copy the table, which its foreign keys forbid).
    for name in ("seq_floor", "seq_head", "seq_newest_ms"):
        op.add_column("devices", sa.Column(name, sa.BigInteger(), nullable=True))
    for name in ("seq_bits", "seq_recent"):
        op.add_column("devices", sa.Column(name, sa.LargeBinary(), nullable=True))
    for name in ("missing", "late"):
        op.add_column(
            "devices", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")
        )
    bind = op.get_bind()
    update = sa.text(
        "UPDATE devices SET seq_floor = :floor, seq_head = :head, seq_bits = :bits,"
        " seq_recent = :recent, seq_newest_ms = :newest WHERE id = :id"
    ).bindparams(
        sa.bindparam("bits", type_=sa.LargeBinary()), sa.bindparam("recent", type_=sa.LargeBinary())
    )
    # A few devices at a time: a week of rows of a large fleet does not fit in memory (the
    # reason for this revision).
    devices = [int(d) for (d,) in bind.execute(sa.text("SELECT DISTINCT device_id FROM batches"))]
    devices.sort()
    for first in range(0, len(devices), _DEVICES_AT_ONCE):
        chosen = devices[first : first + _DEVICES_AT_ONCE]
        rows: dict[int, list[Any]] = {}
        found = bind.execute(
            sa.text(
                "SELECT device_id, sequence, generation, digest, first_ms FROM batches"
                " WHERE device_id IN :ids"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": chosen},
        )
        for device_id, *row in found:
            rows.setdefault(int(device_id), []).append(tuple(row))
        bind.execute(update, [{"id": d, **_state(kept)} for d, kept in sorted(rows.items())])
    # Devices heard from whose rows were all pruned: no state, but not new either.
    bind.execute(
        sa.text(
            "UPDATE devices SET seq_newest_ms = last_seen_ms"
            " WHERE seq_floor IS NULL AND batches > 0"
        )
    )
    op.drop_table("batches")


def downgrade() -> None:
    raise NotImplementedError("Zeal does not downgrade schemas; restore a backup instead")
