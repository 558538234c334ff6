"""HTTP API (``/api/v1``, OpenAPI at ``/docs``) and the application factory.

The lifespan builds the engine, migrates the schema and starts the collector; nothing
happens at import. Averages come from the exact integer aggregates (no segment is read),
aligned to whole buckets of the stream. Writes need the operator token; reads need the read
token when one is set.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zeal import Estimate
from zeal.estimate import bernstein_half_width, difference_of
from zeal.wire import MAX_TIMESTAMP
from zeal_server import retention, store
from zeal_server.auth import operator, reader, refusal
from zeal_server.collector import Collector
from zeal_server.db import make_engine, migrate, session_factory
from zeal_server.efficiency import efficiency
from zeal_server.metrics import build_registry
from zeal_server.models import BatchSeen, BucketTotal, Device, Stream
from zeal_server.routes import health, logins
from zeal_server.settings import ServerSettings

__all__ = ["create_app"]

log = logging.getLogger("zeal_server.api")
MAX_POINTS = 10_000
#: Request bodies larger than this are refused (413) before they are read; the largest
#: real one (a device's 32 tags) is a few KB.
MAX_BODY_BYTES = 64 * 1024
#: Exports running at once; one more is answered 429 with Retry-After.
MAX_EXPORTS = 4
#: Query windows are cut to [epoch, 2**47 ms] (year 6429): no reading lies outside, and
#: every bound stays a valid date.
MAX_QUERY_MS = 1 << 47
assert MAX_QUERY_MS < MAX_TIMESTAMP


# -- response and request models ------------------------------------------------------------


class StreamIn(BaseModel):
    name: str = Field(description="stream name: 1-64 letters, digits, '_', '.' or '-'")
    lower: float = Field(description="lower end of the feasible range")
    upper: float = Field(description="upper end of the feasible range")
    epsilon: float = Field(description="privacy budget per reading", gt=0, le=20)
    payload_bits: int | None = Field(
        None,
        ge=2,
        le=store.MAX_SERVER_BITS,
        description="code width (default: chosen by the library)",
    )
    exponent: int | None = Field(None, ge=-1000, le=1022, description="binade exponent E_U*")
    bucket_seconds: int = Field(60, ge=1, le=86400, description="time aggregation bucket")
    description: str = Field("", max_length=500)
    unit: str = Field(
        "", max_length=32, description="what the readings measure in, e.g. degF, kWh, mg/dL"
    )
    enrolled_only: bool = Field(
        False,
        description="accept data only from devices enrolled beforehand with "
        "PUT /streams/{name}/devices/{device} (the broker lets any device publish to any "
        "stream under its own name)",
    )
    retention_days: int | None = Field(
        None,
        ge=1,
        le=36_500,
        description="delete whole buckets older than this many days (default: keep all)",
    )


class StreamPatch(BaseModel):
    """What may change on an existing stream (its privacy parameters never do)."""

    retention_days: int | None = Field(
        description="delete whole buckets older than this many days; null keeps everything",
        ge=1,
        le=36_500,
    )


class StreamOut(BaseModel):
    name: str
    lower: float
    upper: float
    epsilon: float
    realized_epsilon: float | None
    exponent: int
    payload_bits: int
    shared_bits: int
    sampler: str
    fingerprint: str
    bucket_seconds: int
    C: float
    abar: float
    grid_step: float
    description: str
    unit: str
    enrolled_only: bool
    retention_days: int | None
    created: datetime


class DeletedOut(BaseModel):
    stream: str
    device: str | None = Field(None, description="the device whose data was deleted")
    readings: int = Field(description="readings that were stored and are now gone")


class EstimateOut(BaseModel):
    mean: float
    std_error: float
    ci: tuple[float, float]
    guaranteed: tuple[float, float]
    in_range: bool


class AverageOut(BaseModel):
    stream: str
    start: datetime | None = Field(description="start of the first bucket used")
    end: datetime | None = Field(description="end of the last bucket used")
    group: str | None
    n: int
    confidence: float
    estimate: EstimateOut | None = Field(description="null when the window holds no readings")
    epsilon: float
    payload_bits: int


class PointOut(BaseModel):
    start: datetime
    end: datetime
    n: int
    estimate: EstimateOut | None


class SeriesOut(BaseModel):
    stream: str
    interval_seconds: int
    group: str | None
    confidence: float
    points: list[PointOut]


class CompareOut(BaseModel):
    stream: str
    a: str
    b: str
    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    difference: float | None
    std_error: float | None
    ci: tuple[float, float] | None
    p_value: float | None = Field(
        description="two-sided test of equal means (normal approximation)"
    )
    confidence: float


class DeviceOut(BaseModel):
    name: str
    tags: dict[str, str]
    first_seen: datetime
    last_seen: datetime
    readings: int
    batches: int
    epsilon_spent: float
    duplicates: int = Field(description="batches received again and dropped (a lost PUBACK)")
    sequence_resets: int = Field(
        description="batches stored although their sequence number had been used before "
        "for other content: the device's outbox was reset, or two agents share its id"
    )


class DevicesOut(BaseModel):
    total: int
    limit: int
    offset: int
    devices: list[DeviceOut]


class GroupOut(BaseModel):
    group: str = Field(description="key:value, usable as the group parameter")
    devices: int


class TagsIn(BaseModel):
    tags: dict[str, str] = Field(description='replaces the device\'s tags, e.g. {"site": "aarhus"}')


class EfficiencyOut(BaseModel):
    """Bits per reading, measured on the stream's data (see zeal_server.efficiency)."""

    sample: int = Field(description="recent stored readings the alternatives were measured on")
    wire_bits: float = Field(description="Zeal payload bits per reading received")
    json_bits: float = Field(description='a JSON message {"ts", "value"} per reading')
    float64_bits: float = Field(description="a raw float64 value (timestamp not counted)")
    wire_vs_json: float
    wire_vs_float64: float
    store_bits: float = Field(description="segment bits per reading (codes, times, devices)")
    store_code_bits: float = Field(description="bits per reading of the codes column alone")
    paper_store_bits: float = Field(
        description="the paper's format: privatized float64 values, zstandard level 3"
    )
    paper_wire_bits: float = Field(description="the paper's transmission: 64 - gamma_min bits")
    store_vs_paper: float = Field(description="paper_store_bits / store_code_bits")
    compacted: float = Field(
        description="share of the stored readings in compacted (compressed) segments; the "
        "store figures are those of the compacted segments, or of the raw parts while it is 0"
    )
    compression_ratio_cr: float = Field(description="paper Eq. (34) on the sample")
    transmission_ratio_tr: float = Field(description="paper Eq. (27)")


class StatsOut(BaseModel):
    stream: str
    readings: int
    messages: int
    devices: int
    active_devices: int = Field(description="devices heard from in the last hour")
    last_seen: datetime | None = Field(description="when the newest data arrived")
    bytes_received: int
    duplicates: int = Field(description="batches received again and dropped, all devices")
    sequence_resets: int = Field(description="batches stored after a sequence reset")
    wire_bytes_per_reading: float | None
    store_bytes: dict[str, int]
    store_bits_per_reading: dict[str, float] | None
    rejects: dict[str, int]
    efficiency: EfficiencyOut | None = Field(description="null until data is stored")


class PreviewOut(BaseModel):
    """What a stream with these parameters would be, before it is created."""

    payload_bits: int
    shared_bits: int
    exponent: int
    sampler: str
    abar: float = Field(description="the addition constant Abar (paper Eq. (22))")
    C: float = Field(description="the output bound C (paper Eq. (6))")
    grid_step: float
    realized_epsilon: float | None = Field(description="privacy loss the sampler realizes")
    transmission_ratio: float = Field(description="TR, paper Eq. (27)")
    n: int
    confidence: float
    std_error: float | None = Field(
        description="worst-case standard error of the average of n readings "
        "(null when it exceeds the float64 range, for astronomically wide ranges)"
    )
    guaranteed_half_width: float | None = Field(
        description="half width of the guaranteed (Bernstein, Theorem 3) interval for n "
        "readings (null when it exceeds the float64 range)"
    )


# -- helpers ----------------------------------------------------------------------------------


def _ms(value: datetime | None) -> int | None:
    """Milliseconds since the epoch, cut to [0, MAX_QUERY_MS] (dates at the ends of the
    calendar, with any zone, included)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        ms = int(value.timestamp() * 1000)
    except (OverflowError, ValueError, OSError):  # beyond what a timestamp can say
        ms = 0 if value.year < 1970 else MAX_QUERY_MS
    return min(max(ms, 0), MAX_QUERY_MS)


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _estimate_out(estimate: Estimate | None) -> EstimateOut | None:
    if estimate is None:
        return None
    return EstimateOut(
        mean=estimate.mean,
        std_error=estimate.std_error,
        ci=estimate.ci,
        guaranteed=estimate.guaranteed,
        in_range=estimate.in_range,
    )


def _stream_out(stream: Stream) -> StreamOut:
    params = store.params_of(stream)
    return StreamOut(
        name=stream.name,
        lower=stream.lower,
        upper=stream.upper,
        epsilon=stream.epsilon,
        realized_epsilon=params.realized_epsilon,
        exponent=stream.exponent,
        payload_bits=stream.payload_bits,
        shared_bits=params.shared_bits,
        sampler=stream.sampler,
        fingerprint=stream.fingerprint,
        bucket_seconds=stream.bucket_seconds,
        C=params.C,
        abar=params.abar,
        grid_step=params.grid_step,
        description=stream.description,
        unit=stream.unit,
        enrolled_only=stream.enrolled_only,
        retention_days=stream.retention_days,
        created=_time(stream.created_ms),
    )


def _window(stream: Stream, start: datetime | None, end: datetime | None) -> tuple[int, int]:
    start_ms, end_ms = _ms(start), _ms(end)
    if start_ms is not None and end_ms is not None and start_ms >= end_ms:
        raise invalid("query", "start", f"start ({start}) must be before end ({end})")
    return store.bucket_bounds(stream, start_ms, end_ms)


def _confirmed(confirm: str | None, name: str) -> None:
    if confirm != name:
        raise invalid(
            "query",
            "confirm",
            f"deleting cannot be undone: repeat the name as confirm={name}",
        )


def invalid(where: str, field: str | None, message: str) -> HTTPException:
    """A 422 in FastAPI's validation format, so every 422 has one documented shape."""
    loc = [where] if field is None else [where, field]
    return HTTPException(422, [{"loc": loc, "msg": message, "type": "value_error"}])


def _bounds_out(stream: Stream, first: int, stop: int) -> tuple[datetime | None, datetime | None]:
    size = stream.bucket_seconds * 1000
    return (
        None if first <= -(1 << 61) else _time(first * size),
        None if stop >= 1 << 61 else _time(stop * size),
    )


def _devices_in(session: Session, stream: Stream, group: str | None) -> store.Devices:
    if group is None:
        return None
    try:
        return store.group_devices(session, stream, group)
    except store.StoreError as exc:
        raise invalid("query", "group", str(exc)) from exc


def _device_order(sort: str, descending: bool) -> list[Any]:
    column = {
        "name": Device.name,
        "first_seen": Device.first_seen_ms,
        "last_seen": Device.last_seen_ms,
        "readings": Device.readings,
        "epsilon_spent": Device.readings,
    }[sort]
    primary = column.desc() if descending else column.asc()
    return [primary, Device.name]


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


Db = Annotated[Session, Depends(_session)]


class Problem(BaseModel):
    """An error: ``detail`` says what was wrong and what was expected."""

    detail: str


#: Answers every route may give besides its own (documented so clients and fuzzers know).
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "token required"},
    403: {"model": Problem, "description": "wrong token"},
    404: {"model": Problem, "description": "no such stream or device"},
    503: {"model": Problem, "description": "database unavailable"},
}

Confidence = Annotated[
    float, Query(gt=0, le=0.999999, description="confidence level, e.g. 0.95 (at most 0.999999)")
]
Start = Annotated[datetime | None, Query(description="window start (ISO 8601; UTC if no zone)")]
End = Annotated[datetime | None, Query(description="window end, exclusive (ISO 8601)")]
Confirm = Annotated[
    str | None,
    Query(description="the name of what is deleted, again: deleting cannot be undone"),
]
Group = Annotated[
    str | None, Query(description="devices whose tag matches key:value", max_length=200)
]


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
    (POST, PUT, PATCH, DELETE) *before its body is read*, and refuses bodies larger than
    MAX_BODY_BYTES (413) by their Content-Length or as they arrive. An unauthenticated
    client can thus make the server neither read nor parse anything it sends."""

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
                status, detail, extra = refused
                pairs = [(k.lower().encode(), v.encode()) for k, v in extra.items()]
                await _answer(send, status, detail, pairs)
                return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
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


def create_app(settings: ServerSettings | None = None, *, collector: bool = True) -> FastAPI:
    """The FastAPI application; settings from the environment unless given."""

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
        app.state.metrics = build_registry(None, app.state.sessions)
        app.state.exports = threading.BoundedSemaphore(MAX_EXPORTS)
        if config.operator_token is None:
            log.warning("development mode without ZEAL_OPERATOR_TOKEN: writes are open")
        collector_engine = None
        if collector and config.broker is not None:
            collector_engine = make_engine(config.database_url, pool_size=2)
            app.state.collector = Collector(config, session_factory(collector_engine))
            app.state.metrics = build_registry(app.state.collector, app.state.sessions)
            app.state.collector.start()
        try:
            yield
        finally:
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

    app.add_middleware(WriteGuard)

    @app.exception_handler(OperationalError)
    async def database_down(request: Request, exc: OperationalError) -> JSONResponse:
        return JSONResponse({"detail": "database unavailable"}, status_code=503)

    @app.exception_handler(SQLAlchemyError)
    async def database_error(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        log.error("database error on %s: %s", request.url.path, exc)
        return JSONResponse({"detail": "database error"}, status_code=503)

    def stream_or_404(db: Session, name: str) -> Stream:
        stream = store.stream_by_name(db, name)
        if stream is None:
            raise HTTPException(404, f"no stream named {name!r}")
        return stream

    api = "/api/v1"
    read = [Depends(reader)]

    @app.get(f"{api}/streams", dependencies=read, response_model=list[StreamOut])
    def list_streams(db: Db) -> list[StreamOut]:
        """All streams with their parameters."""
        return [_stream_out(s) for s in store.list_streams(db)]

    @app.post(
        f"{api}/streams",
        dependencies=[Depends(operator)],
        status_code=201,
        response_model=StreamOut,
        responses={409: {"description": "stream exists"}},
    )
    def create_stream(body: StreamIn, request: Request, db: Db) -> StreamOut:
        """Create a stream (operator token); its parameters are then published for agents."""
        if store.stream_by_name(db, body.name) is not None:
            raise HTTPException(
                409,
                f"stream {body.name!r} already exists; parameters of a "
                "stream never change (create a new stream)",
            )
        try:
            stream = store.create_stream(db, **body.model_dump())
        except store.StoreError as exc:
            db.rollback()
            raise invalid("body", None, str(exc)) from exc
        db.commit()
        if request.app.state.collector is not None:
            request.app.state.collector.configs.publish(store.config_of(db, stream))
            request.app.state.collector.streams_changed()
        return _stream_out(stream)

    @app.get(f"{api}/streams/{{name}}", dependencies=read, response_model=StreamOut)
    def get_stream(name: str, db: Db) -> StreamOut:
        """One stream's parameters and derived values."""
        return _stream_out(stream_or_404(db, name))

    @app.patch(
        f"{api}/streams/{{name}}", dependencies=[Depends(operator)], response_model=StreamOut
    )
    def patch_stream(name: str, body: StreamPatch, db: Db) -> StreamOut:
        """Change a stream's retention (operator token). A shorter one deletes what is
        older at the collector's next housekeeping, within a minute, for good."""
        stream = stream_or_404(db, name)
        store.set_retention(db, stream, body.retention_days)
        db.commit()
        log.warning("stream %s: retention set to %s days", name, body.retention_days)
        return _stream_out(stream)

    @app.delete(
        f"{api}/streams/{{name}}",
        dependencies=[Depends(operator)],
        response_model=DeletedOut,
        responses={422: {"description": "confirm missing or not the stream's name"}},
    )
    def delete_stream(name: str, request: Request, db: Db, confirm: Confirm = None) -> DeletedOut:
        """Delete a stream and everything stored for it (operator token; confirm=NAME).
        Its retained configuration is withdrawn from the broker, and agents sending to it
        stop."""
        stream = stream_or_404(db, name)
        _confirmed(confirm, name)
        readings = store.delete_stream(db, stream)
        db.commit()
        if request.app.state.collector is not None:
            request.app.state.collector.configs.clear(name)
            request.app.state.collector.streams_changed()
        log.warning("stream %s deleted through the API (%d readings)", name, readings)
        return DeletedOut(stream=name, device=None, readings=readings)

    @app.delete(
        f"{api}/streams/{{name}}/devices/{{device}}",
        dependencies=[Depends(operator)],
        response_model=DeletedOut,
        responses={422: {"description": "confirm missing or not the device's name"}},
    )
    def delete_device(
        name: str, device: str, request: Request, db: Db, confirm: Confirm = None
    ) -> DeletedOut:
        """Delete everything stored of one device of the stream (operator token;
        confirm=DEVICE): its readings leave every average, and the other devices' data is
        untouched. Revoke its broker login first, or what it sends next is stored anew."""
        stream = stream_or_404(db, name)
        row = db.scalar(select(Device).where(Device.stream_id == stream.id, Device.name == device))
        if row is None:
            raise HTTPException(404, f"no device {device[:64]!r} in stream {name!r}")
        _confirmed(confirm, device)
        readings = retention.delete_device_data(db, stream, row)
        db.commit()
        if request.app.state.collector is not None:
            request.app.state.collector.devices_changed()
        log.warning("device %s of stream %s deleted (%d readings)", device, name, readings)
        return DeletedOut(stream=name, device=device, readings=readings)

    @app.get(f"{api}/streams/{{name}}/config", dependencies=read)
    def get_config(name: str, db: Db) -> dict[str, Any]:
        """The configuration document agents use (also retained at zeal/v1/{name}/config);
        save it as the agent's --params file."""
        return store.config_of(db, stream_or_404(db, name))

    @app.get(f"{api}/preview", dependencies=read, response_model=PreviewOut)
    def preview(
        lower: Annotated[float, Query(description="lower end of the feasible range")],
        upper: Annotated[float, Query(description="upper end of the feasible range")],
        epsilon: Annotated[float, Query(gt=0, le=20, description="privacy budget per reading")],
        payload_bits: Annotated[
            int | None, Query(ge=2, le=store.MAX_SERVER_BITS, description="code width")
        ] = None,
        exponent: Annotated[int | None, Query(ge=-1000, le=1022)] = None,
        n: Annotated[int, Query(ge=1, le=10**15, description="readings averaged")] = 10_000,
        confidence: Confidence = 0.95,
    ) -> PreviewOut:
        """The derived parameters of a stream and the error of an average of n readings."""
        try:
            params = store.derive_params(lower, upper, epsilon, payload_bits, exponent)
        except store.StoreError as exc:
            raise invalid("query", None, str(exc)) from exc
        variance = params.variance_bound()
        std_error = math.sqrt(variance / n)
        half = bernstein_half_width(confidence, n=n, variance=variance, bound=params.error_bound())
        return PreviewOut(
            payload_bits=params.payload_bits,
            shared_bits=params.shared_bits,
            exponent=params.exponent,
            sampler=params.sampler,
            abar=params.abar,
            C=params.C,
            grid_step=params.grid_step,
            realized_epsilon=params.realized_epsilon,
            transmission_ratio=params.transmission_ratio,
            n=n,
            confidence=confidence,
            std_error=std_error if math.isfinite(std_error) else None,
            guaranteed_half_width=half if math.isfinite(half) else None,
        )

    @app.get(f"{api}/streams/{{name}}/average", dependencies=read, response_model=AverageOut)
    def average(
        name: str,
        db: Db,
        start: Start = None,
        end: End = None,
        group: Group = None,
        confidence: Confidence = 0.95,
    ) -> AverageOut:
        """The debiased average AVG* over whole buckets in [start, end), with its intervals."""
        stream = stream_or_404(db, name)
        first, stop = _window(stream, start, end)
        sums = store.window_sums(db, stream, first, stop, _devices_in(db, stream, group))
        lo, hi = _bounds_out(stream, first, stop)
        return AverageOut(
            stream=name,
            start=lo,
            end=hi,
            group=group,
            n=sums.n,
            confidence=confidence,
            epsilon=stream.epsilon,
            payload_bits=stream.payload_bits,
            estimate=_estimate_out(store.estimate(store.params_of(stream), sums, confidence)),
        )

    @app.get(f"{api}/streams/{{name}}/series", dependencies=read, response_model=SeriesOut)
    def series(
        name: str,
        db: Db,
        start: Start = None,
        end: End = None,
        interval: Annotated[
            int | None,
            Query(
                ge=1,
                le=100 * 365 * 86400,
                description="seconds per point, a multiple of the bucket (at most 100 years)",
            ),
        ] = None,
        group: Group = None,
        confidence: Confidence = 0.95,
    ) -> SeriesOut:
        """The average per interval (for charts); intervals without readings are omitted."""
        stream = stream_or_404(db, name)
        step = interval or stream.bucket_seconds
        if step % stream.bucket_seconds:
            raise invalid(
                "query",
                "interval",
                f"interval must be a multiple of the stream's bucket "
                f"({stream.bucket_seconds} s), got {step}",
            )
        per = step // stream.bucket_seconds
        devices = _devices_in(db, stream, group)
        first, stop = _window(stream, start, end)
        if first <= -(1 << 61) or stop >= 1 << 61:
            bounds = db.execute(
                select(func.min(BucketTotal.bucket), func.max(BucketTotal.bucket)).where(
                    BucketTotal.stream_id == stream.id
                )
            ).one()
            lowest: int | None = bounds[0]
            if lowest is None:
                return SeriesOut(
                    stream=name,
                    interval_seconds=step,
                    group=group,
                    confidence=confidence,
                    points=[],
                )
            first = max(first, int(bounds[0])) if first > -(1 << 61) else int(bounds[0])
            stop = min(stop, int(bounds[1]) + 1) if stop < 1 << 61 else int(bounds[1]) + 1
        if (stop - first) / per > MAX_POINTS:
            raise invalid(
                "query",
                "interval",
                f"more than {MAX_POINTS} points; choose a longer interval or a shorter window",
            )
        params = store.params_of(stream)
        size = stream.bucket_seconds * 1000
        points = [
            PointOut(
                start=_time(b * size),
                end=_time((b + per) * size),
                n=s.n,
                estimate=_estimate_out(store.estimate(params, s, confidence)),
            )
            for b, s in store.series_sums(db, stream, first, stop, per, devices).items()
        ]
        return SeriesOut(
            stream=name, interval_seconds=step, group=group, confidence=confidence, points=points
        )

    @app.get(f"{api}/streams/{{name}}/compare", dependencies=read, response_model=CompareOut)
    def compare(
        name: str,
        db: Db,
        a: Annotated[str, Query(description="first group, key:value", max_length=200)],
        b: Annotated[str, Query(description="second group, key:value", max_length=200)],
        start: Start = None,
        end: End = None,
        confidence: Confidence = 0.95,
    ) -> CompareOut:
        """Difference of two device groups' averages with its CI and a two-sided p-value."""
        stream = stream_or_404(db, name)
        first, stop = _window(stream, start, end)
        params = store.params_of(stream)
        sums = [
            store.window_sums(db, stream, first, stop, _devices_in(db, stream, g)) for g in (a, b)
        ]
        est = [store.estimate(params, s, confidence) if s.n > 1 else None for s in sums]
        out = CompareOut(
            stream=name,
            a=a,
            b=b,
            n_a=sums[0].n,
            n_b=sums[1].n,
            mean_a=est[0].mean if est[0] else None,
            mean_b=est[1].mean if est[1] else None,
            difference=None,
            std_error=None,
            ci=None,
            p_value=None,
            confidence=confidence,
        )
        if est[0] and est[1]:
            found = difference_of(est[0], est[1], confidence)
            out.difference, out.std_error = found.difference, found.std_error
            out.ci, out.p_value = found.ci, found.p_value
        return out

    def _device_out(device: Device, epsilon: float) -> DeviceOut:
        return DeviceOut(
            name=device.name,
            tags=json.loads(device.tags),
            first_seen=_time(device.first_seen_ms),
            last_seen=_time(device.last_seen_ms),
            readings=device.readings,
            batches=device.batches,
            epsilon_spent=device.readings * epsilon,
            duplicates=device.duplicates,
            sequence_resets=device.sequence_resets,
        )

    @app.get(f"{api}/streams/{{name}}/devices", dependencies=read, response_model=DevicesOut)
    def devices(
        name: str,
        db: Db,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
        sort: Annotated[
            Literal["name", "first_seen", "last_seen", "readings", "epsilon_spent"],
            Query(description="column to order by (epsilon_spent orders as readings)"),
        ] = "name",
        descending: bool = False,
    ) -> DevicesOut:
        """Devices of the stream with what each sent and its epsilon spent, one page."""
        stream = stream_or_404(db, name)
        total = (
            db.scalar(select(func.count()).select_from(Device).where(Device.stream_id == stream.id))
            or 0
        )
        rows = db.scalars(
            select(Device)
            .where(Device.stream_id == stream.id)
            .order_by(*_device_order(sort, descending))
            .limit(limit)
            .offset(offset)
        )
        return DevicesOut(
            total=total,
            limit=limit,
            offset=offset,
            devices=[_device_out(d, stream.epsilon) for d in rows],
        )

    @app.get(f"{api}/streams/{{name}}/groups", dependencies=read, response_model=list[GroupOut])
    def groups(name: str, db: Db) -> list[GroupOut]:
        """The device groups (tag key:value pairs) of the stream, for the group filter."""
        stream = stream_or_404(db, name)
        return [GroupOut(group=g, devices=n) for g, n in store.groups(db, stream).items()]

    @app.put(
        f"{api}/streams/{{name}}/devices/{{device}}",
        dependencies=[Depends(operator)],
        response_model=DeviceOut,
        responses={201: {"model": DeviceOut, "description": "enrolled"}},
    )
    def enroll(name: str, device: str, response: Response, db: Db) -> DeviceOut:
        """Enroll a device (operator token): on a stream created with enrolled_only, only
        enrolled devices may send. 201 when it is new, 200 when it exists already."""
        stream = stream_or_404(db, name)
        try:
            row, created = store.enroll(db, stream, device)
        except store.StoreError as exc:
            raise invalid("path", "device", str(exc)) from exc
        db.commit()
        response.status_code = 201 if created else 200
        return _device_out(row, stream.epsilon)

    @app.put(
        f"{api}/streams/{{name}}/devices/{{device}}/tags",
        dependencies=[Depends(operator)],
        response_model=DeviceOut,
    )
    def set_tags(name: str, device: str, body: TagsIn, db: Db) -> DeviceOut:
        """Replace a device's tags (operator token); tags group devices in queries."""
        stream = stream_or_404(db, name)
        try:
            store.check_tags(body.tags)
        except store.StoreError as exc:
            raise invalid("body", "tags", str(exc)) from exc
        row = db.scalar(select(Device).where(Device.stream_id == stream.id, Device.name == device))
        if row is None:
            raise HTTPException(
                404,
                f"no device {device[:64]!r} in stream {name!r} (devices "
                "appear with their first valid data)",
            )
        store.set_tags(db, row, body.tags)
        db.commit()
        return _device_out(row, stream.epsilon)

    @app.get(f"{api}/streams/{{name}}/stats", dependencies=read, response_model=StatsOut)
    def stats(
        name: str,
        db: Db,
        efficiency_figures: Annotated[
            bool,
            Query(
                alias="efficiency",
                description="measure the efficiency figures (decodes a sample; false skips it)",
            ),
        ] = True,
    ) -> StatsOut:
        """Readings, messages, bytes on the wire and in the store, rejects by reason."""
        stream = stream_or_404(db, name)
        readings, messages, received = db.execute(
            select(
                func.coalesce(func.sum(BatchSeen.readings), 0),
                func.count(),
                func.coalesce(func.sum(BatchSeen.bytes), 0),
            )
            .join(Device, Device.id == BatchSeen.device_id)
            .where(Device.stream_id == stream.id)
        ).one()
        device_count = (
            db.scalar(select(func.count()).select_from(Device).where(Device.stream_id == stream.id))
            or 0
        )
        last_ms, active, duplicates, resets = db.execute(
            select(
                func.max(Device.last_seen_ms),
                func.count().filter(Device.last_seen_ms >= store.now_ms() - 3_600_000),
                func.coalesce(func.sum(Device.duplicates), 0),
                func.coalesce(func.sum(Device.sequence_resets), 0),
            ).where(Device.stream_id == stream.id)
        ).one()
        sizes = store.storage_bytes(db, stream)
        measured = (
            efficiency(db, stream, readings=int(readings), received_bytes=int(received))
            if efficiency_figures
            else None
        )
        per = None
        if readings:
            segment = sizes["codes"] + sizes["timestamps"] + sizes["devices"]
            per = {
                "codes": 8 * sizes["codes"] / readings,
                "segment": 8 * segment / readings,
                "aggregates": 8 * sizes["aggregates"] / readings,
            }
        return StatsOut(
            stream=name,
            readings=int(readings),
            messages=int(messages),
            devices=device_count,
            active_devices=int(active or 0),
            last_seen=None if last_ms is None else _time(int(last_ms)),
            bytes_received=int(received),
            duplicates=int(duplicates),
            sequence_resets=int(resets),
            wire_bytes_per_reading=received / readings if readings else None,
            store_bytes=sizes,
            store_bits_per_reading=per,
            rejects=store.rejects(db, name),
            efficiency=None if measured is None else EfficiencyOut(**measured),
        )

    @app.get(
        f"{api}/streams/{{name}}/export",
        dependencies=read,
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/csv": {}}, "description": "CSV rows"},
            429: {"model": Problem, "description": f"{MAX_EXPORTS} exports already running"},
        },
    )
    def export(
        name: str, request: Request, start: Start = None, end: End = None
    ) -> StreamingResponse:
        """Decoded per-reading estimates (timestamp, device, estimate) read from the segments,
        streamed in chunks (each read in a short database session of its own). At most
        MAX_EXPORTS run at once."""
        with request.app.state.sessions() as db:
            stream = stream_or_404(db, name)
            first, stop = _window(stream, start, end)
        slots: threading.BoundedSemaphore = request.app.state.exports
        if not slots.acquire(blocking=False):
            raise HTTPException(
                429,
                f"{MAX_EXPORTS} exports are running; try again shortly",
                headers={"Retry-After": "5"},
            )
        released = threading.Event()

        def release() -> None:
            if not released.is_set():
                released.set()
                slots.release()

        def rows() -> Iterator[str]:
            try:
                yield from store.export_chunks(request.app.state.sessions, stream, first, stop)
            finally:
                release()

        body = rows()
        weakref.finalize(body, release)  # also when the client left before the first chunk
        return StreamingResponse(body, media_type="text/csv")

    dashboard = resources.files("zeal_server") / "dashboard"

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

    app.include_router(health.router)
    app.include_router(logins.router)
    return app
