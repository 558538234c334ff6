"""Device logins in the broker (operator token): ``POST`` makes one, ``DELETE`` revokes it.

The broker's own mechanism does the work (Mosquitto's dynamic security plugin, through
:mod:`zeal_server.broker.provisioning`); the server keeps no password. A revoked device is
disconnected at once and cannot connect again; the readings it sent stay stored (delete
them with ``DELETE /api/v1/streams/{name}/devices/{device}``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from pydantic import BaseModel, Field

from zeal_server import store
from zeal_server.api.auth import operator
from zeal_server.api.deps import Db
from zeal_server.api.running import Logins
from zeal_server.errors import ProvisioningError

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/devices", tags=["devices"], dependencies=[Depends(operator)])

Name = Annotated[str, Path(description="device id: 1-64 letters, digits, '_', '.' or '-'")]
STATUS = {"invalid": 422, "exists": 409, "unknown": 404, "off": 409, "unavailable": 502}
ANSWERS: dict[int | str, dict[str, Any]] = {
    409: {
        "description": "the device has a login already, or provisioning is off (no "
        "ZEAL_MQTT_ADMIN_USERNAME)"
    },
    404: {"description": "the device has no login made here"},
    502: {"description": "the broker is down, refused the admin login or did not answer"},
}


class LoginOut(BaseModel):
    device: str
    username: str = Field(description="the broker username (the device id)")
    password: str = Field(description="shown once; the server keeps no copy")
    broker: str = Field(description="the broker the login was made on")
    server_key: str = Field(
        description="the server's public key: give it to the device with its login "
        "(zeal-edge --server-key or ZEAL_SERVER_KEY); it believes only what this key, or a "
        "key it endorsed, signed"
    )


class RevokedOut(BaseModel):
    device: str
    revoked: bool = True


def _admin(request: Request) -> Logins:
    try:
        admin: Logins = request.app.state.logins_for(request.app.state.settings)
    except ProvisioningError as exc:
        raise HTTPException(STATUS[exc.kind], str(exc)) from None
    return admin


def _failed(exc: ProvisioningError) -> HTTPException:
    return HTTPException(STATUS[exc.kind], str(exc))


@router.get("", response_model=list[str], responses=ANSWERS)
def logins(request: Request) -> list[str]:
    """The devices with a broker login made here."""
    try:
        names: list[str] = _admin(request).provisioned()
    except ProvisioningError as exc:
        raise _failed(exc) from None
    return names


@router.post("/{device}/login", status_code=201, response_model=LoginOut, responses=ANSWERS)
def provision(device: Name, request: Request, db: Db) -> LoginOut:
    """Create the device's broker login: it may publish only its own data and presence
    (zeal/v1/+/{device}/up, .../presence) and read the stream configurations and its
    notices. The password is in this answer only, beside the server's key, which the device
    is to be given with it."""
    admin = _admin(request)
    key = store.signer(db).public
    try:
        password = admin.provision(device)
    except ProvisioningError as exc:
        raise _failed(exc) from None
    return LoginOut(
        device=device, username=device, password=password, broker=admin.broker.url, server_key=key
    )


@router.delete("/{device}/login", response_model=RevokedOut, responses=ANSWERS)
def revoke(device: Name, request: Request) -> RevokedOut:
    """Delete the device's broker login: the broker disconnects it now, and it cannot
    connect again. Its stored readings stay."""
    try:
        _admin(request).revoke(device)
    except ProvisioningError as exc:
        raise _failed(exc) from None
    return RevokedOut(device=device)
