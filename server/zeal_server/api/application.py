"""The application factory: lifespan, the write guard, error handlers, the dashboard, and
the routers of ``zeal_server.api.routes`` (``/api/v1``, OpenAPI at ``/docs``).

The lifespan builds the engine, migrates the schema and starts the collector; nothing
happens at import. Averages come from the segments' exact integer sums
(``zeal_server.store.sums``), aligned to whole buckets of the stream. Writes need the operator
token; reads need the read token when one is set.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
)
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zeal_server.api.auth import refusal
from zeal_server.api.costs import HeavyReads, ReadBudget
from zeal_server.api.deps import MAX_EXPORTS, known_query, named
from zeal_server.api.metrics import build_registry
from zeal_server.api.routes import (
    averages,
    budgets,
    compare,
    data,
    devices,
    distribution,
    health,
    logins,
    lorawan,
    preview,
    streams,
)
from zeal_server.api.running import Logins, LoginsFor, StartCollector
from zeal_server.api.schemas import ERRORS
from zeal_server.api.vocabulary import OldNames
from zeal_server.errors import ProvisioningError
from zeal_server.settings import ServerSettings
from zeal_server.store.db import make_engine, migrate, session_factory

__all__ = ["build_app"]

log = logging.getLogger(__name__)
#: Request bodies larger than this are refused (413) before they are read; the largest
#: real one (a device's 32 tags) is a few KB.
MAX_BODY_BYTES = 64 * 1024
#: A body past MAX_BODY_BYTES that passed the token check is read into the void up to this
#: size before its 413, so the client reads the answer instead of a reset (schemathesis
#: sent a 196 KB body); a larger one is refused at once.
DRAIN_BYTES = 1024 * 1024


#: The dashboard may load and call nothing but its own origin (it works offline).
_DASHBOARD_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


# -- application ------------------------------------------------------------------------------


class WriteGuard:
    """ASGI middleware in front of every route: checks the operator token of a write
    (POST, PUT, PATCH, DELETE) *before its body is parsed*, and refuses bodies larger than
    MAX_BODY_BYTES (413) by their Content-Length or as they arrive. An unauthenticated
    client can thus make the server parse nothing it sends, and read at most
    MAX_BODY_BYTES of it into the void.

    That reading is on purpose: a refusal sent while the client's body is still arriving
    is followed by closing a socket with unread bytes in it, which the kernel turns into a
    TCP reset, and the client may then lose the refusal and see "connection reset by peer"
    instead (schemathesis met it in 1 of its ~2,300 requests). So a refused write whose
    body is small is read to its end first; one whose Content-Length is over the limit is
    refused at once, as reading it would be the cost this guard exists to spare. A request
    with the right token whose body is over MAX_BODY_BYTES is read away up to DRAIN_BYTES
    before its 413, for the same reason (the token holder is not who this guard spares)."""

    WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        if scope["method"] in self.WRITES:
            settings: ServerSettings = scope["app"].state.settings
            refused = refusal(headers.get(b"authorization"), settings.operator_token, "operator")
            if refused is not None:
                if not await _read_away(headers, receive):
                    return  # the client went away
                status, detail, extra = refused
                pairs = [(k.lower().encode(), v.encode()) for k, v in extra.items()]
                await _answer(send, status, detail, pairs)
                return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            # An operator's (or a reader's) body over the limit: read into the void when it
            # is at most DRAIN_BYTES, so that the client gets the 413 rather than a reset.
            small = length.isdigit() and int(length) <= DRAIN_BYTES
            if small and not await _drain(receive, DRAIN_BYTES):
                return  # the client went away
            await _answer(send, 413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
            return
        received = 0

        async def capped() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:
                raise HTTPException(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
            return message

        await self.app(scope, capped, send)


async def _drain(receive: Receive, limit: int) -> bool:
    """Reads a request's body into the void, up to `limit` bytes; False if the client
    disconnected meanwhile."""
    received = 0
    while received <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return True


async def _read_away(headers: dict[bytes, bytes], receive: Receive) -> bool:
    """Reads a refused request's body into the void when it is at most MAX_BODY_BYTES
    (see :class:`WriteGuard`); False if the client disconnected meanwhile."""
    length = headers.get(b"content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return True
    if length is None and b"transfer-encoding" not in headers:
        return True  # no body
    return await _drain(receive, MAX_BODY_BYTES)


class RedactQuery(logging.Filter):
    """Keeps query values out of uvicorn's access log: a token someone put in a query
    string (refused, but sent) would otherwise be written to it. Parameter names stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and "?" in str(args[2]):
            path, _, query = str(args[2]).partition("?")
            names = "&".join(f"{part.split('=', 1)[0]}=…" for part in query.split("&") if part)
            record.args = (args[0], args[1], f"{path}?{names}", args[3], args[4])
        return True


def _redact_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())


async def _answer(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _no_logins(_settings: ServerSettings) -> Logins:
    raise ProvisioningError("off", "this server was built without a broker admin")


def build_app(
    settings: ServerSettings | None = None,
    *,
    collector: StartCollector | None = None,
    logins_for: LoginsFor | None = None,
) -> FastAPI:
    """The FastAPI application of the API layer alone; settings from the environment unless
    given. With `collector`, a server with a broker also starts the collector it builds;
    `logins_for` gives the routes of device logins their broker admin. The server's one
    ``create_app`` (``zeal_server.app``) passes both; this layer may not import them."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        config = settings or ServerSettings.from_env(os.environ)
        # HTTP requests wait at most 5 s for a connection (then 503), and never for one of
        # the collector's: it has an engine (a pool) of its own.
        engine = make_engine(config.database_url, pool_timeout=5)
        migrate(engine)
        app.state.settings = config
        app.state.engine = engine
        app.state.sessions = session_factory(engine)
        app.state.collector = None
        app.state.logins_for = logins_for or _no_logins
        app.state.metrics = build_registry(None, app.state.sessions)
        app.state.exports = threading.BoundedSemaphore(MAX_EXPORTS)
        app.state.reads = ReadBudget(config.heavy_reads)
        if config.operator_token is None:
            log.warning("development mode without ZEAL_OPERATOR_TOKEN: writes are open")
        collector_engine = None
        if collector is not None and config.broker is not None:
            collector_engine = make_engine(config.database_url, pool_size=2)
            app.state.collector = collector(config, session_factory(collector_engine))
            app.state.metrics = build_registry(app.state.collector, app.state.sessions)
        # What start-up made lives as long as the server: frozen, full garbage collections
        # no longer walk it (docs/server.md, the collector's write path).
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            if app.state.collector is not None:
                app.state.collector.stop()
            if collector_engine is not None:
                collector_engine.dispose()
            engine.dispose()

    app = FastAPIOffline(  # /docs and /redoc from bundled files, not a CDN: works offline
        responses=ERRORS,
        title="Zeal",
        version="0.1.0",
        lifespan=lifespan,
        description="Privacy-preserving sensor data: debiased averages with error "
        "bounds from locally privatized, compressed readings.",
    )

    _redact_access_log()
    app.add_middleware(HeavyReads, answer=_answer)
    app.add_middleware(WriteGuard)
    app.add_middleware(OldNames)  # outermost: the renamed query names, before anything reads them

    _database_errors(app)
    _validation_errors(app)
    _dashboard(app)

    for module in (
        streams,
        preview,
        averages,
        distribution,
        compare,
        devices,
        budgets,
        data,
        health,
        logins,
        lorawan,
    ):
        app.include_router(module.router, dependencies=[Depends(known_query)])
    return app


def _validation_errors(app: FastAPI) -> None:
    """A 422 of FastAPI's validation names its field in each message (deps.named), in
    FastAPI's shape."""

    @app.exception_handler(RequestValidationError)
    async def validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [named(dict(e)) for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def _database_errors(app: FastAPI) -> None:
    """A database that cannot be reached, or fails, is a 503 (logged without SQL values)."""

    @app.exception_handler(OperationalError)
    async def database_down(_request: Request, _exc: OperationalError) -> JSONResponse:
        return JSONResponse({"detail": "database unavailable"}, status_code=503)

    @app.exception_handler(SQLAlchemyError)
    async def database_error(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        log.error("database error on %s: %s", request.url.path, exc)
        return JSONResponse({"detail": "database error"}, status_code=503)


def _dashboard(app: FastAPI) -> None:
    """The operator dashboard at / and its files under /dashboard/, with their headers."""
    dashboard = resources.files("zeal_server.api") / "dashboard"

    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        """The operator dashboard (static; it reads the API with the visitor's token)."""
        return HTMLResponse(
            dashboard.joinpath("index.html").read_text(encoding="utf-8"), headers=_DASHBOARD_HEADERS
        )

    app.mount(
        "/dashboard",
        StaticFiles(directory=str(dashboard), check_dir=True),
        name="dashboard",
    )

    @app.middleware("http")
    async def dashboard_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        if request.url.path.startswith("/dashboard/"):
            response.headers.update(_DASHBOARD_HEADERS)
        return response
