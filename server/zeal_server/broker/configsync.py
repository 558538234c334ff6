"""The broker's retained stream configurations, kept true to the database.

Agents configure themselves from ``zeal/v1/{stream}/config``, so a configuration on the
broker that the database no longer backs makes them spend privacy budget on batches nobody
stores. The collector's writer thread calls :meth:`ConfigSync.sync` every few seconds (and
at once after a connect or a change made through this process's API):

- every stream of the database has its configuration retained (with this installation's
  id as ``server``, its creation time and unit);
- a configuration this installation published for a stream it no longer has is replaced
  by the stream's signed tombstone (``store.tombstone_of``: agents on it halt);
- a configuration another installation (or anyone who may retain on the topic: a leaked
  collector login) retained for one of this server's streams is replaced by this server's
  own within seconds, with a warning: agents pinned to this server halt on the foreign one
  rather than follow it (zeal_edge.configs), and new agents must find this server's. At
  most once every ``REASSERT_EVERY`` seconds per stream, so two servers that share a stream
  name on one broker do not flood it (their agents halt: rename one of the streams);
- other installations' configurations of streams this server does not have are left alone.

What the broker holds is learnt from the collector's subscription to
``zeal/v1/+/config`` (retained messages once, other servers' changes as they happen; its
own publications are not echoed back), fed in with :meth:`seen` from paho's thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal.mqtt.streamconfig import is_tombstone
from zeal.mqtt.topics import config_topic
from zeal_server import store

__all__ = ["ConfigSync"]

log = logging.getLogger(__name__)
#: The shortest time between two re-assertions of one stream's configuration (seconds).
REASSERT_EVERY = 5.0


class ConfigSync:
    """What the broker holds, and how to make it match the database."""

    def __init__(
        self, publish: Callable[[str, bytes], object], sessions: sessionmaker[Session]
    ) -> None:
        self._publish, self.sessions = publish, sessions
        #: The installation id of the database, and its signer, once read.
        self.server_id: str | None = None
        self.signer: store.Signer | None = None
        #: Set when a sync should run at once (a change through this process, a message).
        self.changed = threading.Event()
        self._on_broker: dict[str, dict[str, Any] | None] = {}  # None: cleared
        self._lock = threading.Lock()
        self._warned: dict[str, float] = {}
        self._reasserted: dict[str, float] = {}
        # Documents by stream id, revision and signing key: the writer thread syncs every
        # few seconds, and building a document derives the stream's mechanism again.
        self._documents: dict[tuple[int, int, str], dict[str, Any]] = {}

    def publish(self, document: dict[str, Any]) -> None:
        """Retain a stream's configuration document."""
        name = document["stream"]
        self._publish(config_topic(name), json.dumps(document).encode())
        with self._lock:
            self._on_broker[name] = document

    def withdraw(self, tombstone: dict[str, Any]) -> None:
        """Retain a deleted stream's signed tombstone (store.tombstone_of) in place of its
        configuration: agents on that stream verify it and halt."""
        self.publish(tombstone)

    def forget_broker(self) -> None:
        """After a (re)connect: what the broker holds is read again from its retained
        messages."""
        with self._lock:
            self._on_broker.clear()

    def seen(self, stream: str, payload: bytes) -> None:
        """A configuration message arrived (paho's thread)."""
        document: dict[str, Any] | None = None
        if payload:
            try:
                loaded = json.loads(payload)
            except (UnicodeDecodeError, json.JSONDecodeError):
                loaded = None
            document = loaded if isinstance(loaded, dict) else {"unreadable": True}
        with self._lock:
            self._on_broker[stream] = document
        self.changed.set()

    def sync(self, *, force: bool) -> dict[str, tuple[int, str]] | None:
        """Make the broker match the database (module docstring); returns the database's
        stream ids and fingerprints by name, or None when the database could not be read.

        ``force`` (after a connect) publishes every stream's configuration, since the broker
        may have lost them.
        """
        self.changed.clear()
        try:
            with self.sessions() as session:
                self.server_id = server = store.installation_id(session)
                self.signer = signer = store.signer(session)
                streams = store.list_streams(session)
                ids = {s.name: (s.id, s.fingerprint) for s in streams}
                keys = {s.name: (s.id, s.revision, signer.public) for s in streams}
                self._documents = {
                    keys[s.name]: self._documents.get(keys[s.name])
                    or store.config_of(session, s, server)
                    for s in streams
                }
                ours = {s.name: self._documents[keys[s.name]] for s in streams}
        except SQLAlchemyError as exc:
            log.error("could not read the streams to publish their configurations: %s", exc)
            return None
        with self._lock:
            there = dict(self._on_broker)
        for name, document in ours.items():
            held = there.get(name)
            other = held.get("server") if held else None
            if held == document and not force:
                continue
            if other not in (None, server) and not force:
                self._warn_foreign(name, str(other))
                now = time.monotonic()
                if now - self._reasserted.get(name, -1e18) < REASSERT_EVERY:
                    continue
                self._reasserted[name] = now
            self.publish(document)
        gone = {
            name: held["created_ms"]
            for name, held in there.items()
            if name not in ours
            and held is not None
            and held.get("server") == server
            and not is_tombstone(held)
            and isinstance(held.get("created_ms"), int)
        }
        if gone:
            self._bury(gone)
        return ids

    def _bury(self, gone: dict[str, int]) -> None:
        """Retain the tombstones of streams this installation configured on the broker and
        no longer has (deleted by another process on the database)."""
        try:
            with self.sessions() as session:
                tombstones = [store.tombstone_of(session, n, c) for n, c in gone.items()]
        except SQLAlchemyError as exc:
            log.error("could not sign the tombstones of deleted streams: %s", exc)
            return
        for tombstone in tombstones:
            log.info("stream %s no longer exists: retaining its tombstone", tombstone["stream"])
            self.withdraw(tombstone)

    def _warn_foreign(self, name: str, other: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(name, -1e18) >= 600:
            self._warned[name] = now
            log.warning(
                "stream %s: the broker holds a configuration of another server (%s), not "
                "of this one (%s); retaining this server's again. Agents that saw it have "
                "halted. Two servers using the stream name %s on one broker, or someone "
                "who may retain configurations (a leaked collector login): rename one of "
                "the streams, or change the collector's password.",
                name,
                other,
                self.server_id,
                name,
            )
