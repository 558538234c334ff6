"""LoRaWAN bindings: which stream a ChirpStack application's uplinks go to
(``/api/v1/lorawan/bindings``; docs/lorawan.md)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response

from zeal_server import store
from zeal_server.api.deps import API, READ, WRITE, Db, as_datetime, invalid, stream_or_404
from zeal_server.api.schemas import BindingIn, BindingOut

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter()

Application = Annotated[
    str, Path(description="ChirpStack's application id (a UUID)", max_length=64)
]
FPort = Annotated[
    int,
    Path(
        ge=0,
        le=store.MAX_F_PORT,
        description="the FPort, 1 to 223; 0 binds the application's ports not bound on their own",
    ),
]


def _out(binding: store.Binding) -> BindingOut:
    return BindingOut(
        application_id=binding.application_id,
        f_port=binding.f_port,
        stream=binding.stream,
        device_names=binding.device_names,  # type: ignore[arg-type]
        created=as_datetime(binding.created_ms),
    )


def _changed(request: Request) -> None:
    if request.app.state.collector is not None:
        request.app.state.collector.bindings_changed()


@router.get(f"{API}/lorawan/bindings", dependencies=READ, response_model=list[BindingOut])
def list_bindings(db: Db) -> list[BindingOut]:
    """Every binding of a ChirpStack application (and FPort) to a stream."""
    return [_out(b) for b in store.list_bindings(db)]


@router.put(
    f"{API}/lorawan/bindings/{{application_id}}/{{f_port}}",
    dependencies=WRITE,
    response_model=BindingOut,
    responses={404: {"description": "no such stream"}},
)
def put_binding(
    application_id: Application, f_port: FPort, body: BindingIn, request: Request, db: Db
) -> BindingOut:
    """Send the application's uplinks on this FPort (0: on its ports not bound on their
    own) to a stream, its devices named by DevEUI or ChirpStack device name (operator
    token). Replaces the port's binding, if any; the collector takes it up at once."""
    stream = stream_or_404(db, body.stream)
    try:
        binding = store.bind(
            db, application_id, f_port, stream, body.device_names, now_ms=store.now_ms()
        )
    except store.StoreError as exc:
        db.rollback()
        raise invalid("path", "application_id", str(exc)) from exc
    db.commit()
    _changed(request)
    log.warning(
        "LoRaWAN application %s port %d bound to stream %s (devices by %s)",
        application_id,
        f_port,
        stream.name,
        body.device_names,
    )
    return _out(binding)


@router.delete(
    f"{API}/lorawan/bindings/{{application_id}}/{{f_port}}",
    dependencies=WRITE,
    status_code=204,
    responses={404: {"description": "no such binding"}},
)
def delete_binding(
    application_id: Application, f_port: FPort, request: Request, db: Db
) -> Response:
    """Stop storing the application's uplinks on this FPort (operator token); what was
    stored stays. Uplinks it named are then skipped (counted, not stored)."""
    if not store.unbind(db, application_id, f_port):
        raise HTTPException(404, f"no binding for application {application_id!r} port {f_port}")
    db.commit()
    _changed(request)
    log.warning("LoRaWAN application %s port %d unbound", application_id, f_port)
    return Response(status_code=204)
