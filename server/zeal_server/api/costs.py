"""A cost budget for reads: costly reads take a slot, or get 429.

A read of a stream's definition is one or two indexed lookups: the streams, a stream, its
configuration, the LoRaWAN bindings, a planner for one stream, health and metrics. A read
of a stream's *data* is not: its cost grows with the window (an average, a series, an
export, a comparison) or with the fleet (a page of devices sorted on a column, the groups,
the stream's figures), and a planner for a fleet (``/preview`` with ``devices``,
``/preview/device`` and ``/preview/compare``) computes for every window. Unbounded, 8
clients asking for the heaviest of them made a light ``GET /streams`` take half a second
and the collector's commits wait; once those were budgeted, exports and the reads left out
of the budget did the same (hostile round 3: light reads x11 on SQLite, x18 on PostgreSQL).

So every costly read (:func:`heavy_kind`) runs only in one of ``at_once`` slots
(``ZEAL_HEAVY_READS``, default half the CPUs, at least 1), at most ``per_client`` of them
per client (:func:`client_of`: the server's token it presents, read as the token check
reads it, else its address). Past either it waits up to ``SLOT_WAIT`` seconds for one,
then is answered 429 with ``Retry-After`` and counted by kind (:data:`REFUSED`,
``zeal_http_heavy_reads_refused_total``). A costly read without the read token (when the
server has one) is refused (401, 403) before it takes a slot. Its statements get a time
limit of ``STATEMENT_SECONDS``: PostgreSQL's ``statement_timeout``, and on SQLite a progress
handler that interrupts the query; one that runs longer is answered 503 with the reason.
Exports hold a slot for as long as they stream, and have their own limit too (4 at once);
an export is made at most ``EXPORT_BUSY`` of the time (:func:`paced`): reading and
formatting a chunk is Python work that holds the interpreter, and an export made flat out
slowed the collector's commits by half on PostgreSQL (bench/heavy_reads.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TypeVar
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from zeal_server.api.auth import read_refusal

__all__ = [
    "EXPORT_BUSY",
    "REFUSED",
    "RETRY_AFTER",
    "SQLITE_STEPS",
    "STATEMENT_SECONDS",
    "HeavyReads",
    "ReadBudget",
    "client_of",
    "heavy_kind",
    "paced",
]

#: Seconds a costly read's statements may run (PostgreSQL's statement_timeout; on SQLite
#: from the start of its session, checked every SQLITE_STEPS steps of a query).
STATEMENT_SECONDS = 30
SQLITE_STEPS = 20_000
RETRY_AFTER = "2"
#: Seconds a heavy read waits for a slot before its 429 (a page's few heavy reads at once
#: are served one after the other; a client that asks again at once, whatever
#: Retry-After says, costs one cheap request every 2 s, not hundreds).
SLOT_WAIT = 2.0
#: Heavy reads answered 429, by kind (this process).
REFUSED: Counter[str] = Counter()
#: The share of its time an export spends making its chunks; it waits the rest.
EXPORT_BUSY = 0.5


#: A stream's data: /api/v1/streams/{name}/{what}.
_DATA = re.compile(r"/api/v1/streams/[^/]+/(?P<what>[a-z]+)/?$")
#: What each read of a stream's data is counted as (the label of REFUSED).
_DATA_KINDS = {
    "average": "average",
    "distribution": "distribution",
    "series": "series",
    "export": "export",
    "compare": "compare",
    "devices": "device page",
    "groups": "groups",
    "stats": "stream figures",
}


def heavy_kind(path: str, query: Mapping[str, str]) -> str | None:
    """What makes a read costly (module docstring), or None for a light one."""
    if path.rstrip("/").endswith("/preview/compare"):
        return "compare planner"
    if path.rstrip("/").endswith("/preview/device"):
        return "planner"
    if path.rstrip("/").endswith("/api/v1/preview"):
        return "planner" if "devices" in query else None
    found = _DATA.search(path)
    if found is None or found["what"] not in _DATA_KINDS:
        return None
    what = found["what"]
    return _window_kind(what, query) if what in ("average", "series") else _DATA_KINDS[what]


def _window_kind(what: str, query: Mapping[str, str]) -> str:
    """An average's or a series' kind: the heaviest of them named apart."""
    interval = query.get("interval_seconds", "")
    if query.get("exclude") == "implausible":
        return "exclusion"
    if query.get("estimator") == "bayes" and query.get("model", "mean") != "mean":
        return "bayes over codes"
    if "quantile" in query:
        return "quantile series"
    if what == "series" and not (interval.isdigit() and int(interval) >= 3600):
        return "fine series"
    return what


T = TypeVar("T")


def paced(chunks: Iterator[T], busy: float = EXPORT_BUSY) -> Iterator[T]:
    """`chunks`, each made at most `busy` of the time: after one that took t seconds to
    make, the next is not begun for t (1 - busy) / busy seconds (the thread that makes
    them sleeps, holding nothing but its slot)."""
    while True:
        began = time.monotonic()
        chunk = next(chunks, None)
        if chunk is None:
            return
        spent = time.monotonic() - began
        yield chunk
        time.sleep(spent * (1 - busy) / busy)


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


def client_of(authorization: str | None, address: str, tokens: Sequence[str] = ()) -> str:
    """Whom a read counts against: the server's token it presents (one of `tokens`, read as
    the token check reads it: the scheme in any case, the token without the white space
    around it), hashed; else its address. So one token spelt with other white space is one
    client, and made-up tokens make no new ones."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        for known in tokens:
            if hmac.compare_digest(token.encode(), known.encode()):
                return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16]
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
        state = scope["app"].state
        budget: ReadBudget = state.reads
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        denied = read_refusal(authorization, state.settings)
        if denied is not None:  # what the route would answer, without a slot
            status, detail, extra = denied
            fields = [(k.encode(), v.encode()) for k, v in extra.items()]
            await self.answer(send, status, detail, fields)
            return
        tokens = [t for t in (state.settings.read_token, state.settings.operator_token) if t]
        client = scope.get("client")
        who = client_of(authorization, client[0] if client else "", tokens)
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
