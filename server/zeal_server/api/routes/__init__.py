"""Routes by resource, each a top-level function on an ``APIRouter`` (read and tested
alone); ``zeal_server.api.application`` includes them."""

from __future__ import annotations

from zeal_server.api.routes import health, logins

__all__ = ["health", "logins"]
