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
from zeal_server.logins import Wanted

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


class LoginIn(BaseModel):
    """How the device is to log in: a password (the default), or a client certificate."""

    model_config = {"extra": "forbid"}

    certificate: bool = Field(
        default=False,
        description="a client certificate instead of a password (the broker's certificate "
        "listener takes its common name, the device id, as the login); needs the device CA "
        "(ZEAL_DEVICE_CA)",
    )
    csr: str | None = Field(
        default=None,
        max_length=16_384,
        description="the device's certificate signing request (PEM), made on the device so "
        "that its private key never leaves it; implies certificate. Without it a key is "
        "made here and returned once",
    )


class LoginOut(BaseModel):
    device: str
    username: str = Field(description="the broker username (the device id)")
    password: str | None = Field(
        description="shown once; the server keeps no copy (null: the device logs in with "
        "its certificate)"
    )
    certificate: str | None = Field(
        default=None, description="the device's client certificate (PEM), with certificate or csr"
    )
    private_key: str | None = Field(
        default=None,
        description="its private key (PEM), made here because no csr was given: shown once, "
        "kept nowhere",
    )
    serial: str | None = Field(default=None, description="the certificate's serial number (hex)")
    broker: str = Field(description="the broker the login was made on")
    server_key: str = Field(
        description="the server's public key: give it to the device with its login "
        "(zeal-edge --server-key or ZEAL_SERVER_KEY); it believes only what this key, or a "
        "key it endorsed, signed"
    )


#: Devices of one list request: its largest body (500 names of 64 characters) stays under
#: the 64 KiB every request body is held to. A device's signing request goes in a call of
#: its own (POST /devices/{device}/login), or in a list to `zeal-server devices provision
#: --from`.
MAX_LIST = 500


class ListedIn(BaseModel):
    """One device of a list and how it is to log in."""

    model_config = {"extra": "forbid"}

    device: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="device id: 1-64 letters, digits, '_', '.' or '-'",
    )
    certificate: bool = Field(
        default=False,
        description="a client certificate and a key made here instead of a password (needs "
        "the device CA, ZEAL_DEVICE_CA)",
    )


class LoginsIn(BaseModel):
    model_config = {"extra": "forbid"}

    devices: list[ListedIn] = Field(
        min_length=1,
        max_length=MAX_LIST,
        description=f"the devices to provision (at most {MAX_LIST}, each once)",
    )


class RefusedOut(BaseModel):
    device: str
    status: int = Field(
        description="409: the device has a login already; 502: the broker failed (it may "
        "have made the login: GET /api/v1/devices shows it, DELETE its login to start again)"
    )
    detail: str


class LoginsOut(BaseModel):
    provisioned: list[LoginOut] = Field(
        description="the logins made, in the list's order: the passwords and keys are in "
        "this answer only"
    )
    refused: list[RefusedOut] = Field(description="the devices of the list not provisioned")


class RevokedOut(BaseModel):
    device: str
    revoked: bool = True
    certificates: int = Field(0, description="the device's certificates revoked now")
    confirmed: bool = Field(
        False,
        description="the broker refuses them already (checked with a probe certificate "
        "revoked in the same list); false: it will once it reads the list",
    )


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
def provision(device: Name, request: Request, db: Db, body: LoginIn | None = None) -> LoginOut:
    """Create the device's broker login: it may publish only its own data and presence
    (zeal/v1/+/{device}/up, .../presence) and read the stream configurations and its
    notices. The password (or, with `certificate` or `csr`, the client certificate and a
    key made here) is in this answer only, beside the server's key, which the device is to
    be given with it."""
    admin = _admin(request)
    key = store.signer(db).public
    wanted = body or LoginIn()
    try:
        if wanted.certificate or wanted.csr is not None:
            csr = wanted.csr.encode() if wanted.csr is not None else None
            issued = admin.provision_certificate(db, device, csr)  # commits its record
            listener = request.app.state.settings.broker
            return LoginOut(
                device=device,
                username=device,
                password=None,
                certificate=issued.certificate,
                private_key=issued.private_key,
                serial=issued.serial,
                broker=listener.url if listener else admin.broker.url,
                server_key=key,
            )
        password = admin.provision(device)
    except ProvisioningError as exc:
        raise _failed(exc) from None
    return LoginOut(
        device=device, username=device, password=password, broker=admin.broker.url, server_key=key
    )


@router.post(
    "/logins",
    response_model=LoginsOut,
    responses={
        422: {
            "description": "an entry is invalid (a bad or reserved name, a device twice): "
            "nothing is made"
        },
        **ANSWERS,
    },
)
def provision_list(body: LoginsIn, request: Request, db: Db) -> LoginsOut:
    """Provision a list of devices (passwords, or certificates with keys made here), as
    POST /devices/{device}/login does each, some thirty to a message to the broker. Every
    entry is checked first (one bad entry: 422, nothing made); a device that has a login
    already is refused, the others are made. Each certificate's record is committed before
    the answer is sent. A device's own signing request goes through
    POST /devices/{device}/login, or a list of them to `zeal-server devices provision
    --from`."""
    admin = _admin(request)
    key = store.signer(db).public
    wanted = [Wanted(one.device, certificate=one.certificate) for one in body.devices]
    listener = request.app.state.settings.broker
    answer = LoginsOut(provisioned=[], refused=[])
    try:
        for outcome in admin.provision_many(wanted, db):
            if outcome.refused is not None:
                answer.refused.append(
                    RefusedOut(
                        device=outcome.device,
                        status=STATUS[outcome.refused.kind],
                        detail=str(outcome.refused),
                    )
                )
                continue
            issued = outcome.issued
            answer.provisioned.append(
                LoginOut(
                    device=outcome.device,
                    username=outcome.device,
                    password=outcome.password,
                    certificate=issued.certificate if issued else None,
                    private_key=issued.private_key if issued else None,
                    serial=issued.serial if issued else None,
                    broker=listener.url if issued and listener else admin.broker.url,
                    server_key=key,
                )
            )
    except ProvisioningError as exc:
        raise _failed(exc) from None
    if not answer.provisioned and answer.refused and answer.refused[0].status == 502:
        raise HTTPException(502, answer.refused[0].detail)  # nothing made: the broker is down
    return answer


@router.delete("/{device}/login", response_model=RevokedOut, responses=ANSWERS)
def revoke(device: Name, request: Request, db: Db) -> RevokedOut:
    """Delete the device's broker login and revoke its certificates: the broker disconnects
    it now, and it cannot connect again. Its stored readings stay."""
    try:
        revoked = _admin(request).revoke(device, db)
        db.commit()
    except ProvisioningError as exc:
        raise _failed(exc) from None
    return RevokedOut(device=device, certificates=revoked.certificates, confirmed=revoked.confirmed)
