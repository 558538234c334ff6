"""What the database occupies, all in: every table with its indexes (and TOAST on
PostgreSQL), less the pages an empty table and its indexes keep; and a stream's share of it.

A table's bytes are shared among the streams by what each holds of it: the segments by their
data, the tables keyed by device (devices with their sequence states, tags, the privacy
ledger) by the stream's share of the devices, the rejects by the stream's rows, the streams
table evenly. ``sequence_state_bytes`` gives the sequence states' own bytes (part of the
devices table).
``bench/store_footprint.py`` measures the same figure as the growth of a database over its
empty schema (after ``VACUUM FULL``); docs/server.md compares the two.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from zeal_server.store.models import Device, Reject, Segment, Stream

__all__ = ["database_bytes", "segment_totals", "sequence_state_bytes", "stream_bytes"]

#: Tables whose rows belong to devices (their bytes are shared by the devices' streams).
_BY_DEVICE = (
    "devices",
    "device_tags",
    "device_periods",
    "principals",
    "principal_days",
    "principal_hours",
)
#: SQLite's sizes come from scanning every page (dbstat): kept this many seconds, while the
#: file keeps its number of pages.
_SQLITE_SECONDS = 60.0
_sqlite_cache: dict[str, tuple[float, int, dict[str, int]]] = {}


def database_bytes(session: Session) -> dict[str, int]:
    """Bytes per table, with its indexes (and TOAST), less what the empty table keeps: on
    PostgreSQL one page per index (its metapage), on SQLite one page per b-tree."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        rows = session.execute(
            text(
                "SELECT c.relname, pg_total_relation_size(c.oid), "
                "(SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid) "
                "+ (CASE WHEN c.reltoastrelid = 0 THEN 0 ELSE 1 END), "
                "current_setting('block_size')::bigint "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
            )
        ).all()
        sizes = {str(t): int(size) - int(indexes) * int(block) for t, size, indexes, block in rows}
    else:
        pages = int(session.scalar(text("PRAGMA page_count")) or 0)
        url = str(bind.engine.url)
        cached = _sqlite_cache.get(url)
        if (
            cached is not None
            and cached[1] == pages
            and time.monotonic() - cached[0] < _SQLITE_SECONDS
        ):
            return dict(cached[2])
        sizes = _sqlite_bytes(session)
        _sqlite_cache[url] = (time.monotonic(), pages, sizes)
    for fixed in ("alembic_version", "installation"):  # the database's, no stream's
        sizes.pop(fixed, None)
    return sizes


def _sqlite_bytes(session: Session) -> dict[str, int]:
    owners = {
        str(name): str(table)
        for name, table in session.execute(
            text("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')")
        )
    }
    page = int(session.scalar(text("PRAGMA page_size")) or 4096)
    sizes: dict[str, int] = {}
    for name, size in session.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")):
        table = owners.get(str(name), str(name))
        sizes[table] = sizes.get(table, 0) + int(size) - page
    sizes.pop("sqlite_schema", None)
    return sizes


def stream_bytes(session: Session, stream: Stream) -> dict[str, int]:
    """The stream's share of each table's bytes (``database_bytes``), by table."""
    sizes = database_bytes(session)
    shares: dict[str, float] = {}
    data = func.coalesce(func.sum(func.length(Segment.data)), 0)
    ours, every = (
        session.scalar(select(data).where(Segment.stream_id == stream.id)),
        session.scalar(select(data)),
    )
    shares["segments"] = _share(ours, every)
    devices = func.count(Device.id)
    ours, every = (
        session.scalar(select(devices).where(Device.stream_id == stream.id)),
        session.scalar(select(devices)),
    )
    for table in _BY_DEVICE:
        shares[table] = _share(ours, every)
    shares["streams"] = _share(1, session.scalar(select(func.count(Stream.id))))
    rejects = select(func.count()).select_from(Reject)
    ours = session.scalar(rejects.where(Reject.stream == stream.name))
    every = session.scalar(rejects)
    shares["rejects"] = _share(ours, every)
    return {t: round(max(0, sizes.get(t, 0)) * share) for t, share in shares.items()}


def sequence_state_bytes(session: Session, stream: Stream) -> int:
    """The bytes of the stream's devices' sequence states (store.sequences): their values,
    eight per integer column set (floor, head, newest reading, missing, late), and the
    bitmap's and recent digests' lengths (a row's header is the device's, not theirs)."""
    integers = [Device.seq_floor, Device.seq_head, Device.seq_newest_ms]
    total = select(
        8 * (2 * func.count(Device.id) + sum(func.count(c) for c in integers)),
        func.coalesce(func.sum(func.length(Device.seq_bits)), 0),
        func.coalesce(func.sum(func.length(Device.seq_recent)), 0),
    ).where(Device.stream_id == stream.id)
    return sum(int(v or 0) for v in session.execute(total).one())


def segment_totals(session: Session, stream: Stream) -> tuple[int, int]:
    """The readings the stream's segments hold, and the bytes of their data."""
    readings, data = session.execute(
        select(
            func.coalesce(func.sum(Segment.n), 0),
            func.coalesce(func.sum(func.length(Segment.data)), 0),
        ).where(Segment.stream_id == stream.id)
    ).one()
    return int(readings), int(data)


def _share(ours: Any, every: Any) -> float:
    return float(ours or 0) / float(every) if every else 0.0
