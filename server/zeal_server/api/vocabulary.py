"""Query parameters renamed to the one vocabulary of docs/api.md, and their old names.

An old name is still accepted for one release: :class:`OldNames` rewrites it to the new
one before routing, answers with ``Deprecation: true`` and a ``Warning`` header that names
both, and logs it once per process and name. Given beside its new name, the old one is
left alone, so the route refuses it as unknown (422).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zeal.vocabulary import said
from zeal_server.api.deps import API

__all__ = ["RENAMED", "OldNames"]

log = logging.getLogger(__name__)

# Per route (a pattern of its path): old query name -> new name.
RENAMED: dict[str, dict[str, str]] = {
    f"{API}/streams/{{name}}/series": {"interval": "interval_seconds"},
    f"{API}/preview": {"interval": "interval_seconds", "reading_every": "reading_every_seconds"},
    f"{API}/streams/{{name}}/compare": {"a": "group_a", "b": "group_b", "unit": "independent"},
}
_ROUTES = [
    (re.compile("^" + re.escape(path).replace(re.escape("{name}"), "[^/]+") + "$"), names)
    for path, names in RENAMED.items()
]


def _renames(path: str) -> dict[str, str]:
    return next((names for pattern, names in _ROUTES if pattern.match(path)), {})


class OldNames:
    """ASGI middleware: a renamed query parameter's old name, rewritten to the new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        names = _renames(scope["path"]) if scope["type"] == "http" else {}
        query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True) if names else []
        given = {key for key, _ in pairs}
        used = sorted(old for old in given & names.keys() if names[old] not in given)
        if not used:
            await self.app(scope, receive, send)
            return
        renamed = [(names[k] if k in used else k, v) for k, v in pairs]
        scope = {**scope, "query_string": urlencode(renamed).encode("latin-1")}
        told = "; ".join(said(f"query parameter {old!r}", repr(names[old])) for old in used)
        for old in used:
            if old not in self.logged:
                self.logged.add(old)
                log.warning("%s", told)
        warning = f'299 zeal "{told}"'

        async def warned(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"deprecation", b"true"), (b"warning", warning.encode("latin-1"))]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, warned)
