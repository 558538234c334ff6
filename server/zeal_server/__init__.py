"""Zeal server: the MQTT collector, the compressed store, the aggregating HTTP API and the
operator dashboard (``zeal-server``; docs/server.md).

Importing the package loads no web framework: the application is
``zeal_server.app.create_app``. Its errors (``zeal_server.errors``) are re-exported here.
"""

from zeal_server.errors import IdentityError, ProvisioningError, ServerError, StoreError
from zeal_server.settings import SettingsError

__all__ = ["IdentityError", "ProvisioningError", "ServerError", "SettingsError", "StoreError"]
