"""Stream configuration documents: the retained ``zeal/v1/{stream}/config`` message.

The collector publishes one per stream; agents read it (or a local copy given with
``--params``) and refuse to send until they have it. The document states the parameters and
the fingerprint they produce, so an agent whose library would derive different parameters
(another version) refuses instead of sending codes the collector cannot decode.
``max_epsilon_per_day`` is the stream's privacy policy (zeal.policy; absent for streams
made before policies, which have none); it is part of the fingerprint, as is
``grid_points`` (present only on a longitudinal stream: zeal.longitudinal)::

    {"format": "zeal-stream/1", "stream": "temps", "lower": 0.0, "upper": 110.0,
     "epsilon": 1.0, "exponent": 56, "payload_bits": 5, "sampler": "grid",
     "max_epsilon_per_day": 8.0, "fingerprint": "…16 hex digits…", "unit": "degF",
     "server": "…installation id…", "created_ms": 1767225600000,
     "revision": 1767225600000}

``server`` and ``created_ms`` say which server (its database's installation id) created
the stream and when (its *origin*, or incarnation): an agent acts only on notices from that
server, and it pins the origin of the first configuration it adopts: another origin (the
stream deleted and created anew) halts it. ``revision`` grows with every change of the
stream's configuration (its policy, a release): the server takes the change's time in ms,
or the previous revision + 1 if that is not later, so a database restored from a backup
still issues newer revisions than before. An agent adopts a configuration of its stream only
if its revision is not older than the one it follows, so a superseded configuration,
replayed, changes nothing (a document without ``revision``, from an older server, is
revision 0). ``released_ms``, when present, says the operator released the agents halted on
the stream (``zeal-server streams release``): they may adopt this configuration. None of
these nor ``unit`` is part of the fingerprint.

A server signs the document (``key`` and ``signature``: ``zeal.signed``), and an agent
acts only on one that verifies under the key it was given (or, by explicit choice, pinned
on first use). A server that rotated its key adds ``endorsements``: the chain from its
first key to the one that signed, each link signed by the key before it (zeal.signed).
When a stream is deleted, the server retains its *tombstone* on the same topic, signed
too::

    {"format": "zeal-stream/1", "stream": "temps", "deleted": true, "server": "…",
     "created_ms": 1767225600000, "deleted_ms": 1767312000000, "key": "…", "signature": "…"}
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any, Final

from zeal._core.mechanism import Zeal
from zeal.errors import ParameterError, ZealWarning
from zeal.protocol import check_name

__all__ = [
    "FORMAT",
    "StreamConfig",
    "config_document",
    "is_tombstone",
    "params_from_config",
    "read_config",
    "tombstone_document",
]

FORMAT: Final = "zeal-stream/1"


def config_document(
    stream: str,
    params: Zeal,
    *,
    server: str | None = None,
    created_ms: int | None = None,
    unit: str = "",
    released_ms: int | None = None,
    revision: int | None = None,
) -> dict[str, Any]:
    """The configuration document of a stream (origin, revision and release fields only
    when given)."""
    document: dict[str, Any] = {
        "format": FORMAT,
        "stream": check_name("stream", stream),
        "lower": params.lower,
        "upper": params.upper,
        "epsilon": params.epsilon,
        "exponent": params.exponent,
        "payload_bits": params.payload_bits,
        "sampler": params.sampler,
        **(
            {}
            if params.max_epsilon_per_day is None
            else {"max_epsilon_per_day": params.max_epsilon_per_day}
        ),
        **({} if params.grid_points is None else {"grid_points": params.grid_points}),
        "fingerprint": params.fingerprint.hex(),
        "unit": unit,
    }
    if server is not None:
        document["server"] = server
    if created_ms is not None:
        document["created_ms"] = created_ms
    if released_ms is not None:
        document["released_ms"] = released_ms
    if revision is not None:
        document["revision"] = revision
    return document


def tombstone_document(
    stream: str, *, server: str, created_ms: int, deleted_ms: int
) -> dict[str, Any]:
    """What a server retains on a deleted stream's configuration topic (module docstring):
    the stream of that origin is gone."""
    return {
        "format": FORMAT,
        "stream": check_name("stream", stream),
        "deleted": True,
        "server": server,
        "created_ms": created_ms,
        "deleted_ms": deleted_ms,
    }


def is_tombstone(document: dict[str, Any]) -> bool:
    """Whether a configuration topic's document is a deleted stream's tombstone."""
    return document.get("deleted") is True


@dataclass(frozen=True)
class StreamConfig:
    """A checked configuration document: the parameters and where they come from."""

    stream: str
    params: Zeal
    server: str | None = None
    created_ms: int | None = None
    unit: str = ""
    #: When the operator released the agents halted on the stream, if ever.
    released_ms: int | None = None
    #: The public key that signed the document (zeal.signed), if it was signed.
    key: str | None = None
    #: Which change of the stream's configuration this is (0: a document without one).
    revision: int = 0

    @property
    def origin(self) -> str:
        """Which server created the stream, and when: what an agent pins (a new value is
        another server, or the stream created anew)."""
        return f"{self.server}/{self.created_ms}"

    @property
    def identity(self) -> str:
        """What changes when the stream is created anew: server, creation time, fingerprint."""
        return f"{self.server}/{self.created_ms}/{self.params.fingerprint.hex()}"


def read_config(
    document: str | bytes | dict[str, Any], *, stream: str | None = None
) -> StreamConfig:
    """Check a configuration document (see params_from_config) and keep its origin."""
    data = _as_dict(document)
    params = params_from_config(data, stream=stream)
    server, unit, key = data.get("server"), data.get("unit", ""), data.get("key")
    created, released = _optional_int(data, "created_ms"), _optional_int(data, "released_ms")
    revision = _optional_int(data, "revision") or 0
    if server is not None and not isinstance(server, str):
        raise ParameterError(f"configuration field server must be text, got {server!r}")
    if not isinstance(unit, str):
        raise ParameterError(f"configuration field unit must be text, got {unit!r}")
    if key is not None and not isinstance(key, str):
        raise ParameterError(f"configuration field key must be text, got {key!r}")
    name = data["stream"]
    return StreamConfig(name, params, server, created, unit, released, key, revision)


def _optional_int(data: dict[str, Any], field: str) -> int | None:
    value = data.get(field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ParameterError(f"configuration field {field} must be an integer, got {value!r}")
    return value


def _as_dict(document: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(document, str | bytes):
        try:
            data = json.loads(document)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParameterError(f"stream configuration is not valid JSON: {exc}") from exc
    else:
        data = document
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ParameterError(f"stream configuration must be a JSON object with format {FORMAT!r}")
    return data


def params_from_config(
    document: str | bytes | dict[str, Any], *, stream: str | None = None
) -> Zeal:
    """Build the stream's parameters from a configuration document, checking everything."""
    data = _as_dict(document)
    missing = {"stream", "lower", "upper", "epsilon", "exponent", "fingerprint"} - set(data)
    if missing:
        raise ParameterError(f"stream configuration lacks {sorted(missing)}")
    name = check_name("stream", data["stream"])
    if stream is not None and name != stream:
        raise ParameterError(f"configuration is for stream {name!r}, not {stream!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZealWarning)
        params = Zeal(
            lower=data["lower"],
            upper=data["upper"],
            epsilon=data["epsilon"],
            exponent=data["exponent"],
            sampler=data.get("sampler", "grid"),
            max_epsilon_per_day=data.get("max_epsilon_per_day"),
            grid_points=data.get("grid_points"),
        )
    if params.fingerprint.hex() != data["fingerprint"] or (
        "payload_bits" in data and data["payload_bits"] != params.payload_bits
    ):
        raise ParameterError(
            f"stream {name!r}: the configuration's fingerprint {data['fingerprint']!r} does not "
            f"match its parameters here ({params.fingerprint.hex()}); the publisher runs a "
            "different library version or the document was altered"
        )
    return params
