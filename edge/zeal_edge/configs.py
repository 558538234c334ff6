"""Which stream configuration from the broker an agent may adopt.

A configuration is adopted only if it passes the agent's own checks (``screened``: its
fingerprint pin and its ceilings on epsilon per reading and per day) and comes from the
*origin* the agent first adopted: the server (installation id) that created the stream, and
when. The first origin is pinned in the outbox. Another one halts the agent like a
withdrawal does: whoever may retain a configuration (a leaked collector login, a second
server on the broker) could otherwise hand it other parameters, and a stream deleted and
created anew with a larger epsilon would be followed without its operator knowing.
``zeal-edge resume`` clears the halt and the pin.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zeal import ParameterError
from zeal.streamconfig import StreamConfig
from zeal_edge.mqtt import Message
from zeal_edge.options import AgentOptions, screened, unpinned
from zeal_edge.outbox import Outbox

__all__ = ["ConfigDesk", "Verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What to do with a configuration message: adopt ``config``, or ``halt`` with
    (reason, message); neither: ignore it (logged)."""

    config: StreamConfig | None = None
    halt: tuple[str, str] | None = None
    #: Why a configuration was refused before any was adopted: the agent has nothing to
    #: send with and exits (non-zero) saying so.
    refused: str | None = None


class ConfigDesk:
    """Screens the configurations the broker delivers and keeps the origin pin."""

    def __init__(self, outbox: Outbox, namespace: str, options: AgentOptions) -> None:
        self.outbox, self.namespace, self.options = outbox, namespace, options
        #: Why the latest refused configuration was refused (for the waiting message).
        self.refused: str | None = None

    def offer(self, message: Message, adopted: StreamConfig | None) -> Verdict:
        """The verdict on a message of the stream's configuration topic."""
        stream = self.options.stream
        if not message.payload:
            if adopted is None:
                return Verdict()
            return Verdict(
                halt=(
                    "stream_deleted",
                    f"the server withdrew the configuration of stream {stream} from the "
                    "broker: the stream was deleted",
                )
            )
        try:
            config = screened(message, self.options)
        except ParameterError as exc:
            log.error("ignoring stream configuration on %s: %s", message.topic, exc)
            return Verdict()
        if isinstance(config, str):  # refused: never used, nothing privatized with it
            self.refused = config
            if adopted is not None:
                log.error("%s. Still using the adopted one.", config)
            return Verdict(refused=None if adopted else config)
        origin = self.outbox.origin(self.namespace)
        if origin is None:
            self.outbox.set_origin(self.namespace, config.origin)
        elif origin != config.origin:
            return Verdict(halt=unpinned(stream, origin, config))
        return Verdict(config=config)
