"""The server package's exceptions, every one defined here::

ServerError
├── SettingsError (ValueError)       a ZEAL_ setting is missing or invalid: exit status 2
├── StoreError (ValueError)          a request the store cannot satisfy (unknown or
│                                    duplicate stream, bad parameters, a lost race)
├── ProvisioningError (ValueError)   a device login could not be made or removed (kind)
├── IdentityError (RuntimeError)     no collector id slot is free in the data directory
├── UndecodableError (ValueError)    decoding one message off a wire raised an unexpected
│                                    error (a bug; the message is refused, ingest goes on)
├── ChirpStackError (ValueError)     a ChirpStack event that is not a usable uplink (reason)
└── RemoteError                      the running server could not be asked, or refused
                                     (the CLI's remote commands)

Database and broker errors keep their own types (SQLAlchemy's, paho's) and are translated
where they reach a user: the HTTP layer answers 503, the CLI prints one line. This module
imports nothing but the standard library, so catching these costs no heavy import.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ChirpStackError",
    "EventReason",
    "IdentityError",
    "ProvisioningError",
    "ProvisioningKind",
    "RemoteError",
    "ServerError",
    "SettingsError",
    "StoreError",
    "UndecodableError",
]

#: Why a ChirpStack event gives no uplink (counted as a reject of that reason).
EventReason = Literal["bad_event", "no_time", "no_data"]

#: Why a device login could not be made or removed.
ProvisioningKind = Literal["invalid", "exists", "unknown", "off", "unavailable"]


class ServerError(Exception):
    """Base of the server's errors."""


class SettingsError(ServerError, ValueError):
    """A server setting is missing or invalid."""


class StoreError(ServerError, ValueError):
    """A request the store cannot satisfy (unknown or duplicate stream, bad parameters)."""


class ProvisioningError(ServerError, ValueError):
    """A device login could not be made or removed; ``kind`` says why."""

    def __init__(self, kind: ProvisioningKind, message: str) -> None:
        super().__init__(message)
        self.kind: ProvisioningKind = kind


class IdentityError(ServerError, RuntimeError):
    """Every collector id slot of the data directory is held by a running server."""


class UndecodableError(ServerError, ValueError):
    """Decoding one message raised an unexpected error, its cause (zeal_server.ingest.undecodable):
    the message is refused as ``undecodable``."""

    reason = "undecodable"


class ChirpStackError(ServerError, ValueError):
    """A ChirpStack event that is not a usable uplink; ``reason`` says why."""

    def __init__(self, reason: EventReason, message: str) -> None:
        super().__init__(message)
        self.reason: EventReason = reason


class RemoteError(ServerError):
    """The running server could not be asked, or refused; the message says which and why."""
