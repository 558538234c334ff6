"""What routes share: the database session, the stream lookup, query parameters and
the conversions between the API's values and the store's."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from zeal import Estimate
from zeal.protocol import EPSILON_MAX, PAYLOAD_BITS
from zeal.wire import MAX_TIMESTAMP
from zeal_server import store
from zeal_server.api.auth import operator, reader
from zeal_server.api.costs import SQLITE_STEPS, STATEMENT_SECONDS
from zeal_server.api.schemas import EstimateOut, StreamOut
from zeal_server.store.models import Stream

__all__ = [
    "API",
    "MAX_EXPORTS",
    "MAX_POINTS",
    "MAX_QUERY_MS",
    "READ",
    "WRITE",
    "Confidence",
    "Confirm",
    "Db",
    "Device",
    "End",
    "Epsilon",
    "Group",
    "Lower",
    "PayloadBits",
    "Start",
    "Upper",
    "as_datetime",
    "bounds_out",
    "confirmed",
    "devices_in",
    "echoed",
    "estimate_out",
    "invalid",
    "known_query",
    "query_ms",
    "session",
    "stream_or_404",
    "stream_out",
    "window",
]

#: Where the API's routes live, and the dependencies of its reads and its writes.
API = "/api/v1"
READ = [Depends(reader)]
WRITE = [Depends(operator)]
MAX_POINTS = 10_000
#: Exports running at once; one more is answered 429 with Retry-After.
MAX_EXPORTS = 4
#: Query windows are cut to [epoch, 2**47 ms] (year 6429): no reading lies outside, and
#: every bound stays a valid date.
MAX_QUERY_MS = 1 << 47
assert MAX_QUERY_MS < MAX_TIMESTAMP


def query_ms(value: datetime | None) -> int | None:
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


def as_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def estimate_out(estimate: Estimate | None) -> EstimateOut | None:
    if estimate is None:
        return None
    return EstimateOut(
        mean=estimate.mean,
        std_error=estimate.std_error,
        ci=estimate.ci,
        guaranteed=estimate.guaranteed,
        in_range=estimate.in_range,
    )


def stream_out(stream: Stream) -> StreamOut:
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
        max_epsilon_per_day=params.max_epsilon_per_day,
        readings_per_day=params.readings_per_day,
        readings_per_hour=params.readings_per_hour,
        grid_points=params.grid_points,
        created=as_datetime(stream.created_ms),
        released=None if stream.released_ms is None else as_datetime(stream.released_ms),
    )


def window(stream: Stream, start: datetime | None, end: datetime | None) -> tuple[int, int]:
    start_ms, end_ms = query_ms(start), query_ms(end)
    if start_ms is not None and end_ms is not None and start_ms >= end_ms:
        raise invalid("query", "start", f"start ({start}) must be before end ({end})")
    return store.bucket_bounds(stream, start_ms, end_ms)


def confirmed(confirm: str | None, name: str) -> None:
    if confirm != name:
        raise invalid(
            "query",
            "confirm",
            f"deleting cannot be undone: repeat the name as confirm={name}",
        )


def invalid(where: str, field: str | None, message: str) -> HTTPException:
    """A 422 in FastAPI's validation format, so every 422 has one documented shape; its
    message names the field (``named``)."""
    loc = [where] if field is None else [where, field]
    return HTTPException(422, [named({"loc": loc, "msg": message, "type": "value_error"})])


#: The alternatives of a union in a validation error's loc.
_ALTERNATIVE = re.compile(r"[\[(]")
_TYPES = {"int", "float", "str", "bool", "none", "datetime", "date", "list", "dict", "tuple"}
#: Pydantic's wording, as a rule about the field named before it.
_RULES = (("Input should be ", "must be "), ("Input should ", "must "))


def named(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error (FastAPI's format: ``loc``, ``msg``, ``type``) whose message
    starts with the field or parameter it is about and says the rule: "epsilon: must be
    greater than 0", "bogus: not a field of this request"."""
    loc = [str(part) for part in error.get("loc", ())]
    msg = str(error.get("msg", ""))
    kind = error.get("type")
    if kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "")
        return error | {"msg": f"body: not valid JSON ({reason}, at character {loc[-1]})"}
    # pydantic names the alternative of a union that refused too ("literal['a']", "int"):
    # the field is what the client wrote
    parts = [p for p in loc[1:] if not _ALTERNATIVE.search(p) and p not in _TYPES]
    field = ".".join(parts) or (loc[0] if loc else "request")
    if kind == "extra_forbidden" and "unknown" not in msg:
        msg = "not a field of this request"
    for old, new in _RULES:
        if msg.startswith(old):
            msg = new + msg.removeprefix(old)
            break
    if msg.startswith(f"{field}:") or msg.startswith(f"{field} "):
        return error | {"msg": msg}
    return error | {"msg": f"{field}: {msg}"}


def echoed(asked: datetime | None, bound: datetime | None) -> datetime | None:
    """A window's end as answered: the bucket it falls on, or, for a date beyond the dates
    readings can have (cut to [epoch, 2**47 ms]), the date asked, not the cut."""
    if asked is None or query_ms(asked) not in (0, MAX_QUERY_MS):
        return bound
    if asked.tzinfo is None:
        asked = asked.replace(tzinfo=UTC)
    return asked


def known_query(request: Request) -> None:
    """Refuses a query parameter the route does not define (422 naming it and the ones it
    takes): a misspelt filter must not answer for everything."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    calls = {d.call for d in route.dependant.dependencies}
    for check in (operator, reader):
        if check in calls:  # its 401/403 comes before any word about the route's parameters
            check(request, None)
    takes = _query_names(route)
    unknown = sorted(set(request.query_params) - takes)
    if unknown:
        offer = ", ".join(sorted(takes)) or "no query parameters"
        raise HTTPException(
            422,
            [
                {
                    "loc": ["query", name],
                    "msg": f"unknown query parameter {name!r}; this route takes: {offer}",
                    "type": "extra_forbidden",
                }
                for name in unknown
            ],
        )


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query names a route takes, its dependencies' too (found once, kept on the route)."""

    def walk(dependant: Dependant) -> Iterator[str]:
        yield from (str(p.alias) for p in dependant.query_params)
        for sub in dependant.dependencies:
            yield from walk(sub)

    names: frozenset[str] | None = getattr(route, "zeal_query_names", None)
    if names is None:
        names = frozenset(walk(route.dependant))
        route.zeal_query_names = names  # type: ignore[attr-defined]
    return names


def bounds_out(stream: Stream, first: int, stop: int) -> tuple[datetime | None, datetime | None]:
    start_ms, end_ms = store.window_ms(stream, first, stop)
    return (
        None if start_ms is None else as_datetime(start_ms),
        None if end_ms is None else as_datetime(end_ms),
    )


def devices_in(session: Session, stream: Stream, group: str | None) -> store.Devices:
    if group is None:
        return None
    try:
        return store.group_devices(session, stream, group)
    except store.StoreError as exc:
        raise invalid("query", "group", str(exc)) from exc


def session(request: Request) -> Iterator[Session]:
    """A request's database session. A costly read's (zeal_server.api.costs) statements time
    out after STATEMENT_SECONDS: a 503 that says so."""
    heavy = getattr(request.state, "heavy", None)
    with request.app.state.sessions() as session:
        if heavy is None:
            yield session
            return
        lift = _time_limit(session)
        try:
            yield session
        except OperationalError as exc:
            if not any(w in str(exc) for w in ("statement timeout", "interrupted")):
                raise
            session.rollback()
            raise HTTPException(
                503,
                f"the query ({heavy}) ran longer than {STATEMENT_SECONDS} s and was cancelled: "
                "ask for a shorter window or a longer interval",
            ) from None
        finally:
            lift()


def _time_limit(session: Session) -> Callable[[], None]:
    """Limit the session's statements to STATEMENT_SECONDS from now; returns what lifts it.
    PostgreSQL cancels a statement past its ``statement_timeout`` (for this transaction);
    SQLite has none, so a progress handler, called every few thousand steps of a query,
    interrupts it once the time is up ("interrupted")."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(text(f"SET LOCAL statement_timeout = '{STATEMENT_SECONDS}s'"))
        return lambda: None
    if dialect != "sqlite":
        return lambda: None
    raw = session.connection().connection.dbapi_connection
    deadline = time.monotonic() + STATEMENT_SECONDS
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), SQLITE_STEPS)  # type: ignore[union-attr]
    return lambda: raw.set_progress_handler(None, 0)  # type: ignore[union-attr]


Db = Annotated[Session, Depends(session)]


READ = [Depends(reader)]


Confidence = Annotated[
    float, Query(gt=0, le=0.999999, description="confidence level, e.g. 0.95 (at most 0.999999)")
]
Start = Annotated[datetime | None, Query(description="window start (ISO 8601; UTC if no zone)")]
End = Annotated[datetime | None, Query(description="window end, exclusive (ISO 8601)")]
Confirm = Annotated[
    str | None,
    Query(description="the name of what is deleted, again: deleting cannot be undone"),
]
#: The parameters of a stream that is not created yet (the previews).
Lower = Annotated[float, Query(description="lower end of the feasible range")]
Upper = Annotated[float, Query(description="upper end of the feasible range")]
Epsilon = Annotated[float, Query(gt=0, le=EPSILON_MAX, description="privacy budget per reading")]
PayloadBits = Annotated[
    int | None, Query(ge=PAYLOAD_BITS[0], le=store.MAX_SERVER_BITS, description="code width")
]
Device = Annotated[
    str | None,
    Query(description="one device's readings only (instead of a group)", max_length=200),
]
Group = Annotated[
    str | None, Query(description="devices whose tag matches key:value", max_length=200)
]


def stream_or_404(db: Session, name: str) -> Stream:
    stream = store.stream_by_name(db, name)
    if stream is None:
        raise HTTPException(404, f"no stream named {name!r}")
    return stream
