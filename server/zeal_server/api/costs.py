"""A cost budget for reads: heavy queries take a slot, or get 429.

Most reads are one or two indexed lookups. Some are not: an average or series that leaves
out implausible devices (reads every device's sums first), a Bayes model over the codes
(reads every code of the window), a series finer than an hour (up to 10,000 points), a
comparison (a row per device), a planner (``/preview`` for a fleet's windows, and
``/preview/compare``), a page of more than 100 devices. Unbounded, 8 clients asking for
them made a light ``GET /streams`` take half a second and the collector's commits wait.

So a heavy read (:func:`heavy_kind`) runs only in one of ``at_once`` slots
(``ZEAL_HEAVY_READS``, default half the CPUs, at least 1), at most ``per_client`` of them
per client (its bearer token, or its address without one). Past either it waits up to
``SLOT_WAIT`` seconds for one, then is answered 429 with ``Retry-After`` and counted by
kind (:data:`REFUSED`, ``zeal_http_heavy_reads_refused_total``). On PostgreSQL its statements get a
``statement_timeout`` of ``STATEMENT_SECONDS``; one that runs longer is cancelled by the
database and answered 503 with the reason. Exports have their own limit (4 at once).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "REFUSED",
    "RETRY_AFTER",
    "STATEMENT_SECONDS",
    "HeavyReads",
    "ReadBudget",
    "client_of",
    "heavy_kind",
]

#: Seconds a heavy read's statement may run on PostgreSQL.
STATEMENT_SECONDS = 30
RETRY_AFTER = "2"
#: Seconds a heavy read waits for a slot before its 429 (a page's few heavy reads at once
#: are served one after the other; a client that asks again at once, whatever
#: Retry-After says, costs one cheap request every 2 s, not hundreds).
SLOT_WAIT = 2.0
#: Heavy reads answered 429, by kind (this process).
REFUSED: Counter[str] = Counter()


def heavy_kind(path: str, query: Mapping[str, str]) -> str | None:
    """What makes a read heavy (module docstring), or None for a light one."""
    interval, limit = query.get("interval_seconds", ""), query.get("limit", "")
    rules = (
        ("compare planner", path.endswith("/preview/compare")),
        ("compare", path.endswith("/compare")),
        (
            "planner",
            path.endswith("/preview") and "devices" in query and "interval_seconds" in query,
        ),
        (
            "exclusion",
            path.endswith(("/average", "/series")) and query.get("exclude") == "implausible",
        ),
        (
            "bayes over codes",
            path.endswith(("/average", "/series"))
            and query.get("estimator") == "bayes"
            and query.get("model", "mean") != "mean",
        ),
        (
            "fine series",
            path.endswith("/series") and not (interval.isdigit() and int(interval) >= 3600),
        ),
        ("device page", path.endswith("/devices") and limit.isdigit() and int(limit) > 100),
    )
    return next((kind for kind, applies in rules if applies), None)


class ReadBudget:
    """The slots of heavy reads (one per application)."""

    def __init__(self, at_once: int, per_client: int = 1) -> None:
        self.at_once, self.per_client = at_once, per_client
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def take(self, client: str, kind: str) -> str | None:
        """Take a slot for `client`; or why not (the 429's text)."""
        with self._lock:
            total = sum(self._running.values())
            if total < self.at_once and self._running[client] < self.per_client:
                self._running[client] += 1
                return None
            mine = self._running[client] >= self.per_client
        return (
            f"too many heavy reads ({kind}) "
            + ("of this client" if mine else "at once")
            + f": at most {self.per_client if mine else self.at_once} run at a time; "
            f"try again in {RETRY_AFTER} s (docs/server.md, 'Heavy reads')"
        )

    def give_back(self, client: str) -> None:
        with self._lock:
            self._running[client] -= 1
            if self._running[client] <= 0:
                del self._running[client]


def client_of(authorization: str | None, address: str) -> str:
    """Whom a read counts against: its bearer token (hashed), or its address."""
    if authorization:
        return "token:" + hashlib.sha256(authorization.encode()).hexdigest()[:16]
    return "address:" + address


Answer = Callable[[Send, int, str, list[tuple[bytes, bytes]]], Awaitable[None]]


class HeavyReads:
    """ASGI middleware: a heavy GET takes a slot of the application's ReadBudget
    (``app.state.reads``) for as long as it runs, its response included, and is marked
    ``state["heavy"]`` (its database session then sets the statement timeout); past the
    slots it is answered 429 before any routing or validation, so refusing costs little."""

    def __init__(self, app: ASGIApp, answer: Answer) -> None:
        self.app, self.answer = app, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
        kind = heavy_kind(scope["path"], query)
        if kind is None:
            await self.app(scope, receive, send)
            return
        budget: ReadBudget = scope["app"].state.reads
        headers = dict(scope["headers"])
        client = scope.get("client")
        who = client_of(
            headers.get(b"authorization", b"").decode("latin-1"), client[0] if client else ""
        )
        deadline = time.monotonic() + SLOT_WAIT
        while (refused := budget.take(who, kind)) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the connection stays open meanwhile, at no cost
        if refused is not None:
            REFUSED[kind] += 1
            await self.answer(send, 429, refused, [(b"retry-after", RETRY_AFTER.encode())])
            return
        scope.setdefault("state", {})["heavy"] = kind
        try:
            await self.app(scope, receive, send)
        finally:
            budget.give_back(who)
