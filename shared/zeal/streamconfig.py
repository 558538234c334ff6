"""Stream configuration documents: the retained ``zeal/v1/{stream}/config`` message.

The collector publishes one per stream; agents read it (or a local copy given with
``--params``) and refuse to send until they have it. The document states the parameters and
the fingerprint they produce, so an agent whose library would derive different parameters
(another version) refuses instead of sending codes the collector cannot decode::

    {"format": "zeal-stream/1", "stream": "temps", "lower": 0.0, "upper": 110.0,
     "epsilon": 1.0, "exponent": 56, "payload_bits": 5, "sampler": "grid",
     "fingerprint": "…16 hex digits…"}
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any, Final

from zeal.errors import ParameterError, ZealWarning
from zeal.mechanism import Zeal

__all__ = ["FORMAT", "NAME_PATTERN", "check_name", "config_document", "params_from_config"]

FORMAT: Final = "zeal-stream/1"
#: Stream and device names are single MQTT topic levels: no wildcards, no separators.
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(kind: str, name: object) -> str:
    """Validate a stream or device name (1-64 of A-Z a-z 0-9 _ . -, not starting with . _ -)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ParameterError(
            f"{kind} name {name!r} is invalid: use 1 to 64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def config_document(stream: str, params: Zeal) -> dict[str, Any]:
    """The configuration document of a stream."""
    return {
        "format": FORMAT,
        "stream": check_name("stream", stream),
        "lower": params.lower,
        "upper": params.upper,
        "epsilon": params.epsilon,
        "exponent": params.exponent,
        "payload_bits": params.payload_bits,
        "sampler": params.sampler,
        "fingerprint": params.fingerprint.hex(),
    }


def params_from_config(
    document: str | bytes | dict[str, Any], *, stream: str | None = None
) -> Zeal:
    """Build the stream's parameters from a configuration document, checking everything."""
    if isinstance(document, str | bytes):
        try:
            data = json.loads(document)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParameterError(f"stream configuration is not valid JSON: {exc}") from exc
    else:
        data = document
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ParameterError(f"stream configuration must be a JSON object with format {FORMAT!r}")
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
