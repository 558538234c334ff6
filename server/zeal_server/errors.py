"""The server package's exceptions::

ServerError
├── SettingsError (ValueError)       a ZEAL_ setting is missing or invalid: exit status 2
├── StoreError (ValueError)          a request the store cannot satisfy (unknown or
│                                    duplicate stream, bad parameters, a lost race)
├── ProvisioningError (ValueError)   a device login could not be made or removed (kind)
└── IdentityError (RuntimeError)     no collector id slot is free in the data directory

Database and broker errors keep their own types (SQLAlchemy's, paho's) and are translated
where they reach a user: the HTTP layer answers 503, the CLI prints one line.
"""

from __future__ import annotations

__all__ = ["IdentityError", "ServerError"]


class ServerError(Exception):
    """Base of the server's errors."""


class IdentityError(ServerError, RuntimeError):
    """Every collector id slot of the data directory is held by a running server."""
