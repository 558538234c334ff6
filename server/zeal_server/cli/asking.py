"""How ``zeal-server`` commands ask a running server over HTTP, as ``kubectl`` and ``influx``
do: ``--server URL`` (or ``ZEAL_SERVER_URL``, default http://127.0.0.1:8000) with the read
token (``ZEAL_READ_TOKEN``, else ``ZEAL_OPERATOR_TOKEN``; writes send
``ZEAL_OPERATOR_TOKEN``), an https:// server's certificate checked with ``--ca`` (or
``ZEAL_SERVER_CA``, else the system's CAs). They open no database and need no other
setting. Errors are one
line, exit status 2 (as the rest of ``zeal-server``)."""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.client import HTTPResponse
from typing import Any

from zeal_server.cli.common import DEFAULT_SERVER
from zeal_server.errors import RemoteError

__all__ = ["Handler", "ask", "base", "get", "open_server", "run", "stream_path"]

#: A command carried out over HTTP: it prints its answer, or raises RemoteError.
Handler = Callable[[argparse.Namespace, Mapping[str, str]], None]


def get(args: argparse.Namespace, env: Mapping[str, str], path: str, **query: Any) -> Any:
    return ask(args, env, "GET", path, None, **query)


def ask(
    args: argparse.Namespace,
    env: Mapping[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
    **query: Any,
) -> Any:
    with open_server(args, env, method, path, body, **query) as response:
        return json.load(response)


def base(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return str(args.server or env.get("ZEAL_SERVER_URL") or DEFAULT_SERVER).rstrip("/")


@contextmanager
def open_server(
    args: argparse.Namespace,
    env: Mapping[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
    **query: Any,
) -> Iterator[HTTPResponse]:
    where = base(args, env)
    given = {k: v for k, v in query.items() if v is not None}
    url = f"{where}/api/v1{path}" + (f"?{urllib.parse.urlencode(given)}" if given else "")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    reads = env.get("ZEAL_READ_TOKEN") or env.get("ZEAL_OPERATOR_TOKEN")
    token = reads if method == "GET" else env.get("ZEAL_OPERATOR_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    ca = getattr(args, "ca", None) or env.get("ZEAL_SERVER_CA") or None
    context = None
    if where.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=ca)
        except OSError as exc:
            raise RemoteError(f"cannot read the CA certificate {ca}: {exc}") from None
    try:
        response = urllib.request.urlopen(request, timeout=30, context=context)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.load(exc).get("detail")
        except (ValueError, AttributeError):
            detail = exc.reason
        if isinstance(detail, list):
            detail = "; ".join(str(d.get("msg", d)) for d in detail)
        hint = _token_hint(method, env) if exc.code in (401, 403) else ""
        raise RemoteError(f"{where} answered {exc.code}: {detail}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise RemoteError(
                f"the server at {where} presents a certificate this command cannot check "
                f"({reason.verify_message}): give its CA with --ca or ZEAL_SERVER_CA "
                "(deploy/tls/ca.crt)"
            ) from None
        raise RemoteError(
            f"cannot reach the server at {where}: {reason} (is it running? --server or "
            "ZEAL_SERVER_URL names it; --local opens the database instead where a command "
            "has it)"
        ) from None
    with response:
        yield response


def _token_hint(method: str, env: Mapping[str, str]) -> str:
    """What to set after a 401 or 403: the variable of the token the command sends."""
    if method != "GET":
        if not env.get("ZEAL_OPERATOR_TOKEN"):
            also = " (ZEAL_READ_TOKEN only opens reads)" if env.get("ZEAL_READ_TOKEN") else ""
            return (
                " -- this command writes: set ZEAL_OPERATOR_TOKEN to the server's operator "
                f"token{also}"
            )
        return " -- ZEAL_OPERATOR_TOKEN is set, but not to the server's operator token"
    for name in ("ZEAL_READ_TOKEN", "ZEAL_OPERATOR_TOKEN"):
        if env.get(name):
            return (
                f" -- {name} is set, but not to a token of the server (its read token, or "
                "its operator token)"
            )
    return " -- set ZEAL_READ_TOKEN (or ZEAL_OPERATOR_TOKEN) to the server's token"


def stream_path(name: str) -> str:
    return f"/streams/{urllib.parse.quote(name, safe='')}"


def run(handler: Handler, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Carry out one command over HTTP: exit status 0, or 2 with its error in one line."""
    try:
        handler(args, os.environ if env is None else env)
    except RemoteError as exc:
        print(f"zeal-server: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
