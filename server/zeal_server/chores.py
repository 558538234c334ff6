"""The collector writer's chores between transactions: recording what the door shed, and
housekeeping (compaction, retention, the privacy ledger's old days)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal_server import door, retention, store
from zeal_server.db import error_text as db_error_text

__all__ = ["housekeep", "record_shed"]

log = logging.getLogger("zeal_server.collector")


def record_shed(
    sessions: sessionmaker[Session], ingest: store.Ingest, shed: door.Shed, logs: door.LogThrottle
) -> None:
    """Write the counts of messages shed at the door into the rejects table."""
    counts = shed.take()
    if not counts:
        return
    try:
        with sessions() as session, session.begin():
            for (stream, device, reason), count in counts.items():
                now = store.now_ms()
                ingest.reject(session, stream, device, reason, when=now, count=count)
                logs.reject(reason, stream, device)
    except SQLAlchemyError as exc:  # counts only; they are retried with the next batch
        shed.give_back(counts)
        log.error("could not record %d shed messages: %s", sum(counts.values()), db_error_text(exc))


def housekeep(sessions: sessionmaker[Session], ingest: store.Ingest) -> None:
    """Compact closed buckets, delete what is past each stream's retention (whole
    buckets), and prune the dedup rows and the privacy ledger behind the import window
    (zeal_server.retention.housekeep)."""
    try:
        with sessions() as session, session.begin():
            streams = store.list_streams(session)
            ingest.refresh(streams)
            retention.housekeep(session, streams, store.now_ms(), max_age_ms=ingest.max_age_ms)
    except SQLAlchemyError as exc:
        log.error("housekeeping failed (will retry): %s", db_error_text(exc))
    except Exception:
        # Compaction decodes stored segments: a bug or a damaged segment there must not
        # stop ingestion, so it is logged with its traceback and tried again later.
        log.exception("housekeeping failed on an unexpected error (will retry)")
