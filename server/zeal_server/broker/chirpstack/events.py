"""LoRaWAN uplinks as ChirpStack v4 hands them over, turned into Zeal batches.

ChirpStack's MQTT integration publishes each uplink on
``application/{application_id}/device/{dev_eui}/event/up`` as an ``UplinkEvent``
(``chirpstack_api.integration``), marshaled as JSON (the default: protobuf's JSON mapping,
camelCase, default values left out) or as protobuf. :func:`parse_uplink` reads either;
:func:`to_batch` decodes its FRMPayload in the LoRaWAN profile (``zeal.lorawan``) and
writes the same readings as a wire-v2 batch, so that they go through the collector's one
ingest path: the frame counter is the batch's sequence, the event's time stamps the last
reading. The same event delivered twice gives the same bytes (a duplicate); a rejoin,
which resets the frame counter, is a sequence reset (stored, counted).

The schema comes from the ``chirpstack-api`` package (``pip install zeal-server[chirpstack]``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from zeal.lorawan import decode_lorawan
from zeal.wire import WireParams, encode_batch
from zeal_server.errors import ChirpStackError

__all__ = ["ChirpStackError", "Uplink", "parse_uplink", "to_batch"]

#: LoRaWAN's FPort is one byte.
MAX_F_PORT = 255


@dataclass(frozen=True)
class Uplink:
    """What Zeal takes from an ``UplinkEvent``."""

    application_id: str
    dev_eui: str  # 16 lower-case hex digits
    device_name: str
    #: The device's address in its current session (8 hex digits): a join gives a new one.
    dev_addr: str
    f_port: int
    f_cnt: int
    received_ms: int
    deduplication_id: str
    data: bytes


@functools.cache
def _event_class() -> Any:
    try:
        from chirpstack_api.integration import integration_pb2
    except ImportError as exc:  # pragma: no cover - the extra is installed where it is used
        raise ImportError(
            "ChirpStack events need the chirpstack-api package: pip install "
            "'zeal-server[chirpstack]'"
        ) from exc
    return integration_pb2.UplinkEvent


def parse_uplink(payload: bytes) -> Uplink:
    """An uplink event, JSON (it starts with ``{``) or protobuf. Raises ChirpStackError."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    event = _event_class()()
    try:
        if payload.lstrip()[:1] == b"{":
            json_format.Parse(payload.decode("utf-8"), event, ignore_unknown_fields=True)
        else:
            event.ParseFromString(payload)
    except (json_format.ParseError, DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ChirpStackError("bad_event", f"not an UplinkEvent: {exc}") from None
    if not event.HasField("time"):
        raise ChirpStackError("no_time", "the uplink event has no time")
    if event.f_port == 0 or not event.data:
        raise ChirpStackError("no_data", "the uplink carries no application data (FPort 0)")
    if event.f_port > MAX_F_PORT:  # a uint32 in the schema, one byte on the air
        raise ChirpStackError("bad_event", f"FPort {event.f_port} is not a LoRaWAN port")
    info = event.device_info
    try:
        # A Timestamp outside protobuf's range (year 1 to 9999, nanos past a second) parses
        # but raises ValueError here; nothing read off the wire may escape as a bug.
        received_ms = int(event.time.ToMilliseconds())
    except (ValueError, OverflowError) as exc:
        raise ChirpStackError("bad_event", f"the uplink's time is not a time: {exc}") from None
    return Uplink(
        application_id=info.application_id,
        dev_eui=info.dev_eui.lower(),
        device_name=info.device_name,
        dev_addr=event.dev_addr.lower(),
        f_port=int(event.f_port),
        f_cnt=int(event.f_cnt),
        received_ms=received_ms,
        deduplication_id=event.deduplication_id,
        data=bytes(event.data),
    )


def to_batch(uplink: Uplink, params: WireParams, *, stream: str, device: str) -> bytes:
    """The uplink's readings as the wire-v2 batch a device named `device` would have sent on
    `stream`. Raises ``zeal.WireError`` for a payload the LoRaWAN profile refuses (a stale
    configuration's tag is ``fingerprint_mismatch``)."""
    batch = decode_lorawan(
        uplink.data,
        params,
        stream=stream,
        device=device,
        frame_counter=uplink.f_cnt,
        received_ms=uplink.received_ms,
    )
    return encode_batch(
        params,
        stream=stream,
        device=device,
        sequence=batch.sequence,
        timestamps=batch.timestamps,
        codes=batch.codes,
    )
