"""The collector's MQTT client id: unique per server process, stable across its restarts.

Two collectors with one client id take each other's persistent session over, again and
again, and each acknowledges messages meant for the other. Without ``ZEAL_COLLECTOR_ID``
a server therefore claims a *slot* in its data directory: ``collector-0.id`` holds an id
made once (``zeal-collector-HOSTNAME-RANDOM``), and the process keeps an exclusive lock on
that file while it runs. A restart takes the same slot again and so resumes its session;
a second server started beside it (same directory) finds slot 0 locked and takes slot 1,
with an id of its own.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
from pathlib import Path
from typing import IO

from zeal.mqtt.client import owned_client_id
from zeal_server.errors import IdentityError
from zeal_server.settings import ServerSettings

__all__ = [
    "MAX_SLOTS",
    "SESSION_TAKEN_OVER",
    "TAKEOVER_RETRY",
    "CollectorIdentity",
    "claim_collector_id",
    "collector_client_id",
    "takeover_text",
]

MAX_SLOTS = 64
#: MQTT v5 reason code of a DISCONNECT sent because another client took the session.
SESSION_TAKEN_OVER = 142
#: Seconds the collector waits before it takes its session back after a takeover: not at
#: once (two collectors with one id would fight without pause), never long (a taker that
#: started clean and left took the session with it: the broker drops the devices' data
#: meanwhile, which agents then keep and send again, docs/edge-agent.md).
TAKEOVER_RETRY = 5


class CollectorIdentity:
    """A claimed client id; ``release()`` (or process exit) frees its slot."""

    def __init__(self, client_id: str, handle: IO[str] | None) -> None:
        self.client_id, self._handle = client_id, handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None


def claim_collector_id(data_dir: Path) -> CollectorIdentity:
    """Claim the first free slot of `data_dir` (see the module docstring)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_SLOTS):
        path = data_dir / f"collector-{slot}.id"
        handle = path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        client_id = handle.read().strip()
        if not client_id:
            client_id = f"zeal-collector-{socket.gethostname()}-{secrets.token_hex(4)}"
            handle.write(client_id + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return CollectorIdentity(client_id, handle)
    raise IdentityError(
        f"{MAX_SLOTS} servers already run with the data directory {data_dir}; "
        "give each its own ZEAL_DATA_DIR or ZEAL_COLLECTOR_ID"
    )


def collector_client_id(settings: ServerSettings) -> tuple[CollectorIdentity | None, str]:
    """The collector's claim (None with ``ZEAL_COLLECTOR_ID``) and its client id: the id
    claimed or set, under its broker login (``zeal.mqtt.client.owned_client_id``). Its own
    id, not the login: another connection under the login (an operator's tool, a leaked
    password) lands on a session of its own instead of taking the collector's, whose clean
    start would wipe what the broker queued for it; deploy/mosquitto's plugin keeps other
    logins off the id."""
    claim = None
    if settings.collector_id is None:
        claim = claim_collector_id(settings.data_dir)
        claimed = claim.client_id
    else:
        claimed = settings.collector_id
    login = settings.broker.username if settings.broker is not None else None
    return claim, owned_client_id(login, claimed)


def takeover_text(client_id: str, *, flapping: bool) -> str:
    """Why the collector lost its session: the broker said another client took it over,
    or (brokers that do not say) its connection was closed soon after each of 3 connects."""
    if not flapping:
        return (
            f"another client connected with this collector's client id {client_id!r} and "
            "took its session over"
        )
    return (
        "the broker closed the collector's connection 3 times within a minute, each time "
        "soon after it was made: another client probably uses its client id "
        f"{client_id!r} and takes its session over"
    )
