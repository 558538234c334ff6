"""What comes off a wire can never stop the writer: decoding it either gives a batch or a
counted reject.

The decoders refuse what they do not read with their own errors (``zeal.WireError``, the
ChirpStack reader's ``ChirpStackError``), each a reject reason. Any *other* exception
raised while reading a message is a bug of ours that this message set off, and the message
would set it off again at every redelivery: the writer would stop on it for good (a
protobuf ``UplinkEvent`` whose time is in the year 146,138,514,283 once did exactly that).
So the decoding steps run through :func:`decode_contained` and :func:`contained`: such an
exception makes that one message a reject, ``undecodable``, counted and acknowledged like
any other, and is logged with its traceback (once a minute per place) so that the bug is
seen and fixed. Only decoding is contained: an unexpected error while storing is not
caused by one message's bytes alone, and still stops the writer (``/livez`` and
``/readyz`` then answer 503).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from zeal.wire import WireError, WireParams
from zeal.wirebatches import Batches, decode_many
from zeal_server.errors import UndecodableError

__all__ = ["UNDECODABLE", "contained", "decode_contained"]

log = logging.getLogger(__name__)

#: The reject reason of a message whose decoding raised an unexpected error.
UNDECODABLE = "undecodable"
#: Seconds between two tracebacks logged for one place.
LOG_EVERY = 60.0
_logged: dict[str, float] = {}

T = TypeVar("T")


def _log_bug(where: str) -> None:
    """Log the exception being handled, with its traceback, once a minute per place."""
    now = time.monotonic()
    if now - _logged.get(where, -1e18) >= LOG_EVERY:
        _logged[where] = now
        log.exception(
            "decoding %s raised an unexpected error (a bug: please report it with this "
            "traceback); the message is refused as %r and ingest goes on (logged once a "
            "minute)",
            where,
            UNDECODABLE,
        )


def contained(where: str, call: Callable[[], T], *expected: type[Exception]) -> T:
    """``call()``; an exception other than `expected` (the decoder's own refusals) is
    logged and raised as ``UndecodableError``."""
    try:
        return call()
    except expected:
        raise
    except Exception as exc:
        _log_bug(where)
        raise UndecodableError(f"{type(exc).__name__}: {exc}"[:300]) from exc


def decode_contained(
    payloads: Sequence[bytes], params: WireParams, *, stream: str, devices: Sequence[str]
) -> tuple[Batches, dict[int, WireError | UndecodableError]]:
    """``zeal.wirebatches.decode_many``, except that a payload whose decoding raises an
    unexpected error is refused alone (``UndecodableError``) and the others decode as usual."""
    try:
        found, refused = decode_many(payloads, params, stream=stream, devices=devices)
        return found, dict(refused)
    except Exception:  # noqa: BLE001 (the module docstring: found out payload by payload)
        _log_bug(f"payloads of stream {stream}")
    errors: dict[int, WireError | UndecodableError] = {}
    for k, (payload, device) in enumerate(zip(payloads, devices, strict=True)):
        try:
            decode_many([payload], params, stream=stream, devices=[device])
        except Exception as exc:  # noqa: BLE001 (this payload alone sets it off)
            errors[k] = UndecodableError(f"{type(exc).__name__}: {exc}"[:300])
    good = [k for k in range(len(payloads)) if k not in errors]
    found, refused = decode_many(
        [payloads[k] for k in good], params, stream=stream, devices=[devices[k] for k in good]
    )
    where = np.asarray(good, dtype=np.int64)
    errors.update({good[k]: error for k, error in refused.items()})
    return dataclasses.replace(found, index=where[found.index]), errors
