"""The record of device certificates (revision 0015): which serials a device was issued and
which are revoked, for the revocation list the broker reads
(zeal_server.broker.certificates makes and signs them)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal_server.store.models import DeviceCertificate

__all__ = ["Issued", "record_certificate", "revoke_certificates", "revoked_certificates"]


@dataclass(frozen=True)
class Issued:
    """A certificate made for a device: PEM, and its private key's PEM when made on the
    server (None when the device sent a signing request: its key never left it)."""

    device: str
    certificate: str
    #: The serial number, lower-case hex.
    serial: str
    not_after: dt.datetime
    private_key: str | None = None


def record_certificate(session: Session, issued: Issued, now_ms: int) -> None:
    """Keep the certificate's serial for its device."""
    session.add(
        DeviceCertificate(
            serial=issued.serial,
            device=issued.device,
            issued_ms=now_ms,
            not_after_ms=int(issued.not_after.timestamp() * 1000),
        )
    )


def revoke_certificates(session: Session, device: str, now_ms: int) -> int:
    """Revoke every certificate of `device` not yet revoked; how many."""
    rows = session.scalars(
        select(DeviceCertificate).where(
            DeviceCertificate.device == device, DeviceCertificate.revoked_ms.is_(None)
        )
    ).all()
    for row in rows:
        row.revoked_ms = now_ms
    session.flush()
    return len(rows)


def revoked_certificates(session: Session) -> list[tuple[int, int]]:
    """(serial, revoked at in ms) of every revoked certificate, by serial."""
    rows = session.execute(
        select(DeviceCertificate.serial, DeviceCertificate.revoked_ms)
        .where(DeviceCertificate.revoked_ms.is_not(None))
        .order_by(DeviceCertificate.serial)
    ).all()
    return [(int(serial, 16), int(ms or 0)) for serial, ms in rows]
