"""Bearer tokens: who may write (the operator token) and who may read (the read token, or
the operator token: an operator looks at what they run with the one token).

FastAPI's ``HTTPBearer`` declares the two schemes, so the OpenAPI document lists them and
``/docs`` offers "Authorize". The decision itself is :func:`refusal`, the one place a token
is compared (constant time, ``hmac.compare_digest``); the route dependencies, the write
guard in front of every body and ``/healthz``'s details all ask it. Without a configured
token the corresponding access is open (development). Tokens are never logged: neither
uvicorn's access log nor ours prints a header.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from zeal_server.settings import ServerSettings

__all__ = [
    "OPERATOR",
    "READ",
    "Refusal",
    "operator",
    "read_refusal",
    "reader",
    "refusal",
    "sees_details",
]

OPERATOR = HTTPBearer(
    scheme_name="OperatorToken",
    description="ZEAL_OPERATOR_TOKEN: every write (POST, PUT, PATCH, DELETE)",
    auto_error=False,
)
READ = HTTPBearer(
    scheme_name="ReadToken",
    description="ZEAL_READ_TOKEN: every read, when the server has one (the operator token "
    "opens every read too)",
    auto_error=False,
)

#: (status, detail, extra headers) of a refused request.
Refusal = tuple[int, str, dict[str, str]]


#: The variable that carries each token, named in the refusals so that a client knows what
#: to set.
VARIABLES = {"operator": "ZEAL_OPERATOR_TOKEN", "read": "ZEAL_READ_TOKEN"}


def refusal(authorization: str | bytes | None, expected: str | None, what: str) -> Refusal | None:
    """Why a request with this Authorization header may not pass; None when it may (or when
    no token is configured). 401 without a bearer token, 403 with a wrong one; each names
    the variable of the token wanted."""
    if expected is None:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return (
            401,
            f"{what} token required: Authorization: Bearer and the server's {_variables(what)}",
            {"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return 403, f"wrong {what} token: not the server's {_variables(what)}", {}
    return None


def _variables(what: str) -> str:
    if what == "read":  # the operator token opens reads too (read_refusal)
        return "ZEAL_READ_TOKEN (or ZEAL_OPERATOR_TOKEN)"
    return VARIABLES.get(what, "token")


def read_refusal(authorization: str | bytes | None, settings: ServerSettings) -> Refusal | None:
    """Why a read may not pass: it needs the read token, or the operator token (both
    compared in constant time); None when it may, or when the server has no read token."""
    found = refusal(authorization, settings.read_token, "read")
    if found is None or found[0] == 401 or settings.operator_token is None:
        return found
    if refusal(authorization, settings.operator_token, "operator") is None:
        return None
    return found


def _settings(request: Request) -> ServerSettings:
    settings: ServerSettings = request.app.state.settings
    return settings


def _enforce(found: Refusal | None) -> None:
    if found is not None:
        status, detail, headers = found
        raise HTTPException(status, detail, headers=headers or None)


def operator(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(OPERATOR)],
) -> None:
    """Dependency of every write route."""
    _enforce(
        refusal(request.headers.get("authorization"), _settings(request).operator_token, "operator")
    )


def reader(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(READ)],
) -> None:
    """Dependency of every read route."""
    _enforce(read_refusal(request.headers.get("authorization"), _settings(request)))


def sees_details(request: Request) -> bool:
    """Whether a health answer may include details (errors, counters): with the read or the
    operator token, or when the server has no token at all."""
    settings = _settings(request)
    tokens = [t for t in (settings.read_token, settings.operator_token) if t is not None]
    header = request.headers.get("authorization")
    return not tokens or any(refusal(header, t, "") is None for t in tokens)
