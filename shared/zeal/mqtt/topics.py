"""The MQTT topic layout and the small JSON documents that travel beside the data.

Every topic Zeal uses, in one place (standard library only)::

    zeal/v1/{stream}/{device}/up        device -> collector   wire-format batches (QoS 1)
    zeal/v1/{stream}/config             collector -> devices  configuration (retained)
    zeal/v1/{stream}/{device}/notice    collector -> device   why a batch was refused
    zeal/v1/{stream}/{device}/presence  device -> devices     which agent runs the device id
                                                              (retained; Last Will: offline)

A *notice* tells one device what the server did with one of its messages when that needs
the device's attention: a reject (``reason`` is a reject reason such as
``unknown_stream``), a sequence reset (the batch was stored, but the server had seen
that sequence number with other content: the device's outbox is new) or a sequence jump
(stored, far beyond the device's numbering). It is bound to what it is about, so that
it cannot be replayed elsewhere: the *server* (the database's installation id, the same
for every collector of one database), the stream and the device of the topic the message
came on, the message itself (its ``digest``: BLAKE2b-64 of its payload, 16 hex digits,
``message_digest``; and its batch ``sequence`` when it decoded), and when it was
``issued_ms`` (strictly increasing per collector). An agent acts only on a notice for its
own stream and device, about a message it sent, newer than the last it acted on
(zeal_edge.notices)::

    {"format": "zeal-notice/2", "server": "…", "stream": "temps", "device": "kitchen-1",
     "reason": "unknown_stream", "sequence": 12, "digest": "9f2c…", "last_sequence": null,
     "issued_ms": …, "message": "…"}

A *caps* document tells one device its caps across streams as its server holds them (the
day's, which also sets the device hour rule, and those over 30 and 365 days; null: none),
on the device's notice topic of each stream it sends to. It is bound to the server and the
device, and to the server's ``revision`` of its caps (the database's counter of cap
changes) and ``issued_ms``: an agent adopts one only for its own device, from the server
that configured its stream, newer than the last it adopted (zeal_edge.devicecaps)::

    {"format": "zeal-caps/1", "server": "…", "device": "kitchen-1", "revision": 7,
     "issued_ms": …, "max_epsilon_per_day": 4.0, "max_epsilon_per_30_days": null,
     "max_epsilon_per_365_days": null}

A *presence* document says which agent instance runs a device id; an agent that finds
another instance online refuses to start::

    {"format": "zeal-presence/1", "instance": "…", "online": true, "since_ms": …}
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Final

from zeal.errors import TopicError

__all__ = [
    "CAPS_FIELDS",
    "CAPS_FORMAT",
    "CONFIG_FILTER",
    "DATA_FILTER",
    "FLUSH_FILTER",
    "MAX_TOPIC_LENGTH",
    "NOTICE_FORMAT",
    "PREFIX",
    "PRESENCE_FORMAT",
    "DeviceCapsNotice",
    "Notice",
    "Presence",
    "TopicError",
    "config_topic",
    "data_topic",
    "device_filters",
    "message_digest",
    "notice_topic",
    "parse_config_topic",
    "parse_data_topic",
    "presence_topic",
]

PREFIX: Final = "zeal/v1"
#: Every device's data (a collector's subscription).
DATA_FILTER: Final = f"{PREFIX}/+/+/up"
#: Every stream's configuration.
CONFIG_FILTER: Final = f"{PREFIX}/+/config"
#: A filter no client subscribes to: the broker's answer to unsubscribing from it comes
#: after it has read everything the client sent before (the collector's last PUBACKs).
FLUSH_FILTER: Final = f"{PREFIX}/flush"
NOTICE_FORMAT: Final = "zeal-notice/2"
CAPS_FORMAT: Final = "zeal-caps/1"
#: The caps a caps document carries, by horizon in UTC days (zeal.policy.ROLLING).
CAPS_FIELDS: Final = {
    1: "max_epsilon_per_day",
    30: "max_epsilon_per_30_days",
    365: "max_epsilon_per_365_days",
}
PRESENCE_FORMAT: Final = "zeal-presence/1"


def data_topic(stream: str, device: str) -> str:
    """Where a device publishes its batches."""
    return f"{PREFIX}/{stream}/{device}/up"


def config_topic(stream: str) -> str:
    """Where a stream's configuration is retained."""
    return f"{PREFIX}/{stream}/config"


def notice_topic(stream: str, device: str) -> str:
    """Where the collector tells one device about its batches."""
    return f"{PREFIX}/{stream}/{device}/notice"


def presence_topic(stream: str, device: str) -> str:
    """Where the agent running a device id announces itself (retained)."""
    return f"{PREFIX}/{stream}/{device}/presence"


#: The longest valid data topic (stream and device names of 64 characters).
MAX_TOPIC_LENGTH: Final = len(f"{PREFIX}/{'s' * 64}/{'d' * 64}/up")


def device_filters(device: str) -> dict[str, str]:
    """Topic filters of one device's own topics on every stream (for access rules):
    ``data``, ``presence`` and ``notice``."""
    return {
        "data": f"{PREFIX}/+/{device}/up",
        "presence": f"{PREFIX}/+/{device}/presence",
        "notice": f"{PREFIX}/+/{device}/notice",
    }


def parse_data_topic(topic: str) -> tuple[str, str] | None:
    """(stream, device) of a data topic, or None if the topic is not shaped like one.

    The names are not validated here (``zeal.mqtt.streamconfig.check_name`` does that).
    """
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != PREFIX or parts[4] != "up":
        return None
    return parts[2], parts[3]


def parse_config_topic(topic: str) -> str | None:
    """The stream of a configuration topic, or None."""
    parts = topic.split("/")
    if len(parts) != 4 or "/".join(parts[:2]) != PREFIX or parts[3] != "config":
        return None
    return parts[2]


def _load(payload: bytes | str, fmt: str) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TopicError(f"not a JSON document: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise TopicError(f"expected a JSON object with format {fmt!r}")
    return data


def _int_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopicError(f"expected an integer or null, got {value!r}")
    return value


def message_digest(payload: bytes) -> str:
    """What a notice names a message by: BLAKE2b-64 of its payload, 16 hex digits (the
    collector's dedup digest, ``zeal_server.store.sequences.payload_digests``, in hex)."""
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def _digest(value: object) -> str:
    if not isinstance(value, str) or len(value) != 16 or value.strip("0123456789abcdef"):
        raise TopicError(f"a notice's digest is 16 lower-case hex digits, got {value!r}")
    return value


@dataclass(frozen=True)
class Notice:
    """What the collector tells a device about one of its messages (the module docstring)."""

    server: str
    stream: str
    device: str
    reason: str
    message: str
    issued_ms: int
    #: The message's digest (``message_digest``).
    digest: str
    #: Its batch's sequence number (None: the message did not decode).
    sequence: int | None = None
    last_sequence: int | None = None

    def to_document(self) -> dict[str, Any]:
        """The notice as the JSON object it is sent as (a server signs it: zeal.signed)."""
        return {
            "format": NOTICE_FORMAT,
            "server": self.server,
            "stream": self.stream,
            "device": self.device,
            "reason": self.reason,
            "sequence": self.sequence,
            "digest": self.digest,
            "last_sequence": self.last_sequence,
            "issued_ms": self.issued_ms,
            "message": self.message,
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_document()).encode()

    @classmethod
    def from_json(cls, payload: bytes | str) -> Notice:
        return cls.from_document(_load(payload, NOTICE_FORMAT))

    @classmethod
    def from_document(cls, data: dict[str, Any]) -> Notice:
        """A notice from its parsed JSON object (TopicError when it is not one)."""
        if data.get("format") != NOTICE_FORMAT:
            raise TopicError(f"not a {NOTICE_FORMAT} document")
        try:
            fields = {k: data[k] for k in ("server", "stream", "device", "reason", "message")}
            issued, digest = data["issued_ms"], data["digest"]
        except KeyError as exc:
            raise TopicError(f"notice lacks {exc}") from exc
        if not all(isinstance(v, str) for v in fields.values()):
            raise TopicError("notice fields server, stream, device, reason, message are text")
        issued_ms = _int_or_none(issued)
        if issued_ms is None:
            raise TopicError("a notice's issued_ms is an integer")
        return cls(
            **fields,
            issued_ms=issued_ms,
            digest=_digest(digest),
            sequence=_int_or_none(data.get("sequence")),
            last_sequence=_int_or_none(data.get("last_sequence")),
        )


@dataclass(frozen=True)
class DeviceCapsNotice:
    """A device's caps across streams, as its server tells it (the module docstring)."""

    server: str
    device: str
    revision: int
    issued_ms: int
    #: Epsilon by horizon (CAPS_FIELDS; None: no such cap at the server).
    caps: dict[int, float | None]

    def to_document(self) -> dict[str, Any]:
        """The document as sent (a server signs it for zeal.signed.CAPS_PURPOSE)."""
        return {
            "format": CAPS_FORMAT,
            "server": self.server,
            "device": self.device,
            "revision": self.revision,
            "issued_ms": self.issued_ms,
            **{field: self.caps.get(days) for days, field in CAPS_FIELDS.items()},
        }

    @classmethod
    def from_document(cls, data: dict[str, Any]) -> DeviceCapsNotice:
        """The document from its parsed JSON object (TopicError when it is not one)."""
        if data.get("format") != CAPS_FORMAT:
            raise TopicError(f"not a {CAPS_FORMAT} document")
        server, device = data.get("server"), data.get("device")
        if not (isinstance(server, str) and isinstance(device, str)):
            raise TopicError("a caps document's server and device are text")
        revision, issued = _int_or_none(data.get("revision")), _int_or_none(data.get("issued_ms"))
        if revision is None or issued is None or revision < 0:
            raise TopicError("a caps document's revision and issued_ms are integers")
        caps: dict[int, float | None] = {}
        for days, field in CAPS_FIELDS.items():
            value = data.get(field)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise TopicError(f"a caps document's {field} is a positive number or null")
            caps[days] = None if value is None else float(value)
        return cls(server, device, revision, issued, caps)


@dataclass(frozen=True)
class Presence:
    """Which agent instance runs a device id, and whether it is online."""

    instance: str
    online: bool
    since_ms: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": PRESENCE_FORMAT,
                "instance": self.instance,
                "online": self.online,
                "since_ms": self.since_ms,
            }
        ).encode()

    @classmethod
    def from_json(cls, payload: bytes | str) -> Presence:
        data = _load(payload, PRESENCE_FORMAT)
        instance, online = data.get("instance"), data.get("online")
        if not isinstance(instance, str) or not isinstance(online, bool):
            raise TopicError("presence needs a text instance and a boolean online")
        return cls(instance, online, _int_or_none(data.get("since_ms")) or 0)
