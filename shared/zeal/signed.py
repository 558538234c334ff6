"""What a server signs, and how the bytes are laid out (no cryptography here: the server signs
with it, the agent verifies with it).

A server signs the documents an agent acts on: its stream configurations, the tombstone that
says a stream was deleted, and its notices. Whoever else may publish on those topics (a
leaked collector login, another server on the broker) can then neither halt an agent nor
hand it other parameters: an agent ignores, and counts, what does not verify under the key
it pinned (docs/edge-agent.md, "Which configuration an agent trusts").

The signature is Ed25519 (RFC 8032) over ``PURPOSE "\\n" canonical-json``, where the JSON is
the document without its ``signature`` field, keys sorted, no white space, ASCII only, no NaN.
The purpose (``zeal-stream/1`` for configurations and tombstones, ``zeal-notice/2`` for
notices, ``zeal-caps/1`` for a device's caps, ``zeal-key/1`` for a key's endorsement of
its successor) keeps a signature of one kind from passing for another (and a
``zeal-notice/1`` notice of an older server, bound to nothing, from passing for a notice
now). The document carries the signer's public key (``key``, 32 bytes) and the signature
(``signature``, 64 bytes), both in standard base64::

    {"format": "zeal-stream/1", "stream": "temps", ..., "key": "…44 characters…",
     "signature": "…88 characters…"}

A document parsed from JSON and laid out again gives the same bytes (Python's ``json`` writes
floats by their shortest repr), so the agent checks the document it parsed.

A server that rotated its key (``zeal-server key rotate``) signs with the new key and adds
the chain that leads to it from its first key, ``endorsements``, oldest first: each link
names the key it endorses and the key it is signed by (``by``), the server, and when it was
issued, signed by ``by`` for ``zeal-key/1``::

    "endorsements": [{"server": "…", "by": "…old key…", "key": "…new key…",
                      "issued_ms": 1767225600000, "signature": "…"}]

An agent that trusts a key of the chain follows it to the newest key (zeal_edge.trust).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "CAPS_PURPOSE",
    "CONFIG_PURPOSE",
    "ENDORSEMENTS",
    "KEY",
    "KEY_BYTES",
    "KEY_PURPOSE",
    "NOTICE_PURPOSE",
    "SIGNATURE",
    "SIGNATURE_BYTES",
    "decode_field",
    "encode_field",
    "signed_bytes",
]

#: The fields a signed document adds: the signer's public key and the signature.
KEY: Final = "key"
SIGNATURE: Final = "signature"
KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
#: What each kind of document is signed for.
CONFIG_PURPOSE: Final = "zeal-stream/1"
NOTICE_PURPOSE: Final = "zeal-notice/2"
CAPS_PURPOSE: Final = "zeal-caps/1"
KEY_PURPOSE: Final = "zeal-key/1"
#: The field of a configuration that carries a rotated key's chain of endorsements.
ENDORSEMENTS: Final = "endorsements"


def signed_bytes(document: Mapping[str, Any], purpose: str) -> bytes:
    """The bytes a signature of `document` covers (the module docstring). ValueError for a
    document that has no such form (NaN or infinite numbers, values JSON cannot hold)."""
    body = {key: value for key, value in document.items() if key != SIGNATURE}
    try:
        text = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        )
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"the document has no canonical form: {exc}") from exc
    return f"{purpose}\n{text}".encode("ascii")


def encode_field(raw: bytes) -> str:
    """A key or signature as it stands in a document (standard base64)."""
    return base64.b64encode(raw).decode("ascii")


def decode_field(value: object, size: int) -> bytes | None:
    """The bytes of a key or signature field of `size` bytes, or None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    return raw if len(raw) == size else None
