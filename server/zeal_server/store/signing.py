"""The installation's signing key, and the documents the server signs with it.

Agents act on three kinds of message from their server: a stream's configuration, the
tombstone that says it was deleted, and a notice about a batch. Anyone who may publish on
those topics could otherwise halt an agent or hand it other parameters, so the server signs
them (Ed25519, the layout in ``zeal.signed``) with a key made once per database (migration
0011, the ``installation`` row): a database restored from a backup keeps it, and with it
its agents' trust. The key is as secret as the database; only its public half leaves it, in
every signed document (``key``), in ``GET /api/v1/server`` and with every device login
provisioned (agents are given it: ``zeal-edge --server-key``).

``rotate`` replaces the key: the old key endorses the new one (``zeal.signed``: a link of
the chain of endorsements that configurations and tombstones carry from then on), so an
agent that trusts any earlier key of the chain follows it to the new one. A rotation is
hygiene, not a recovery: whoever stole the old key can endorse a key of their own, so after
a theft devices must be given the new key anew (docs/edge-agent.md).
"""

from __future__ import annotations

import functools
import json
import secrets
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import select
from sqlalchemy.orm import Session

from zeal.signed import KEY, KEY_PURPOSE, SIGNATURE, encode_field, signed_bytes
from zeal_server.errors import StoreError
from zeal_server.store.models import Installation

__all__ = ["Signer", "endorsements", "rotate", "signer"]


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

    def endorse(self, key: str, server: str, issued_ms: int) -> dict[str, Any]:
        """The link of a chain of endorsements by which this key vouches for `key`."""
        link = {"server": server, "by": self.public, KEY: key, "issued_ms": issued_ms}
        link[SIGNATURE] = encode_field(self._key.sign(signed_bytes(link, KEY_PURPOSE)))
        return link


@functools.lru_cache(maxsize=8)
def _signer_of(seed_hex: str) -> Signer:
    return Signer(bytes.fromhex(seed_hex))


def signer(session: Session) -> Signer:
    """The installation's signer (StoreError before migration 0011 made its key)."""
    seed = session.scalar(select(Installation.signing_key))
    if not seed:
        raise StoreError("the database has no signing key: run `zeal-server migrate`")
    return _signer_of(seed)


def endorsements(session: Session) -> list[dict[str, Any]]:
    """The chain of endorsements from the installation's first key to its current one
    (empty: never rotated)."""
    text = session.scalar(select(Installation.endorsements))
    chain: list[dict[str, Any]] = json.loads(text) if text else []
    return chain


def rotate(session: Session, now_ms: int) -> Signer:
    """Give the installation a new signing key, endorsed by the current one (the module
    docstring); returns its signer. The caller commits."""
    row = session.scalars(select(Installation).with_for_update()).one()
    old = signer(session)
    seed = secrets.token_bytes(32)
    new = Signer(seed)
    chain = [*endorsements(session), old.endorse(new.public, row.id, now_ms)]
    row.signing_key, row.endorsements = seed.hex(), json.dumps(chain)
    session.flush()
    return new
