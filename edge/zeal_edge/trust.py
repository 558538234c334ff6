"""Which messages from the broker an agent believes: those its server signed.

The agent acts on its stream's configuration (it adopts it, or halts on a tombstone or on a
stream created anew) and on the server's notices (a sequence reset moves its numbers on, an
``unknown_stream`` halts it). Anyone who may publish on those topics (a leaked collector
login, another server on the broker) could otherwise stop a fleet with one empty message. So
each must verify (Ed25519, ``zeal.signed``) under the key the agent trusts: the one given
with ``--server-key`` (handed over with the device's login at provisioning), pinned in its
outbox, or one that key endorsed when the server rotated its key (the document's
``endorsements`` lead from the trusted key to the one that signed it). Only an agent
started with ``--trust-first-use`` adopts, with no key given, the key of the first
configuration it sees (and says so in a warning: whoever retains a configuration first on
the broker would own it). Whatever does not verify is ignored, counted (``zeal-edge
status``) and logged once a minute; it never halts the agent.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from zeal.signed import (
    ENDORSEMENTS,
    KEY,
    KEY_BYTES,
    KEY_PURPOSE,
    SIGNATURE,
    SIGNATURE_BYTES,
    decode_field,
    signed_bytes,
)
from zeal_edge.errors import UnverifiedError

__all__ = ["check_key", "endorsed", "verified"]

#: Links of an endorsement chain an agent follows at most (a key rotated more often than
#: this since the agent last heard from its server needs the new key given).
MAX_CHAIN = 64


def check_key(text: str) -> str:
    """A server's public key as given (--server-key): 32 bytes in standard base64."""
    value = text.strip()
    if decode_field(value, KEY_BYTES) is None:
        raise ValueError(
            "must be a server's public key, 44 characters of base64 (the 'key' field of "
            "GET /api/v1/streams/NAME/config)"
        )
    return value


def verified(
    payload: bytes, purpose: str, trusted: str | None, *, first_use: bool = False
) -> dict[str, Any]:
    """The JSON object of `payload`, once its signature for `purpose` verifies under
    `trusted` (a key in base64), or, when `trusted` is None and it is the `first_use` of a
    key, under the key it carries. UnverifiedError says why not."""
    if trusted is None and not first_use:
        raise UnverifiedError("no server key is pinned yet to check it with")
    if not payload:
        raise UnverifiedError("empty: not signed")
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise UnverifiedError("not JSON") from None
    if not isinstance(document, dict):
        raise UnverifiedError("not a JSON object")
    key, signature = document.get(KEY), document.get(SIGNATURE)
    if key is None or signature is None:
        raise UnverifiedError("not signed")
    if trusted is not None and key != trusted and endorsed(document, trusted) != key:
        raise UnverifiedError("signed with another key than the server's")
    _check(document, purpose, key, signature)
    return document


def _check(document: dict[str, Any], purpose: str, key: object, signature: object) -> None:
    """UnverifiedError unless `signature` is `key`'s over `document` for `purpose`."""
    raw_key, raw_signature = decode_field(key, KEY_BYTES), decode_field(signature, SIGNATURE_BYTES)
    if raw_key is None or raw_signature is None:
        raise UnverifiedError("its key or signature is malformed")
    try:
        message = signed_bytes(document, purpose)
        Ed25519PublicKey.from_public_bytes(raw_key).verify(raw_signature, message)
    except (ValueError, InvalidSignature):
        raise UnverifiedError("its signature does not verify") from None


def endorsed(document: dict[str, Any], trusted: str) -> str:
    """The newest key the document's endorsements (``zeal.signed``) lead to from
    `trusted`: each link signed by the key before it, for the same server. `trusted` itself
    when there is no such chain; links that do not verify end it."""
    chain = document.get(ENDORSEMENTS)
    if not isinstance(chain, list):
        return trusted
    current = trusted
    for link in chain[:MAX_CHAIN]:
        if not isinstance(link, dict) or link.get("by") != current:
            continue
        if link.get("server") != document.get("server"):
            continue
        try:
            _check(link, KEY_PURPOSE, current, link.get(SIGNATURE))
        except UnverifiedError:
            break
        if decode_field(link.get(KEY), KEY_BYTES) is None:
            break
        current = str(link[KEY])
    return current
