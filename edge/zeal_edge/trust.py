"""Which messages from the broker an agent believes: those its server signed.

The agent acts on its stream's configuration (it adopts it, or halts on a tombstone or on a
stream created anew) and on the server's notices (a sequence reset moves its numbers on, an
``unknown_stream`` halts it). Anyone who may publish on those topics (a leaked collector
login, another server on the broker) could otherwise stop a fleet with one empty message. So
each must verify (Ed25519, ``zeal.signed``) under the key the agent trusts: the one given
with ``--server-key``, else the one pinned in its outbox when it first adopted a
configuration. Before any key is pinned, a configuration must verify under the key it
carries (trust on first use: docs/edge-agent.md says when to give the key instead).
Whatever does not verify is ignored, counted (``zeal-edge status``) and logged once a
minute; it never halts the agent.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from zeal.signed import KEY, KEY_BYTES, SIGNATURE, SIGNATURE_BYTES, decode_field, signed_bytes
from zeal_edge.errors import UnverifiedError

__all__ = ["check_key", "verified"]


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
    if trusted is not None and key != trusted:
        raise UnverifiedError("signed with another key than the server's")
    raw_key, raw_signature = decode_field(key, KEY_BYTES), decode_field(signature, SIGNATURE_BYTES)
    if raw_key is None or raw_signature is None:
        raise UnverifiedError("its key or signature is malformed")
    try:
        message = signed_bytes(document, purpose)
        Ed25519PublicKey.from_public_bytes(raw_key).verify(raw_signature, message)
    except (ValueError, InvalidSignature):
        raise UnverifiedError("its signature does not verify") from None
    return document
