"""Streams: create, list, read, change the retention of, and delete them (``/api/v1/streams``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from zeal_server import store
from zeal_server.api.deps import (
    API,
    READ,
    WRITE,
    Confirm,
    Db,
    confirmed,
    invalid,
    stream_or_404,
    stream_out,
)
from zeal_server.api.schemas import DeletedOut, ServerOut, StreamIn, StreamOut, StreamPatch

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter()


@router.get(f"{API}/streams", dependencies=READ, response_model=list[StreamOut])
def list_streams(db: Db) -> list[StreamOut]:
    """All streams with their parameters."""
    return [stream_out(s) for s in store.list_streams(db)]


@router.post(
    f"{API}/streams",
    dependencies=WRITE,
    status_code=201,
    response_model=StreamOut,
    responses={409: {"description": "stream exists"}},
)
def create_stream(body: StreamIn, request: Request, db: Db) -> StreamOut:
    """Create a stream (operator token); its parameters are then published for agents.
    On a NATS deployment (ZEAL_NATS_URL) a name with a '.' is refused: NATS cannot carry
    it in a subject."""
    if request.app.state.settings.nats_servers and (
        problem := store.name_problem("stream", body.name)
    ):
        raise invalid("body", "name", problem)
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
    return stream_out(stream)


@router.get(f"{API}/streams/{{name}}", dependencies=READ, response_model=StreamOut)
def get_stream(name: str, db: Db) -> StreamOut:
    """One stream's parameters and derived values."""
    return stream_out(stream_or_404(db, name))


@router.patch(f"{API}/streams/{{name}}", dependencies=WRITE, response_model=StreamOut)
def patch_stream(name: str, body: StreamPatch, request: Request, db: Db) -> StreamOut:
    """Change a stream's retention or privacy policy (operator token; fields left out stay).
    A shorter retention deletes what is older at the collector's next housekeeping, within
    a minute, for good. A new policy gives the stream a new fingerprint and configuration:
    devices are refused (fingerprint_mismatch) until they take it, which agents do by
    themselves from the retained configuration."""
    stream = stream_or_404(db, name)
    given = body.model_fields_set
    if "retention_days" in given:
        store.set_retention(db, stream, body.retention_days)
    if "max_epsilon_per_day" in given:
        if body.max_epsilon_per_day is None:
            raise invalid(
                "body", "max_epsilon_per_day", "a stream's privacy policy cannot be removed"
            )
        try:
            store.set_policy(db, stream, body.max_epsilon_per_day)
        except store.StoreError as exc:
            db.rollback()
            raise invalid("body", "max_epsilon_per_day", str(exc)) from exc
    db.commit()
    if "retention_days" in given:
        log.warning("stream %s: retention set to %s days", name, body.retention_days)
    if "max_epsilon_per_day" in given:
        log.warning(
            "stream %s: privacy policy set to %s epsilon per device per day (fingerprint %s)",
            name,
            stream.max_epsilon_per_day,
            stream.fingerprint,
        )
        if request.app.state.collector is not None:
            request.app.state.collector.configs.publish(store.config_of(db, stream))
            request.app.state.collector.streams_changed()
    return stream_out(stream)


@router.delete(
    f"{API}/streams/{{name}}",
    dependencies=WRITE,
    response_model=DeletedOut,
    responses={422: {"description": "confirm missing or not the stream's name"}},
)
def delete_stream(name: str, request: Request, db: Db, confirm: Confirm = None) -> DeletedOut:
    """Delete a stream and everything stored for it (operator token; confirm=NAME).
    Its retained configuration is replaced by its signed tombstone on the broker, and
    agents sending to it halt."""
    stream = stream_or_404(db, name)
    confirmed(confirm, name)
    tombstone = store.tombstone_of(db, name, stream.created_ms)
    readings = store.delete_stream(db, stream)
    db.commit()
    if request.app.state.collector is not None:
        request.app.state.collector.configs.withdraw(tombstone)
        request.app.state.collector.streams_changed()
    log.warning("stream %s deleted through the API (%d readings)", name, readings)
    return DeletedOut(stream=name, device=None, readings=readings)


@router.post(f"{API}/streams/{{name}}/release", dependencies=WRITE, response_model=StreamOut)
def release_stream(name: str, request: Request, db: Db) -> StreamOut:
    """Release the agents halted on this stream (operator token): those whose stream was
    deleted or created anew under them, or whose policy ceiling it passed, and that wait
    for their server (agents run with --on-halt wait, as the systemd unit does). The
    stream's configuration says so from now on, signed, and each such agent adopts it
    within seconds, if its own ceilings allow. Nothing stored changes (docs/edge-agent.md,
    "Recovering a halted fleet")."""
    stream = stream_or_404(db, name)
    store.release_stream(db, stream)
    db.commit()
    log.warning("stream %s: agents halted on it released", name)
    if request.app.state.collector is not None:
        request.app.state.collector.configs.publish(store.config_of(db, stream))
        request.app.state.collector.streams_changed()
    return stream_out(stream)


@router.get(f"{API}/streams/{{name}}/config", dependencies=READ)
def get_config(name: str, db: Db) -> dict[str, Any]:
    """The configuration document agents use (also retained at zeal/v1/{name}/config);
    save it as the agent's --params file."""
    return store.config_of(db, stream_or_404(db, name))


@router.get(f"{API}/server", dependencies=READ, response_model=ServerOut)
def server(db: Db, request: Request) -> ServerOut:
    """This server: its installation id and the public key agents check what it signs with
    (configurations, tombstones, notices), as they are given it (zeal-edge --server-key),
    with the chain of endorsements from its first key when it was rotated; and which tokens
    it requires (the dashboard says so)."""
    settings = request.app.state.settings
    return ServerOut(
        server=store.installation_id(db),
        key=store.signer(db).public,
        endorsements=store.endorsements(db),
        operator_token_required=settings.operator_token is not None,
        read_token_required=settings.read_token is not None,
    )
