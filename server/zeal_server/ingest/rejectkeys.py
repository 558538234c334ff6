"""Which ``rejects`` row a reject is counted under.

The table must stay bounded whatever names clients invent (a device may publish under any
stream name it likes), and that bound must never cost the accounting of what exists: a
stream's reject counts (``/stats``) and a device's ``over_budget`` flag (``/devices``). So
the rows fall into pools with a cap each:

- a device of a stream that exists (it has a device row): its own row, never capped (as
  many as the stream's real devices times the reasons);
- a name that is not a device of an existing stream: that stream's pool, ``MAX_REJECT_ROWS``
  rows; beyond, rejects count under ``(stream, "*", reason)``, still the stream's;
- a stream that does not exist: one pool for them all, ``MAX_REJECT_ROWS`` rows; beyond,
  under ``("*", "*", reason)``.

Pool sizes are counted in the database at most every ``RECOUNT`` seconds (several
collectors share the table) and kept up to date in between.
"""

from __future__ import annotations

import time

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session

from zeal.protocol import REJECT_REASONS
from zeal_server.store.models import Device, Reject, Stream

__all__ = ["MAX_REJECT_ROWS", "RejectKeys", "check_reason"]

#: Rows per pool: the streams that do not exist share one, each stream has one for names
#: that are not its devices.
MAX_REJECT_ROWS = 10_000
RECOUNT = 10.0


def check_reason(reason: str) -> None:
    """A reject reason must be one of zeal.protocol.REJECT_REASONS: anything else is a bug,
    refused loudly."""
    if reason not in REJECT_REASONS:
        raise AssertionError(f"{reason!r} is not in the reject catalogue")


class RejectKeys:
    """The row of each reject (module docstring); one per Ingest (one writer thread)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], None] = {}  # rows known to exist or granted
        self._pools: dict[int | None, tuple[int, float]] = {}  # (rows, when counted)

    def key(
        self,
        session: Session,
        stream: str,
        device: str,
        reason: str,
        *,
        stream_id: int | None,
        is_device: bool,
    ) -> tuple[str, str, str]:
        """(stream, device, reason) to count a reject under. `stream_id`: the stream's id if
        it exists; `is_device`: `device` is one of its devices (check_reason applies)."""
        check_reason(reason)
        names = (stream[:64], device[:64])
        if (stream_id is not None and is_device) or names in self._seen:
            return (*names, reason)
        rows, counted = self._pools.get(stream_id, (0, -1e18))
        now = time.monotonic()
        if now - counted > RECOUNT:
            rows, counted = self._count(session, stream_id, names[0]), now
        if rows >= MAX_REJECT_ROWS:
            self._pools[stream_id] = (rows, counted)
            return ("*" if stream_id is None else names[0], "*", reason)
        self._pools[stream_id] = (rows + 1, counted)
        if len(self._seen) >= 4 * MAX_REJECT_ROWS:
            self._seen.clear()
        self._seen[names] = None
        return (*names, reason)

    @staticmethod
    def _count(session: Session, stream_id: int | None, stream: str) -> int:
        """Rows of a pool now: those of streams that do not exist (`stream_id` None), or
        those of `stream` whose device is not one of its devices."""
        if stream_id is None:
            query = select(func.count()).where(~Reject.stream.in_(select(Stream.name)))
        else:
            known = exists().where(
                and_(Device.stream_id == stream_id, Device.name == Reject.device)
            )
            query = select(func.count()).where(Reject.stream == stream, ~known)
        return int(session.scalar(query) or 0)
