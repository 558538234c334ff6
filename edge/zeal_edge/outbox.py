"""The agent's durable state in SQLite: encoded batches awaiting PUBACK, sequences, budget.

One database serves any number of *namespaces* (a stream and device pair), so the simulator
keeps thousands of virtual devices in one file. What is stored is only what may leave the
device anyway (encoded, perturbed batches) and bookkeeping: sequence numbers, integer
privacy spend per second, counters and the replay position of a file source. Raw readings
are never written.

A batch and everything it changes (its sequence number, the budget it spends, the source
position) are committed in one transaction, so a crash leaves either all of it or none.

Each namespace also keeps the agent's *instance* id (made once, sent in its presence
messages), a *halt* (why the server stopped accepting the stream, so a restart does not
spend budget on it again), readings skipped as not finite, and rejects the server reported.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from zeal.mqtt.topics import message_digest
from zeal.policy import cap_micro as policy_cap
from zeal_edge.errors import OutboxError
from zeal_edge.outbox_schema import ADDED_COLUMNS, BOOK, SCHEMA, SPENT
from zeal_edge.records import Halt, NamespaceStatus, PendingBatch, SealedBatch

__all__ = ["Outbox"]

#: How long a namespace that never set a budget window keeps its per-second spend.
_UNSET_WINDOW_S = 7 * 86_400
#: Batches whose digests are kept after their commit, per namespace (at least: pruned once
#: a minute): a notice about an older one is not acted on. 24 bytes a batch.
SENT_KEPT = 4096
#: The namespace columns ``Outbox.mark`` reads and sets.
MARKS = frozenset({"revision", "released_ms", "notice_ms", "given_key"})


def _digest_key(digest: str) -> int:
    """A ``zeal.mqtt.topics.message_digest`` as the signed 64-bit integer kept in ``sent``."""
    return int.from_bytes(bytes.fromhex(digest), "big", signed=True)


def namespace_of(stream: str, device: str) -> str:
    """The namespace key of a stream and device (both are single topic levels)."""
    return f"{stream}/{device}"


def _journal_in_wal(db: sqlite3.Connection) -> None:
    """WAL journal mode. Switching a new file to it needs the file to itself, and SQLite
    answers "database is locked" at once (no busy wait) while another process opens it:
    two agents started together on one data directory. Tried again for up to 5 s."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
        else:
            return


class Outbox:
    """SQLite-backed outbox; one instance per process, used from one thread at a time."""

    def __init__(self, path: Path, *, digests: bool = True) -> None:
        """`digests`: keep the digests of the last batches sent (``sent``), which an
        agent's notices are checked against; a simulator, which reads no notices, keeps
        none."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.digests = digests
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        _journal_in_wal(self._db)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._pruned_ms = -(1 << 62)
        # Two agents started together on one data directory (the README's two kitchens)
        # both found a column missing and both added it; under the write lock (BEGIN
        # IMMEDIATE) the second finds it there.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            present = {row[1] for row in self._db.execute("PRAGMA table_info(namespaces)")}
            for column, kind in ADDED_COLUMNS.items():
                if column not in present:
                    self._db.execute(f"ALTER TABLE namespaces ADD COLUMN {column} {kind}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def ensure(self, stream: str, device: str) -> str:
        """Create the namespace if new; return its key."""
        ns = namespace_of(stream, device)
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO namespaces (namespace, stream, device, instance) "
                "VALUES (?, ?, ?, ?)",
                (ns, stream, device, secrets.token_hex(8)),
            )
        return ns

    def _one(self, query: str, namespace: str) -> Any:
        with self._lock:
            row = self._db.execute(query, (namespace,)).fetchone()
        if row is None:
            raise OutboxError(f"the outbox has no stream namespace {namespace!r}")
        return row[0]

    def instance(self, namespace: str) -> str:
        """The id of this outbox's agent for the namespace (made once, kept)."""
        value = self._one("SELECT instance FROM namespaces WHERE namespace = ?", namespace)
        if value is None:  # an outbox from before instance ids
            value = secrets.token_hex(8)
            with self._lock:
                self._db.execute(
                    "UPDATE namespaces SET instance = ? WHERE namespace = ?", (value, namespace)
                )
        return str(value)

    def is_new(self, namespace: str) -> bool:
        """Whether nothing was ever committed in the namespace."""
        query = "SELECT next_sequence FROM namespaces WHERE namespace = ?"
        return int(self._one(query, namespace)) == 0

    def halt(self, namespace: str) -> Halt | None:
        text = self._one("SELECT halt FROM namespaces WHERE namespace = ?", namespace)
        return None if text is None else Halt.from_json(text)

    def set_halt(self, namespace: str, halt: Halt | None) -> None:
        """Record (or with None clear) why the agent stopped sending this stream."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET halt = ? WHERE namespace = ?",
                (None if halt is None else halt.to_json(), namespace),
            )

    def origin(self, namespace: str) -> str | None:
        """The server and creation time (``zeal.mqtt.streamconfig.StreamConfig.origin``) of the
        stream configuration this namespace was first configured by, or None."""
        value = self._one("SELECT origin FROM namespaces WHERE namespace = ?", namespace)
        return None if value is None else str(value)

    def set_origin(self, namespace: str, origin: str | None) -> None:
        """Pin the namespace to a configuration's origin (None: the next one is pinned)."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET origin = ? WHERE namespace = ?", (origin, namespace)
            )

    def server_key(self, namespace: str) -> str | None:
        """The server's public key pinned for this namespace (zeal_edge.trust), or None."""
        value = self._one("SELECT server_key FROM namespaces WHERE namespace = ?", namespace)
        return None if value is None else str(value)

    def set_server_key(self, namespace: str, key: str | None) -> None:
        """Pin the key the namespace's configurations and notices must verify under."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET server_key = ? WHERE namespace = ?", (key, namespace)
            )

    def mark(self, namespace: str, column: str) -> int | str | None:
        """A namespace's mark of what it trusts (``MARKS``): the revision of the
        configuration it follows, the newest release it saw, when the last notice it acted
        on was issued, the key given when its key was pinned."""
        if column not in MARKS:
            raise OutboxError(f"no such mark: {column!r}")
        value: int | str | None = self._one(
            f"SELECT {column} FROM namespaces WHERE namespace = ?", namespace
        )
        return value

    def set_mark(self, namespace: str, column: str, value: int | str | None) -> None:
        if column not in MARKS:
            raise OutboxError(f"no such mark: {column!r}")
        with self._lock:
            self._db.execute(
                f"UPDATE namespaces SET {column} = ? WHERE namespace = ?", (value, namespace)
            )

    def record_ignored(self, namespace: str, kind: str, *, now_ms: int) -> None:
        """Count a signed message of its server that the agent ignored, by why (`kind`)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO ignored (namespace, kind, count, last_ms) VALUES (?, ?, 1, ?) "
                "ON CONFLICT (namespace, kind) DO UPDATE SET count = count + 1, last_ms = ?",
                (namespace, kind, now_ms, now_ms),
            )

    def sent_sequence(self, namespace: str, digest: str) -> int | None:
        """The sequence of the batch with this digest (``message_digest``) among the last
        SENT_KEPT committed, or None when it is not one of them."""
        key = _digest_key(digest)
        with self._lock:
            row = self._db.execute(
                "SELECT sequence FROM sent WHERE namespace = ? AND digest = ? "
                "ORDER BY sequence DESC LIMIT 1",
                (namespace, key),
            ).fetchone()
        return None if row is None else int(row[0])

    def record_unverified(self, namespace: str) -> None:
        """Count a message ignored because it was not signed by the server's key."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET unverified = unverified + 1 WHERE namespace = ?",
                (namespace,),
            )

    def advance_sequence(self, namespace: str, at_least: int) -> bool:
        """Make the next sequence number at least `at_least` (True if it moved)."""
        with self._lock:
            moved = self._db.execute(
                "UPDATE namespaces SET next_sequence = ? WHERE namespace = ? AND next_sequence < ?",
                (at_least, namespace, at_least),
            ).rowcount
        return bool(moved)

    def record_invalid(self, namespace: str, count: int) -> None:
        """Count readings skipped because they were not finite numbers."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET skipped_invalid = skipped_invalid + ? WHERE namespace = ?",
                (count, namespace),
            )

    def forget(self, namespace: str) -> None:
        """Remove everything kept for a namespace: its status, batches, rejects and ledgers."""
        with self._lock, self._db:
            for table in (
                *("batches", "server_rejects", "day_spend", "hour_spend", "spend"),
                *("sent", "ignored"),
            ):
                self._db.execute(f"DELETE FROM {table} WHERE namespace = ?", (namespace,))
            self._db.execute("DELETE FROM namespaces WHERE namespace = ?", (namespace,))

    def record_clipped(self, namespace: str, low: int, high: int) -> None:
        """Count readings below and above the stream's range (sent as its ends)."""
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET clipped_low = clipped_low + ?, "
                "clipped_high = clipped_high + ? WHERE namespace = ?",
                (low, high, namespace),
            )

    def record_server_reject(self, namespace: str, reason: str, *, now_ms: int) -> None:
        """Count a reject the server reported on the device's notice topic."""
        with self._lock:
            self._db.execute(
                "INSERT INTO server_rejects (namespace, reason, count, last_ms) "
                "VALUES (?, ?, 1, ?) ON CONFLICT (namespace, reason) "
                "DO UPDATE SET count = count + 1, last_ms = ?",
                (namespace, reason, now_ms, now_ms),
            )

    def next_sequence(self, namespace: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT next_sequence FROM namespaces WHERE namespace = ?", (namespace,)
            ).fetchone()
        if row is None:
            raise OutboxError(f"the outbox has no stream namespace {namespace!r}")
        return int(row[0])

    def next_sequences(self) -> dict[str, int]:
        """The next sequence number of every namespace (one query, for many devices)."""
        with self._lock:
            rows = self._db.execute("SELECT namespace, next_sequence FROM namespaces").fetchall()
        return {str(ns): int(seq) for ns, seq in rows}

    def source_offset(self, namespace: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT source_offset FROM namespaces WHERE namespace = ?", (namespace,)
            ).fetchone()
        return int(row[0]) if row else 0

    def commit_batches(
        self,
        batches: Sequence[SealedBatch],
        *,
        now_ms: int,
        fingerprint: str,
    ) -> None:
        """Store batches atomically.

        Each batch's sequence must be its namespace's next one (else OutboxError, and
        nothing is stored). The spend is booked at the current second; a source offset
        (file replay position) is saved when given.
        """
        second = now_ms // 1000
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for batch in batches:
                    ns, seq, payload = batch.namespace, batch.sequence, batch.payload
                    readings, micro, offset = batch.readings, batch.spend_micro, batch.offset
                    updated = self._db.execute(
                        "UPDATE namespaces SET next_sequence = ?, fingerprint = ?, "
                        "source_offset = COALESCE(?, source_offset) "
                        "WHERE namespace = ? AND next_sequence = ?",
                        (seq + 1, fingerprint, offset, ns, seq),
                    ).rowcount
                    if updated != 1:
                        # rolled back by the handler below, like any other failure
                        raise OutboxError(f"sequence {seq} is not the next one of {ns}")  # noqa: TRY301
                    self._db.execute(
                        "INSERT INTO batches (namespace, sequence, payload, readings, created_ms) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (ns, seq, payload, readings, now_ms),
                    )
                    if self.digests:
                        self._db.execute(
                            "INSERT OR REPLACE INTO sent (namespace, sequence, digest) "
                            "VALUES (?, ?, ?)",
                            (ns, seq, _digest_key(message_digest(payload))),
                        )
                    if micro:
                        self._db.execute(
                            "INSERT INTO spend (namespace, second, micro) VALUES (?, ?, ?) "
                            "ON CONFLICT (namespace, second) DO UPDATE SET micro = micro + ?",
                            (ns, second, micro, micro),
                        )
                    if batch.memo is not None:
                        self._db.execute(
                            "INSERT OR REPLACE INTO memos (namespace, memo) VALUES (?, ?)",
                            (ns, batch.memo),
                        )
                    for kind, booked in (("day", batch.days), ("hour", batch.hours)):
                        for period, spent in booked:  # the policy's ledgers
                            self._db.execute(BOOK[kind], (ns, period, spent, spent))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            if now_ms - self._pruned_ms >= 60_000:  # at most once a minute
                self._prune_spend(second)

    def _prune_spend(self, second: int) -> None:
        """Forget spend older than the longest budget window each namespace was run with
        (a week if it never set one): the per-second ledger would otherwise grow by a row
        per committed second, forever. The policy's day and hour ledgers are kept. The
        digests of all but the last SENT_KEPT batches go too."""
        self._db.execute(
            "DELETE FROM spend WHERE second <= ? - COALESCE((SELECT kept_window_s FROM "
            "namespaces n WHERE n.namespace = spend.namespace), ?)",
            (second, _UNSET_WINDOW_S),
        )
        self._db.execute(
            "DELETE FROM sent WHERE sequence < (SELECT next_sequence FROM namespaces n "
            "WHERE n.namespace = sent.namespace) - ?",
            (SENT_KEPT,),
        )
        self._pruned_ms = second * 1000

    def pending(self, namespace: str | None = None, *, limit: int = 1000) -> list[PendingBatch]:
        """Unacknowledged batches in sequence order (per namespace), oldest first."""
        query = "SELECT namespace, sequence, payload, readings FROM batches"
        args: tuple[object, ...] = ()
        if namespace is not None:
            query += " WHERE namespace = ?"
            args = (namespace,)
        query += " ORDER BY created_ms, namespace, sequence LIMIT ?"
        with self._lock:
            rows = self._db.execute(query, (*args, limit)).fetchall()
        return [PendingBatch(ns, int(seq), bytes(p), int(n)) for ns, seq, p, n in rows]

    def pending_keys(self) -> list[tuple[str, int]]:
        """Every unacknowledged (namespace, sequence), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT namespace, sequence FROM batches ORDER BY created_ms, namespace, sequence"
            ).fetchall()
        return [(str(ns), int(seq)) for ns, seq in rows]

    def payload(self, namespace: str, sequence: int) -> bytes | None:
        """The stored bytes of a batch (None once acknowledged)."""
        with self._lock:
            row = self._db.execute(
                "SELECT payload FROM batches WHERE namespace = ? AND sequence = ?",
                (namespace, sequence),
            ).fetchone()
        return None if row is None else bytes(row[0])

    def acknowledge(self, acked: list[tuple[str, int]]) -> None:
        """Delete acknowledged batches and count them as sent."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for ns, seq in acked:
                    row = self._db.execute(
                        "DELETE FROM batches WHERE namespace = ? AND sequence = ? "
                        "RETURNING readings",
                        (ns, seq),
                    ).fetchone()
                    if row is None:
                        continue  # a duplicate acknowledgement
                    self._db.execute(
                        "UPDATE namespaces SET sent_batches = sent_batches + 1, "
                        "sent_readings = sent_readings + ?, "
                        "last_acked = MAX(COALESCE(last_acked, -1), ?) WHERE namespace = ?",
                        (int(row[0]), seq, ns),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def memo(self, namespace: str) -> str | None:
        """A longitudinal stream's memo table as committed with its last new draw (JSON)."""
        with self._lock:
            row = self._db.execute(
                "SELECT memo FROM memos WHERE namespace = ?", (namespace,)
            ).fetchone()
        return None if row is None else str(row[0])

    def spent(self, namespace: str, *, now_ms: int, window_s: int) -> int:
        """Micro-epsilon spent in the rolling window ending now (integer)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(micro), 0) FROM spend WHERE namespace = ? AND second > ?",
                (namespace, now_ms // 1000 - window_s),
            ).fetchone()
        return int(row[0])

    def spend_history(self, namespace: str, *, now_ms: int, window_s: int) -> list[tuple[int, int]]:
        """(second, micro) spends inside the window, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT second, micro FROM spend WHERE namespace = ? AND second > ? "
                "ORDER BY second",
                (namespace, now_ms // 1000 - window_s),
            ).fetchall()
        return [(int(s), int(m)) for s, m in rows]

    def spent_by_day(self, namespace: str, since: int, *, kind: str = "day") -> dict[int, int]:
        """Micro-epsilon booked per UTC day (or hour, `kind`) of the readings' stamps, from
        day (or hour) `since` on."""
        query = SPENT[kind]
        with self._lock:
            return {int(p): int(m) for p, m in self._db.execute(query, (namespace, since))}

    def device_spent(self, device: str, period: int, *, kind: str = "day") -> int:
        """Micro-epsilon booked for readings of UTC day (or hour, `kind`) `period` over
        every stream of `device` this outbox holds (its cap across streams)."""
        if kind not in ("day", "hour"):
            raise ValueError(kind)
        with self._lock:
            row = self._db.execute(
                f"SELECT COALESCE(SUM(s.micro), 0) FROM {kind}_spend s JOIN namespaces n "
                f"ON n.namespace = s.namespace WHERE n.device = ? AND s.{kind} = ?",
                (device, period),
            ).fetchone()
        return int(row[0])

    def learned_caps(self, device: str) -> tuple[int, int, dict[int, float | None]] | None:
        """(revision, issued_ms, caps by horizon in UTC days) of the caps document its
        server last told `device` and the agent adopted, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT revision, issued_ms, caps FROM device_caps WHERE device = ?", (device,)
            ).fetchone()
        if row is None:
            return None
        caps = {int(days): value for days, value in json.loads(row[2]).items()}
        return int(row[0]), int(row[1]), caps

    def set_learned_caps(
        self, device: str, revision: int, issued_ms: int, caps: dict[int, float | None]
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO device_caps (device, revision, issued_ms, caps) "
                "VALUES (?, ?, ?, ?)",
                (device, revision, issued_ms, json.dumps({str(d): c for d, c in caps.items()})),
            )

    def device_days(self, device: str, first: int, last: int) -> dict[int, int]:
        """Micro-epsilon booked per UTC day from `first` to `last` over every stream of
        `device` this outbox holds (its caps over 30 and 365 days)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT s.day, SUM(s.micro) FROM day_spend s JOIN namespaces n "
                "ON n.namespace = s.namespace WHERE n.device = ? AND s.day BETWEEN ? AND ? "
                "GROUP BY s.day",
                (device, first, last),
            ).fetchall()
        return {int(d): int(m) for d, m in rows}

    def set_policy(
        self,
        namespace: str,
        *,
        cost_micro: int,
        cap_micro: int | None,
        window_s: int,
        max_epsilon_per_day: float | None = None,
    ) -> None:
        """Record the budget policy in force, for ``zeal-edge status``."""
        day_cap_micro = None if max_epsilon_per_day is None else policy_cap(max_epsilon_per_day)
        with self._lock:
            self._db.execute(
                "UPDATE namespaces SET cost_micro = ?, cap_micro = ?, window_s = ?, "
                "day_cap_micro = ?, kept_window_s = MAX(COALESCE(kept_window_s, 0), ?) "
                "WHERE namespace = ?",
                (cost_micro, cap_micro, window_s, day_cap_micro, window_s, namespace),
            )

    def record_skips(
        self, namespace: str, count: int, *, now_ms: int, policy: bool = False
    ) -> None:
        """Count readings skipped at the agent's own cap, or at the stream's policy."""
        column = "skipped_policy" if policy else "skipped_budget"
        with self._lock:
            self._db.execute(
                f"UPDATE namespaces SET {column} = {column} + ?, last_skip_ms = ? "
                "WHERE namespace = ?",
                (count, now_ms, namespace),
            )

    def status(self) -> list[NamespaceStatus]:
        with self._lock:
            rows = self._db.execute(
                "SELECT n.namespace, stream, device, next_sequence, last_acked, "
                "COUNT(b.sequence), COALESCE(SUM(b.readings), 0), sent_batches, sent_readings, "
                "skipped_budget, last_skip_ms, fingerprint, cost_micro, cap_micro, window_s, "
                "skipped_invalid, halt, day_cap_micro, skipped_policy, clipped_low, clipped_high, "
                "server_key, unverified "
                "FROM namespaces n "
                "LEFT JOIN batches b ON b.namespace = n.namespace GROUP BY n.namespace "
                "ORDER BY n.namespace"
            ).fetchall()
            rejects: dict[str, dict[str, int]] = {}
            for ns, reason, count in self._db.execute(
                "SELECT namespace, reason, count FROM server_rejects ORDER BY reason"
            ):
                rejects.setdefault(ns, {})[reason] = int(count)
            ignored: dict[str, dict[str, int]] = {}
            for ns, kind, count in self._db.execute(
                "SELECT namespace, kind, count FROM ignored ORDER BY kind"
            ):
                ignored.setdefault(ns, {})[kind] = int(count)
        names = [f.name for f in fields(NamespaceStatus)][:16]
        return [
            NamespaceStatus(
                **dict(zip(names, row[:16], strict=True)),
                halt=None if row[16] is None else Halt.from_json(row[16]),
                server_rejects=rejects.get(row[0], {}),
                day_cap_micro=row[17],
                skipped_policy=int(row[18]),
                clipped_low=int(row[19]),
                clipped_high=int(row[20]),
                server_key=row[21],
                unverified=int(row[22]),
                ignored=ignored.get(row[0], {}),
            )
            for row in rows
        ]
