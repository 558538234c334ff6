"""HTTP connections that cost their holder, not the other clients.

uvicorn has no time limit on reading a request, and its only guard, ``limit_concurrency``,
answers 503 to *every* request once that many connections are open: 1,000 sockets held
open by one address made ``/livez`` fail too (an orchestrator would then restart a healthy
server and its collector). :class:`GuardedH11` is uvicorn's h11 protocol with three limits
instead:

- **per peer**: at most ``per_peer`` connections at once from one address
  (``ZEAL_HTTP_CONNECTIONS_PER_PEER``; 0: no limit, for a server behind a proxy that
  enforces its own); a connection past it is closed as soon as it is made;
- **in all**: at most ``TOTAL`` connections; past it, new connections are closed at once
  (the process's file descriptors are the limit this protects);
- **request time**: a request's headers and body must arrive within ``REQUEST_SECONDS`` of
  the connection (or of the previous response on a kept-alive one), else the connection
  is closed. Once a request is in, the application takes the time it needs.

Every connection closed by a limit is counted by reason (:data:`CLOSED`, served as
``zeal_http_connections_closed_total``) and logged at most once a minute per reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["CLOSED", "REQUEST_SECONDS", "TOTAL", "GuardedH11", "guarded"]

log = logging.getLogger(__name__)
#: Seconds a client has to send a whole request (headers and body).
REQUEST_SECONDS = 10.0
#: Open connections at most, in all.
TOTAL = 4096
#: Connections closed by a limit, by reason: per_peer, total, slow_request.
CLOSED: Counter[str] = Counter()
_open: Counter[str] = Counter()
_logged: dict[str, float] = {}


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the limits of the module docstring."""

    per_peer = 64

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._peer = self.client[0] if self.client else ""
        self._deadline: asyncio.TimerHandle | None = None
        self._idle = False  # kept alive after a response, and nothing received since
        if len(self.connections) > TOTAL:
            self._refuse("total")
            return
        _open[self._peer] += 1
        self._counted = True
        if self.per_peer and _open[self._peer] > self.per_peer:
            self._refuse("per_peer")
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            _open[self._peer] -= 1
            if _open[self._peer] <= 0:
                del _open[self._peer]
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._idle = False
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._disarm()  # the request is in: the application's time now

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._idle = True
            self._arm()  # the next request on this connection

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(REQUEST_SECONDS, self._too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._idle:
            return  # an idle kept-alive connection: uvicorn's keep-alive timeout closes it
        if not self.transport.is_closing() and self.conn.their_state is not h11.DONE:
            self._refuse("slow_request")

    def _refuse(self, reason: str) -> None:
        CLOSED[reason] += 1
        now = time.monotonic()
        if now - _logged.get(reason, -1e18) >= 60:
            _logged[reason] = now
            log.warning(
                "closing HTTP connections from %s: %s (%d so far; docs/server.md)",
                self._peer or "an unknown peer",
                {
                    "total": f"more than {TOTAL} connections are open",
                    "per_peer": f"more than {self.per_peer} connections from one address",
                    "slow_request": f"no whole request within {REQUEST_SECONDS:g} s",
                }[reason],
                CLOSED[reason],
            )
        self.transport.abort()


def guarded(per_peer: int) -> Any:
    """The protocol class for uvicorn's ``http`` setting, with ``per_peer`` (0: none)."""
    return type("GuardedH11", (GuardedH11,), {"per_peer": per_peer})
