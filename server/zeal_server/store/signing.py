"""The installation's signing key, and the documents the server signs with it.

Agents act on three kinds of message from their server: a stream's configuration, the
tombstone that says it was deleted, and a notice about a batch. Anyone who may publish on
those topics could otherwise halt an agent or hand it other parameters, so the server signs
them (Ed25519, the layout in ``zeal.signed``) with a key made once per database (migration
0011, the ``installation`` row): a database restored from a backup keeps it, and with it
its agents' trust. The key is as secret as the database; only its public half leaves it, in
every signed document (``key``) and so in ``GET /api/v1/streams/{name}/config``.
"""

from __future__ import annotations

import functools
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal.signed import KEY, SIGNATURE, encode_field, signed_bytes
from zeal_server.errors import StoreError
from zeal_server.store.models import Installation

__all__ = ["Signer", "signer"]


class Signer:
    """Signs documents with the installation's Ed25519 key."""

    def __init__(self, seed: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        #: The public key as documents carry it (standard base64).
        self.public = encode_field(raw)

    def sign(self, document: dict[str, Any], purpose: str) -> dict[str, Any]:
        """`document` with this server's key and its signature for `purpose`."""
        signed = {**document, KEY: self.public}
        signed.pop(SIGNATURE, None)
        signed[SIGNATURE] = encode_field(self._key.sign(signed_bytes(signed, purpose)))
        return signed


@functools.lru_cache(maxsize=8)
def _signer_of(seed_hex: str) -> Signer:
    return Signer(bytes.fromhex(seed_hex))


def signer(session: Session) -> Signer:
    """The installation's signer (StoreError before migration 0011 made its key)."""
    seed = session.scalar(select(Installation.signing_key))
    if not seed:
        raise StoreError("the database has no signing key: run `zeal-server migrate`")
    return _signer_of(seed)
