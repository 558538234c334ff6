"""Health for orchestrators and monitoring: ``/livez``, ``/readyz``, ``/healthz``, ``/metrics``.

``/livez`` says only that the process serves HTTP (restart it when this fails).
``/readyz`` says whether it can do its work: the database answers and, with a collector,
its writer runs and the broker connections are up and subscribed (send traffic elsewhere while it is
503; Compose's health check asks it). ``/healthz`` is the
older combined answer, kept for compatibility. Without a token none of them says more than
up or down; with the read or operator token (or on a server without tokens) they add what
was checked and the collector's figures. Errors never carry SQL or credentials.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from zeal_server.api.auth import reader, sees_details
from zeal_server.api.metrics import exposition
from zeal_server.api.running import Running
from zeal_server.api.schemas import StatusOut
from zeal_server.store.db import database_state

__all__ = ["router"]

router = APIRouter()


def _checks(request: Request) -> tuple[bool, dict[str, Any]]:
    """(ready, what was checked) for readiness: the database, the collector's writer
    thread, the broker connection, with ZEAL_NATS_URL the JetStream consumer, and with
    ZEAL_CHIRPSTACK_URL the connection to ChirpStack's broker."""
    state = request.app.state
    body: dict[str, Any] = {}
    body["database"] = database_state(state.engine)
    coll: Running | None = state.collector
    if coll is None:
        body["broker"] = "off"
    else:
        now = coll.status()
        # Connected but refused the subscription (the broker's ACL): it receives nothing.
        subscribed = "ok" if now.subscribed else "not subscribed"
        body["broker"] = subscribed if now.broker_connected else "down"
        # A writer stopped by a bug stores nothing more: not ready either (the Compose
        # health check asks /readyz), besides /livez's 503.
        body["writer"] = "down" if now.writer_error is not None else "ok"
        body["collector"] = {
            "client_id": now.client_id,
            "subscribed": now.subscribed,
            "queue": now.queued,
            "commit_lag_ms": coll.lag_summary(),
            "database_ok": now.database_ok,
            "last_error": now.last_error,
            "writer_error": now.writer_error,
            **now.counts,
        }
        if not now.database_ok:
            body["database"] = "failing in the collector"
        jetstream = now.source("jetstream")
        if jetstream is not None:  # the data come from NATS JetStream
            body["jetstream"] = "ok" if jetstream.ready else "down"
            body["collector"]["jetstream_error"] = jetstream.last_error
        chirpstack = now.source("chirpstack")
        if chirpstack is not None:  # LoRaWAN uplinks from ChirpStack's broker
            body["chirpstack"] = "ok" if chirpstack.ready else "down"
            body["collector"]["chirpstack_error"] = chirpstack.last_error
            body["collector"]["uplinks_skipped"] = chirpstack.skipped
    parts = ("writer", "broker", "jetstream", "chirpstack")
    up = all(body.get(part) not in ("down", "not subscribed") for part in parts)
    return body["database"] in ("ok", "busy") and up, body


def _answer(
    request: Request, ok: bool, words: tuple[str, str], body: dict[str, Any]
) -> JSONResponse:
    status = {"status": words[0] if ok else words[1]}
    details = body if sees_details(request) else {}
    return JSONResponse({**status, **details}, status_code=200 if ok else 503)


@router.get(
    "/livez",
    tags=["health"],
    responses={
        200: {"model": StatusOut, "description": "the process serves"},
        503: {
            "model": StatusOut,
            "description": "the collector's writer stopped on a bug: restart the server",
        },
    },
)
def livez(request: Request) -> JSONResponse:
    """Liveness: the process answers HTTP and, with a collector, its writer thread runs.
    A database or broker outage never fails it (the writer retries those), so such an
    outage never gets the server restarted; a writer stopped by a bug does."""
    coll: Running | None = request.app.state.collector
    if coll is not None and coll.status().writer_error is not None:
        return JSONResponse({"status": "writer stopped"}, status_code=503)
    return JSONResponse({"status": "live"})


@router.get(
    "/readyz",
    tags=["health"],
    responses={
        503: {
            "description": "the database or the broker is unreachable, or the collector's "
            "writer stopped"
        }
    },
)
def readyz(request: Request) -> JSONResponse:
    """Readiness: the database answers and, with a collector, its writer runs and the
    broker connection is up (503 otherwise). Details with a read or operator token."""
    ready, body = _checks(request)
    return _answer(request, ready, ("ready", "not ready"), body)


@router.get("/healthz", tags=["health"])
def healthz(request: Request) -> JSONResponse:
    """Up or down, as /readyz (kept for compatibility); with a token also the collector's
    queue, commit lag, counters and last error."""
    ready, body = _checks(request)
    return _answer(request, ready, ("up", "down"), body)


@router.get(
    "/metrics",
    tags=["health"],
    dependencies=[Depends(reader)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
def metrics(request: Request) -> Response:
    """Prometheus text format (prometheus_client): this process's collector figures and
    the database's (docs/operations.md lists every family)."""
    return Response(exposition(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
