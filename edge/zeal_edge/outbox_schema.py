"""The outbox's SQLite schema (zeal_edge.outbox): its tables, the columns added to
``namespaces`` since the first release, and the statements of the privacy policy's ledgers
(micro-epsilon booked per UTC day and per UTC hour of the readings' stamps)."""

from __future__ import annotations

__all__ = ["ADDED_COLUMNS", "BOOK", "SCHEMA", "SPENT"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS namespaces (
    namespace TEXT PRIMARY KEY,
    stream TEXT NOT NULL,
    device TEXT NOT NULL,
    next_sequence INTEGER NOT NULL DEFAULT 0,
    last_acked INTEGER,
    sent_batches INTEGER NOT NULL DEFAULT 0,
    sent_readings INTEGER NOT NULL DEFAULT 0,
    skipped_budget INTEGER NOT NULL DEFAULT 0,
    last_skip_ms INTEGER,
    source_offset INTEGER NOT NULL DEFAULT 0,
    fingerprint TEXT,
    cost_micro INTEGER,
    cap_micro INTEGER,
    window_s INTEGER
);
CREATE TABLE IF NOT EXISTS server_rejects (
    namespace TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, reason)
);
CREATE TABLE IF NOT EXISTS batches (
    namespace TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    payload BLOB NOT NULL,
    readings INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, sequence)
);
CREATE TABLE IF NOT EXISTS day_spend (
    namespace TEXT NOT NULL,
    day INTEGER NOT NULL,
    micro INTEGER NOT NULL,
    PRIMARY KEY (namespace, day)
);
CREATE TABLE IF NOT EXISTS hour_spend (
    namespace TEXT NOT NULL,
    hour INTEGER NOT NULL,
    micro INTEGER NOT NULL,
    PRIMARY KEY (namespace, hour)
);
CREATE TABLE IF NOT EXISTS spend (
    namespace TEXT NOT NULL,
    second INTEGER NOT NULL,
    micro INTEGER NOT NULL,
    PRIMARY KEY (namespace, second)
);
-- The digests of the last batches committed (zeal.mqtt.topics.message_digest as a signed
-- 64-bit integer): a notice counts only if it is about one of them (zeal_edge.notices).
CREATE TABLE IF NOT EXISTS sent (
    namespace TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    digest INTEGER NOT NULL,
    PRIMARY KEY (namespace, sequence)
);
CREATE INDEX IF NOT EXISTS sent_by_digest ON sent (namespace, digest);
-- Signed messages from its server the agent ignored, by why: stale, not for it, ...
CREATE TABLE IF NOT EXISTS ignored (
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    count INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    PRIMARY KEY (namespace, kind)
);
-- A device's caps across streams as its server last told them (zeal_edge.devicecaps): the
-- revision and issue time of the document adopted, and its caps (JSON, epsilon by horizon).
-- A longitudinal stream's memo table (zeal.longitudinal.Memo as JSON: the device's secret
-- offset and the code drawn for each grid value met), written with the batch that first
-- sends a new draw. Never logged, never sent.
CREATE TABLE IF NOT EXISTS memos (
    namespace TEXT PRIMARY KEY,
    memo TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS device_caps (
    device TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    issued_ms INTEGER NOT NULL,
    caps TEXT NOT NULL
);
"""


#: Columns added to ``namespaces`` after the first release, with their SQL types: an outbox
#: written by an older agent gains them when it is opened.
ADDED_COLUMNS = {
    "instance": "TEXT",
    "skipped_invalid": "INTEGER NOT NULL DEFAULT 0",
    "halt": "TEXT",
    "day_cap_micro": "INTEGER",
    "skipped_policy": "INTEGER NOT NULL DEFAULT 0",
    # the longest --budget-window-seconds used: spend older than it is pruned (kept a week if unset)
    "kept_window_s": "INTEGER",
    # "{server}/{created_ms}" of the first configuration adopted from the broker (the pin)
    "origin": "TEXT",
    # readings outside the stream's range, sent as its nearer end (Zeal.perturb clips)
    "clipped_low": "INTEGER NOT NULL DEFAULT 0",
    "clipped_high": "INTEGER NOT NULL DEFAULT 0",
    # the server's public key (base64) its configurations and notices must verify under
    "server_key": "TEXT",
    # messages on its configuration and notice topics ignored: not signed by that key
    "unverified": "INTEGER NOT NULL DEFAULT 0",
    # the revision of the configuration it follows (an older one is ignored)
    "revision": "INTEGER",
    # the newest release (released_ms) it saw of its stream (an older one is ignored)
    "released_ms": "INTEGER",
    # when the last notice it acted on was issued (an older one is ignored)
    "notice_ms": "INTEGER",
    # the key given (--server-key) when server_key was pinned: a key given anew re-pins
    "given_key": "TEXT",
}


#: Booking a batch's spend on the policy's ledgers, and reading them back, per period kind.
BOOK = {
    kind: f"INSERT INTO {kind}_spend (namespace, {kind}, micro) VALUES (?, ?, ?) "
    f"ON CONFLICT (namespace, {kind}) DO UPDATE SET micro = micro + ?"
    for kind in ("day", "hour")
}
SPENT = {
    kind: f"SELECT {kind}, micro FROM {kind}_spend WHERE namespace = ? AND {kind} >= ?"
    for kind in ("day", "hour")
}
