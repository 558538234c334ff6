"""Which stream configuration from the broker an agent may adopt, and which halts it.

A message on the stream's configuration topic counts only if its server signed it
(``zeal_edge.trust``): with the key given (``--server-key``) or pinned in the outbox, the
message must verify under that key; until one is pinned, a configuration must verify under
the key it carries, and adopting it pins that key. Anything else (an empty message, a
forgery, another server's configuration) is ignored and counted, and never halts the agent.

A verified configuration is adopted only if it passes the agent's own checks (``screened``:
its fingerprint pin and its ceilings on epsilon per reading and per day) and comes from the
*origin* the agent first adopted: the server (installation id) that created the stream, and
when. What halts it, all verified under the pinned key:

- ``stream_deleted``: the stream's tombstone (the server deleted the stream it follows);
- ``stream_recreated``: a configuration of another origin (the stream deleted and created
  anew: other parameters, another dataset), unless the operator released the stream;
- ``over_ceiling``: a configuration of its stream above its ceilings (following it would
  spend more than the agent allows; keeping the old one, every batch would be refused).

A halted agent (``--on-halt wait``) resumes on a verified configuration it may follow: one
of the stream it was pinned to (its policy lowered again, a restored database), or one the
operator released (``zeal-server streams release``: ``released_ms`` in the document), which
it then pins. ``zeal-edge resume`` clears a halt and the origin pin by hand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from zeal import ParameterError
from zeal.mqtt.streamconfig import StreamConfig, is_tombstone, read_config
from zeal.signed import CONFIG_PURPOSE
from zeal_edge.errors import UnverifiedError
from zeal_edge.mqtt import Message
from zeal_edge.options import AgentOptions, Throttle, screened, unpinned
from zeal_edge.outbox import Outbox
from zeal_edge.records import Halt
from zeal_edge.trust import verified

__all__ = ["ConfigDesk", "Verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What to do with a configuration message: adopt ``config`` (``resumed``: the halt it
    ends was cleared), or ``halt`` with (reason, message); neither: ignore it (logged)."""

    config: StreamConfig | None = None
    halt: tuple[str, str] | None = None
    #: Why a configuration was refused before any was adopted: the agent has nothing to
    #: send with and exits (non-zero) saying so, unless it waits.
    refused: str | None = None
    resumed: bool = False


class ConfigDesk:
    """Verifies and screens the configurations the broker delivers; keeps the pins."""

    def __init__(
        self, outbox: Outbox, namespace: str, options: AgentOptions, throttle: Throttle
    ) -> None:
        self.outbox, self.namespace, self.options = outbox, namespace, options
        self.throttle = throttle
        #: Why the latest refused configuration was refused (for the waiting message).
        self.refused: str | None = None
        #: A verified tombstone of the stream's name seen before any configuration was
        #: adopted (the stream of that name was deleted).
        self.deleted: dict[str, Any] | None = None

    def trusted_key(self) -> str | None:
        """The key the server's messages must verify under: --server-key, else the pinned
        one, else None (nothing pinned yet)."""
        return self.options.server_key or self.outbox.server_key(self.namespace)

    def verify(
        self, message: Message, purpose: str, *, first_use: bool = False
    ) -> dict[str, Any] | None:
        """The message's document if it verifies under the trusted key (with none pinned
        yet and `first_use`, under its own); else None, counted and logged once a minute."""
        key = self.trusted_key()
        try:
            return verified(message.payload, purpose, key, first_use=first_use)
        except UnverifiedError as exc:
            self.outbox.record_unverified(self.namespace)
            if self.throttle.ready(f"unverified-{purpose}"):
                log.warning(
                    "ignoring a message on %s: %s (%s; counted in zeal-edge status, logged "
                    "once a minute)",
                    message.topic,
                    exc,
                    f"the server's key is {key}" if key else "no server key pinned yet",
                )
            return None

    def offer(self, message: Message, adopted: StreamConfig | None, halt: Halt | None) -> Verdict:
        """The verdict on a message of the stream's configuration topic (module docstring);
        `halt`: the halt the agent is in, if any."""
        document = self.verify(message, CONFIG_PURPOSE, first_use=True)
        if document is None:
            return Verdict()
        pinned_key = self.trusted_key() is not None
        origin = self.outbox.origin(self.namespace)
        if is_tombstone(document):
            return self._tombstone(document, origin, halt) if pinned_key else Verdict()
        try:
            config = read_config(document, stream=self.options.stream)
        except ParameterError as exc:
            log.error("ignoring stream configuration on %s: %s", message.topic, exc)
            return Verdict()
        return self._configuration(config, origin, adopted, halt, pinned_key=pinned_key)

    def _configuration(
        self,
        config: StreamConfig,
        origin: str | None,
        adopted: StreamConfig | None,
        halt: Halt | None,
        *,
        pinned_key: bool,
    ) -> Verdict:
        """A verified configuration: adopted, ignored, or a halt (module docstring)."""
        checked = screened(config, self.options)
        if isinstance(checked, str):  # refused: never used, nothing privatized with it
            self.refused = checked
            return self._refused(checked, adopted, halt, pinned_key=pinned_key)
        if not pinned_key and origin not in (None, config.origin):
            return Verdict()  # not the pinned origin: nothing trusted to halt on
        follows = origin in (None, config.origin) or config.released_ms is not None
        if not follows:
            assert origin is not None
            if halt is not None:
                return Verdict()
            return Verdict(halt=unpinned(self.options.stream, origin, config))
        self._pin(checked)
        if halt is not None:
            log.warning(
                "stream %s: its server signed a configuration this agent may follow (%s); "
                "the halt (%s) is cleared",
                self.options.stream,
                "released by the operator" if config.origin != origin else "its own stream",
                halt.reason,
            )
            self.outbox.set_halt(self.namespace, None)
        return Verdict(config=checked, resumed=halt is not None)

    def _refused(
        self, why: str, adopted: StreamConfig | None, halt: Halt | None, *, pinned_key: bool
    ) -> Verdict:
        """A verified configuration above the agent's ceilings."""
        if halt is not None:
            log.error("%s. Still halted.", why)
            return Verdict()
        if adopted is None:
            return Verdict(refused=why)
        if not pinned_key:
            log.error("%s. Still using the adopted one.", why)
            return Verdict()
        return Verdict(
            halt=(
                "over_ceiling",
                f"its server now asks for more than this agent allows ({why}); following "
                "it would spend more, and batches made with the old configuration are refused",
            )
        )

    def _tombstone(
        self, document: dict[str, Any], origin: str | None, halt: Halt | None
    ) -> Verdict:
        """A verified tombstone: a halt if it buries the stream this agent follows."""
        buried = f"{document.get('server')}/{document.get('created_ms')}"
        if origin != buried:
            if origin is None:
                self.deleted = document
            return Verdict()
        if halt is not None:
            return Verdict()
        return Verdict(
            halt=(
                "stream_deleted",
                f"the server deleted stream {self.options.stream} (its signed tombstone is "
                "on the broker)",
            )
        )

    def _pin(self, config: StreamConfig) -> None:
        """Pin the configuration's origin and the key that signed it."""
        if self.outbox.origin(self.namespace) != config.origin:
            self.outbox.set_origin(self.namespace, config.origin)
        if config.key is not None and self.outbox.server_key(self.namespace) != config.key:
            self.outbox.set_server_key(self.namespace, config.key)
