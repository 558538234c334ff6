"""Zeal server: the MQTT collector, the compressed store, the aggregating HTTP API and the
operator dashboard (``zeal-server``; docs/server.md, docs/architecture.md).

Subpackages by subsystem: ``store`` (tables and SQL), ``ingest`` (one transaction of
messages), ``broker`` (MQTT and NATS: the collector), ``api`` (FastAPI); ``app`` wires the
last two together, ``cli`` is on top. Importing the package loads nothing heavy: the
application is ``zeal_server.app.create_app``. Its errors (``zeal_server.errors``) are
re-exported here.
"""

from zeal_server.errors import (
    IdentityError,
    ProvisioningError,
    ServerError,
    SettingsError,
    StoreError,
)

__all__ = ["IdentityError", "ProvisioningError", "ServerError", "SettingsError", "StoreError"]
