"""Which stream a LoRaWAN uplink goes to: ChirpStack applications and FPorts bound to
streams (``models.LoRaWANBinding``), and how a device is named there.

The collector's ChirpStack source (zeal_server.broker.chirpstack.uplinks) reads them all at once
(:func:`binding_map`); the API and ``zeal-server lorawan`` change them.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from zeal_server.errors import StoreError
from zeal_server.store.models import LoRaWANBinding, Stream

__all__ = [
    "DEVICE_NAMES",
    "MAX_F_PORT",
    "Binding",
    "bind",
    "binding_map",
    "check_binding",
    "list_bindings",
    "unbind",
]

#: How a bound application's devices are named in Zeal: by DevEUI (16 lower-case hex
#: digits, the default) or by their ChirpStack device name (which must then be a valid
#: Zeal device name; an uplink of a device whose name is not is refused, ``bad_topic``).
DEVICE_NAMES: Final = ("dev_eui", "device_name")
#: Application FPorts are 1 to 223 (224 is the MAC test port, 225 to 255 reserved); 0
#: binds every port of the application that is not bound on its own.
MAX_F_PORT: Final = 223
#: ChirpStack v4 application ids are UUIDs; letters, digits and '-' up to 64 allow others.
_APPLICATION = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")


class Binding(NamedTuple):
    """A binding as the API shows it."""

    application_id: str
    f_port: int
    stream: str
    device_names: str
    created_ms: int


def check_binding(application_id: object, f_port: object, device_names: object) -> None:
    """StoreError naming what is wrong with a binding's key or device naming."""
    if not isinstance(application_id, str) or not _APPLICATION.fullmatch(application_id):
        raise StoreError(
            f"application_id {application_id!r} is invalid: ChirpStack's application id (a "
            "UUID), 1 to 64 letters, digits or '-'"
        )
    if isinstance(f_port, bool) or not isinstance(f_port, int) or not 0 <= f_port <= MAX_F_PORT:
        raise StoreError(
            f"f_port must be 1 to {MAX_F_PORT} (an application FPort) or 0 (every port of the "
            f"application not bound on its own), got {f_port!r}"
        )
    if device_names not in DEVICE_NAMES:
        raise StoreError(
            f"device_names must be one of {', '.join(DEVICE_NAMES)}, got {device_names!r}"
        )


def list_bindings(session: Session) -> list[Binding]:
    """Every binding, by application and port."""
    query = (
        select(LoRaWANBinding, Stream.name)
        .join(Stream, Stream.id == LoRaWANBinding.stream_id)
        .order_by(LoRaWANBinding.application_id, LoRaWANBinding.f_port)
    )
    return [
        Binding(b.application_id, b.f_port, name, b.device_names, b.created_ms)
        for b, name in session.execute(query)
    ]


def binding_map(session: Session) -> dict[tuple[str, int], tuple[str, str]]:
    """(application id, f_port) -> (stream name, device naming), for the collector."""
    return {
        (b.application_id, b.f_port): (b.stream, b.device_names) for b in list_bindings(session)
    }


def bind(
    session: Session,
    application_id: str,
    f_port: int,
    stream: Stream,
    device_names: str = "dev_eui",
    *,
    now_ms: int,
) -> Binding:
    """Bind the application's port (0: its other ports) to `stream`, replacing what it was
    bound to. Returns the binding."""
    check_binding(application_id, f_port, device_names)
    row = session.get(LoRaWANBinding, (application_id, f_port))
    if row is None:
        row = LoRaWANBinding(application_id=application_id, f_port=f_port, created_ms=now_ms)
        session.add(row)
    row.stream_id, row.device_names = stream.id, device_names
    session.flush()
    return Binding(application_id, f_port, stream.name, device_names, row.created_ms)


def unbind(session: Session, application_id: str, f_port: int) -> bool:
    """Remove a binding; False when there was none."""
    result = session.execute(
        delete(LoRaWANBinding).where(
            LoRaWANBinding.application_id == application_id, LoRaWANBinding.f_port == f_port
        )
    )
    return bool(getattr(result, "rowcount", 0))
