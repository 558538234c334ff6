"""Provisioning a list of device logins: what each entry asks for and what came of it.
The broker's admin (zeal_server.broker.provisioning) makes them; the API and the command
line hand them over."""

from __future__ import annotations

from dataclasses import dataclass

from zeal_server import store
from zeal_server.errors import ProvisioningError

__all__ = ["Outcome", "Wanted"]


@dataclass(frozen=True)
class Wanted:
    """One device of a list to provision: a password login, or a certificate (for the key
    of `csr`, a PEM request made on the device, or for a key made here)."""

    device: str
    certificate: bool = False
    csr: bytes | None = None


@dataclass(frozen=True)
class Outcome:
    """What provisioning one device of a list did: its password or its certificate, or
    why it was refused (`refused.kind` "exists": it had a login already; "unavailable":
    the broker failed, and may have made the login without this answer)."""

    device: str
    password: str | None = None
    issued: store.Issued | None = None
    refused: ProvisioningError | None = None
