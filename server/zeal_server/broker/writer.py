"""The collector's writer: stores what its sources received and acknowledges it, whichever
source that was.

One thread takes up to ``batch_max`` messages at a time from the inbox, stores them in
one transaction, and only then has the source of each acknowledge it (rejected ones too,
so they do not loop). If the database fails, the transaction is rolled back, nothing is
acknowledged, and the same messages are retried with backoff until it answers again. What
it needs of a message's source the message carries (``inbox.Received.source``,
``sources.Source``): its ``ack``, whether its sender is a device on Zeal's broker, and the
translator that turns it into a device's batch when it is not one yet.

Between transactions it keeps the broker's retained stream configurations true to the
database (``configsync``), tells devices their caps (``devicecaps``) and what else needs
their attention (``notices``), records what was shed at the door, and housekeeps
(compaction, retention, pruning).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter
from typing import Any, Literal, Protocol

from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal_server import store
from zeal_server.broker import door
from zeal_server.broker.configsync import ConfigSync
from zeal_server.broker.devicecaps import CapsTeller
from zeal_server.broker.inbox import Inbox, Received, Shed
from zeal_server.broker.lags import CommitLags
from zeal_server.broker.notices import Notifier
from zeal_server.broker.sources import Source, Translated, Translator
from zeal_server.ingest import Ingest, Message, Original, Outcome
from zeal_server.store.db import error_text as db_error_text

__all__ = ["BrokerLink", "Writer", "tally", "told"]

log = logging.getLogger(__name__)

#: What ``tally`` and the writer read of each message and outcome (C-level getters).
_RECEIVED_MS, _SOURCE = attrgetter("received_ms"), attrgetter("source")
_STATUS, _READINGS, _RESET = attrgetter("status"), attrgetter("readings"), attrgetter("reset")
_STREAM, _DEVICE = attrgetter("stream"), attrgetter("device")
_ACK = attrgetter("mid", "qos")


class BrokerLink(Protocol):
    """What the writer reads of the connection to Zeal's broker, which carries the
    configurations, the caps and the notices it publishes."""

    connected: bool
    #: Connections made so far: a new one has the configurations synced at once.
    connects: int


class Writer:
    """The writer thread and what it keeps (``start``/``stop`` from the collector)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        ingest: Ingest,
        queue: Inbox,
        *,
        link: BrokerLink,
        configs: ConfigSync,
        notices: Notifier,
        caps_teller: CapsTeller,
        translators: Sequence[Translator],
        shed: Shed,
        budget: door.RejectBudget,
        counts: Counter[str],
        rejected_by: Counter[str],
        batch_max: int,
        compact_every: float = 30.0,
        sync_every: float = 2.0,
    ) -> None:
        self.sessions, self.ingest, self.queue = sessions, ingest, queue
        self.link, self.configs, self.notices = link, configs, notices
        self.caps_teller, self.translators = caps_teller, list(translators)
        self.shed, self.budget = shed, budget
        self.counts, self.rejected_by = counts, rejected_by
        self.batch_max, self.compact_every, self.sync_every = batch_max, compact_every, sync_every
        self.lags = CommitLags()
        #: Messages acknowledged after their commit.
        self.acknowledged = 0
        #: When the oldest message the writer holds arrived (ms), None when it holds none.
        self.oldest_ms: int | None = None
        self.database_ok = True
        #: The database's last error.
        self.last_error: str | None = None
        #: Why the writer stopped (a bug), None while it runs.
        self.writer_error: str | None = None
        self._stop = threading.Event()
        self._log_rejects = door.LogThrottle()
        self._forget_devices = threading.Event()
        self._reload_streams = threading.Event()
        self._caps_read = time.monotonic()
        #: The counter of cap changes the cached caps were read under (None: unknown).
        self._caps_version: int | None = None
        self._synced_connects = 0
        self._last_sync = self._last_compact = time.monotonic()
        self._backoff = 0.5
        self._retried = False
        self._thread = threading.Thread(target=self._write_loop, name="zeal-writer", daemon=True)

    # -- lifecycle and what other threads tell it ----------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Store what is queued, then end the thread."""
        self._stop.set()
        self._thread.join(timeout=30)

    def streams_changed(self) -> None:
        """A stream was created or deleted here: sync the configurations and read the
        streams (and what the translators read) again before the next round."""
        self.configs.changed.set()
        self._reload_streams.set()
        for translator in self.translators:
            translator.changed()  # a deleted stream takes its LoRaWAN bindings with it

    def caps_changed(self) -> None:
        """A device or tag cap was set here: read the caps before the next round."""
        self._caps_read = 0.0
        self._caps_version = None

    def devices_changed(self) -> None:
        """A device's data was deleted here: drop the cached device ids before the next
        round."""
        self._forget_devices.set()

    # -- the thread --------------------------------------------------------------------

    def _write_loop(self) -> None:
        """The writer thread. Database errors are retried (``_commit``); anything else is a
        bug: it ends the writer loudly (logged with its traceback, ``writer_error`` set,
        /livez 503 so an orchestrator restarts the server) instead of being retried as if
        the database were down. Nothing unacknowledged is lost: the source keeps it."""
        try:
            self._write_until_stopped()
        except Exception as exc:
            self.writer_error = f"{type(exc).__name__}: {exc}"[:300]
            log.exception(
                "the collector's writer stopped on an unexpected error; nothing more is "
                "stored or acknowledged until the server restarts"
            )

    def _write_until_stopped(self) -> None:
        # Notices name the installation; read it before the first message is stored, not
        # only with the first configuration sync (notices of the first batches were lost).
        try:
            with self.sessions() as session:
                self.configs.server_id = self.configs.server_id or store.installation_id(session)
                self.notices.signer = store.signer(session)
        except SQLAlchemyError as exc:  # the sync loop reads them again once the database answers
            log.error("could not read the installation id and key: %s", db_error_text(exc))
        pending: list[Received] = []
        while not (self._stop.is_set() and not pending and self.queue.empty()):
            self._keep_in_sync()
            if not pending:
                self.oldest_ms = None
                pending = self.queue.take(self.batch_max)
                if not pending:
                    self._idle()
                    continue
                self.oldest_ms = pending[0].received_ms
                if self._reload_streams.is_set():  # changed while it waited: applies to these
                    self._reload_streams.clear()
                    self.ingest.reload_streams()
                for translator in self.translators:  # likewise
                    translator.keep_fresh(self.sessions)
            outcome = self._commit(pending)
            if outcome == "stopped":
                return
            if outcome == "stored":
                pending = []
                self._record_shed()
                self._housekeep_when_due()  # a busy writer is never idle

    def _keep_in_sync(self) -> None:
        """Sync the retained configurations when due (a new connection, a change, or every
        sync_every seconds), and drop cached device ids when asked."""
        connects, connected = self.link.connects, self.link.connected
        due = (
            connects > self._synced_connects
            or self.configs.changed.is_set()
            or time.monotonic() - self._last_sync >= self.sync_every
        )
        moved = False
        if time.monotonic() - self._caps_read >= self.sync_every:
            self._caps_read = time.monotonic()  # another process's cap applies within it
            moved = self._check_caps()
        if (moved or self.caps_teller.pending) and connected:
            self._tell_caps()
        if due and connected:
            self._last_sync = time.monotonic()
            ids = self.configs.sync(force=connects > self._synced_connects)
            self.notices.signer = self.notices.signer or self.configs.signer
            if ids is not None:
                self.ingest.forget_streams(ids)
                self._synced_connects = connects
        if self._forget_devices.is_set():
            self._forget_devices.clear()
            self.ingest.forget()
        for translator in self.translators:
            translator.keep_fresh(self.sessions)

    def _check_caps(self) -> bool:
        """Drop the cached device caps when the counter of cap changes moved
        (store.versions), or when it cannot be read: one small query, where reading every
        cached cap again cost the writer a tenth of its speed (bench/writer_cost.py).
        Whether it moved."""
        try:
            with self.sessions() as session:
                version: int | None = store.caps_version(session)
        except SQLAlchemyError:
            version = None
        moved = version != self._caps_version
        if version is None or moved:
            self.ingest.forget_caps()
        self._caps_version = version
        return moved

    def _tell_caps(self) -> None:
        """Tell devices their caps (broker.devicecaps): those first seen, and those whose
        caps changed. A failure to read them is tried again at the next sync."""
        try:
            with self.sessions() as session:
                self.caps_teller.tell(session, self.configs.server_id, self._caps_version)
        except SQLAlchemyError as exc:
            log.warning("could not read the devices' caps to tell them: %s", exc)

    def _idle(self) -> None:
        """Nothing to store: record what was shed at the door, and housekeep when due."""
        self._record_shed()
        self._housekeep_when_due()

    def _housekeep_when_due(self) -> None:
        """Compaction, retention and pruning every compact_every seconds, between
        transactions, whether the writer is idle or busy."""
        if time.monotonic() - self._last_compact > self.compact_every:
            self._last_compact = time.monotonic()
            self.housekeep()

    def housekeep(self) -> None:
        """Compact closed buckets, delete what is past each stream's retention (whole
        buckets), count the gaps behind the import window as missing and prune the privacy
        ledger behind it (``zeal_server.store.retention.housekeep``)."""
        try:
            with self.sessions() as session, session.begin():
                streams = store.list_streams(session)
                self.ingest.refresh(streams)
                store.housekeep(session, streams, store.now_ms(), max_age_ms=self.ingest.max_age_ms)
        except SQLAlchemyError as exc:
            log.error("housekeeping failed (will retry): %s", db_error_text(exc))
        except Exception:
            # Compaction decodes stored segments: a bug or a damaged segment there must not
            # stop ingestion, so it is logged with its traceback and tried again later.
            log.exception("housekeeping failed on an unexpected error (will retry)")

    def _record_shed(self) -> None:
        """Write the counts of messages shed at the door into the rejects table."""
        counts = self.shed.take()
        if not counts:
            return
        try:
            with self.sessions() as session, session.begin():
                for (stream, device, reason), count in counts.items():
                    now = store.now_ms()
                    self.ingest.reject(session, stream, device, reason, when=now, count=count)
                    self._log_rejects.reject(reason, stream, device)
        except SQLAlchemyError as exc:  # counts only; they are retried with the next batch
            self.shed.give_back(counts)
            log.error(
                "could not record %d shed messages: %s", sum(counts.values()), db_error_text(exc)
            )

    # -- one round ---------------------------------------------------------------------

    def _commit(self, pending: list[Received]) -> Literal["stored", "retry", "stopped"]:
        """Store `pending` in one transaction and acknowledge each message ("stored"), or
        roll back, acknowledge nothing and back off ("retry"; "stopped" when the server
        stops meanwhile)."""
        sources = set(map(_SOURCE, pending))
        try:
            outcomes = self._store(pending, sources)
        except IntegrityError as exc:
            self.ingest.forget()
            if not self._retried:
                # Most likely ids cached from a stream deleted meanwhile (by another
                # process): once more at once, with ids read afresh.
                self._retried = True
                log.info("a stream changed under the collector (%s); retrying", exc.orig)
                return "retry"
            return self._failed(pending, exc)
        except SQLAlchemyError as exc:  # the database is unreachable or failing
            return self._failed(pending, exc)
        self._backoff, self._retried = 0.5, False
        self.database_ok = True
        self._acknowledge(pending, outcomes, sources)
        return "stored"

    def _store(self, messages: list[Received], sources: set[Source]) -> list[Outcome]:
        stamped = any(source.stamps_logins for source in sources)
        with self.sessions() as session, session.begin():
            if any(source.translator is not None for source in sources):
                return self._translate_and_store(session, messages)
            logins = [m.login for m in messages] if stamped else None
            return self.ingest.add_many(session, messages, logins=logins)  # as they arrived

    def _translate_and_store(self, session: Session, messages: list[Received]) -> list[Outcome]:
        """Store a round holding messages that are not devices' batches yet: each translated
        by its source's translator into the batch its device would have sent, those that
        translate stored with the others in one ``add_many``; the rest keep the outcome
        they got."""
        outcomes: list[Outcome] = []
        rows: list[Message] = []
        originals: list[Original | None] = []
        logins: list[str | None] = []
        places: list[int] = []
        for k, m in enumerate(messages):
            translator = m.source.translator
            if translator is None:
                translated: Translated | Outcome = Translated(m.topic, m.payload, None)
            else:
                translated = translator.translate(
                    session, self.ingest, m.topic, m.payload, m.received_ms
                )
            if isinstance(translated, Translated):
                rows.append(Message(translated.topic, translated.payload, m.received_ms))
                originals.append(translated.original)
                logins.append(m.login)
                places.append(k)
                outcomes.append(Outcome("skipped"))  # replaced by add_many's below
            else:
                outcomes.append(translated)
        stored = self.ingest.add_many(session, rows, originals=originals, logins=logins)
        for k, outcome in zip(places, stored, strict=True):
            outcomes[k] = outcome
        return outcomes

    def _acknowledge(
        self, pending: list[Received], outcomes: list[Outcome], sources: set[Source]
    ) -> None:
        """After the commit: have each message's source acknowledge it, count it, and tell
        devices what needs their attention."""
        committed = time.time() * 1000
        if len(sources) == 1:
            next(iter(sources)).ack(list(map(_ACK, pending)))
        else:
            for source in sources:
                source.ack([_ACK(m) for m in pending if m.source is source])
        self.acknowledged += len(pending)
        statuses, lags, unusual = tally(pending, outcomes)
        every = all(source.reaches_devices for source in sources)
        self.caps_teller.seen(told(pending, outcomes, reaching_only=not every))
        server = self.configs.server_id
        for message, outcome in unusual:
            # A device Zeal's broker does not reach (LoRaWAN): no notice, no reject budget.
            reached = message.source.reaches_devices
            if outcome.status == "stored":  # a reset or a jump (only stored batches are)
                statuses["sequence_reset"] += 1
                if reached:
                    reason = outcome.reason or "sequence_reset"
                    self.notices.notify(server, outcome, reason, message.payload)
            elif outcome.status == "rejected":
                self.rejected_by[outcome.reason or "unknown"] += 1
                self._log_rejects.reject(outcome.reason or "", outcome.stream, outcome.device)
                if reached:
                    self.budget.spend(message.topic)
                    self.notices.notify(server, outcome, outcome.reason or "", message.payload)
        self.counts.update(statuses)
        self.lags.observe_many(committed, lags)

    def _failed(self, pending: list[Received], exc: SQLAlchemyError) -> Literal["retry", "stopped"]:
        """Note a failed transaction and wait the backoff (0.5 s doubling to 10 s)."""
        self.database_ok = False
        self.last_error = f"database: {db_error_text(exc)}"
        log.error(
            "storing %d messages failed (%s); not acknowledged, retrying in %.1f s",
            len(pending),
            self.last_error,
            self._backoff,
        )
        self.ingest.forget()
        stopped = self._stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, 10.0)
        return "stopped" if stopped else "retry"


def told(
    messages: Sequence[Any], outcomes: list[Outcome], *, reaching_only: bool
) -> set[tuple[str, str]]:
    """(stream, device) of the batches stored in a committed round: the devices the
    collector tells their caps (broker.devicecaps; with `reaching_only`, only those whose
    source reaches devices over Zeal's broker, not LoRaWAN devices). Sets built in C: no
    Python code runs per message of a round from such sources only."""
    stored = list(map("stored".__eq__, map(_STATUS, outcomes)))
    if reaching_only:
        stored = [s and m.source.reaches_devices for s, m in zip(stored, messages, strict=True)]
    kept = list(compress(outcomes, stored))
    return set(zip(map(_STREAM, kept), map(_DEVICE, kept), strict=True))


def tally(
    messages: Sequence[Any], outcomes: list[Outcome]
) -> tuple[Counter[str], list[int], list[tuple[Any, Outcome]]]:
    """A committed round's figures: its outcomes counted by status (and "readings", those
    stored), the arrival times (``received_ms``) of the stored messages, and the messages
    that need more than counting, resets and rejects, with their outcomes. A pass per
    figure with C-level getters: no Python code runs per message of a usual round."""
    statuses = Counter(map(_STATUS, outcomes))
    if statuses["stored"] == len(outcomes):  # the usual round
        lags = list(map(_RECEIVED_MS, messages))
        statuses["readings"] = sum(map(_READINGS, outcomes))
        unusual = list(compress(zip(messages, outcomes, strict=True), map(_RESET, outcomes)))
        return statuses, lags, unusual
    stored = [status == "stored" for status in map(_STATUS, outcomes)]
    lags = list(map(_RECEIVED_MS, compress(messages, stored)))
    statuses["readings"] = sum(map(_READINGS, compress(outcomes, stored)))
    unusual = [
        (message, outcome)
        for message, outcome in zip(messages, outcomes, strict=True)
        if (outcome.reset and outcome.status == "stored") or outcome.status == "rejected"
    ]
    return statuses, lags, unusual
