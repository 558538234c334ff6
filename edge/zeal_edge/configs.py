"""Which stream configuration from the broker an agent may adopt, and which halts it.

A message on the stream's configuration topic counts only if its server signed it
(``zeal_edge.trust``): under the key given (``--server-key``, handed over with the device's
login), pinned in the outbox, or endorsed by it when the server rotated its key. An agent
with no key given adopts the first signed configuration's key only when started with
``--trust-first-use`` (a warning says what that risks); else it adopts nothing and says
how to give it the key. Anything else (an empty message, a forgery, another server's
configuration) is ignored and counted, and never halts the agent.

A verified configuration belongs to an *incarnation* of the stream, its *origin*: the server
(installation id) that created it, and when. The agent pins the origin it first adopts and,
for it, the highest ``revision`` it has verified: an older revision (a superseded
configuration, replayed) is ignored and counted (``stale_config``), whatever it says, and
never halts the agent. A configuration of another origin is adopted only when the operator
released it (``released_ms``), for a newer incarnation of the same server, newer than the
last release the agent saw; an older incarnation's release is ignored (``old_release``).
Then it must pass the agent's own checks (``screened``: its fingerprint pin and its
ceilings on epsilon per reading and per day). What halts it, all verified:

- ``stream_deleted``: the stream's tombstone (the server deleted the stream it follows);
- ``stream_recreated``: a configuration of another origin (the stream deleted and created
  anew: other parameters, another dataset), unless the operator released the stream;
- ``over_ceiling``: a newer revision of its stream above its ceilings (following it would
  spend more than the agent allows; keeping the old one, every batch would be refused).

A halted agent (``--on-halt wait``) resumes on a verified configuration it may follow: a
newer revision of the stream it was pinned to (its policy lowered again), or one the
operator released (``zeal-server streams release``), which it then pins. ``zeal-edge
resume`` clears a halt and the origin pin by hand.
"""

from __future__ import annotations

import logging
import time
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

__all__ = ["NO_KEY", "ConfigDesk", "Verdict"]

log = logging.getLogger(__name__)
#: Why an agent with no key adopts nothing.
NO_KEY = (
    "no server key was given to check it with: give the agent its server's key "
    "(--server-key or ZEAL_SERVER_KEY; zeal-server devices provision prints it, and "
    "zeal-server key shows it), or start it with --trust-first-use to trust the first "
    "signed configuration it sees"
)


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
        given = options.server_key
        if given is not None and outbox.mark(namespace, "given_key") != given:
            # A key given anew (the device provisioned again) is trusted from now on; the
            # same key given again leaves the one it endorsed since (a rotation) pinned.
            outbox.set_server_key(namespace, given)
            outbox.set_mark(namespace, "given_key", given)

    def trusted_key(self) -> str | None:
        """The key the server's messages must verify under: the one given or pinned (or
        endorsed since by it), else None (nothing given, nothing pinned yet)."""
        return self.outbox.server_key(self.namespace) or self.options.server_key

    def _now(self) -> int:
        return int(time.time() * 1000)

    def verify(
        self, message: Message, purpose: str, *, first_use: bool = False
    ) -> dict[str, Any] | None:
        """The message's document if it verifies under the trusted key (with none pinned
        yet and `first_use`, under its own); else None, counted and logged once a minute."""
        key = self.trusted_key()
        if key is None and first_use and not self.options.trust_first_use:
            self.refused = NO_KEY
            if self.throttle.ready("no-key"):
                log.error("not adopting the configuration on %s: %s", message.topic, NO_KEY)
            return None
        try:
            document = verified(message.payload, purpose, key, first_use=first_use)
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
        if key is None:
            log.warning(
                "trusting the key %s of the first signed configuration on %s "
                "(--trust-first-use): whoever retained it first on the broker is this "
                "agent's server from now on. Give agents their server's key instead "
                "(--server-key; docs/edge-agent.md)",
                document.get("key"),
                message.topic,
            )
        return document

    def _ignore(self, kind: str, why: str) -> Verdict:
        """Count a verified configuration the agent does not act on, and say why (at most
        once a minute per kind)."""
        self.outbox.record_ignored(self.namespace, kind, now_ms=self._now())
        if self.throttle.ready(f"ignored-{kind}"):
            log.warning(
                "stream %s: ignoring a configuration its server signed: %s (counted in "
                "zeal-edge status; logged once a minute)",
                self.options.stream,
                why,
            )
        return Verdict()

    def offer(self, message: Message, adopted: StreamConfig | None, halt: Halt | None) -> Verdict:
        """The verdict on a message of the stream's configuration topic (module docstring);
        `halt`: the halt the agent is in, if any."""
        pinned_key = self.trusted_key() is not None
        document = self.verify(message, CONFIG_PURPOSE, first_use=True)
        if document is None:
            return Verdict()
        origin = self.outbox.origin(self.namespace)
        if is_tombstone(document):
            return self._tombstone(document, origin, halt) if pinned_key else Verdict()
        try:
            config = read_config(document, stream=self.options.stream)
        except ParameterError as exc:
            log.error("ignoring stream configuration on %s: %s", message.topic, exc)
            return Verdict()
        if origin is not None and config.origin == origin:
            seen = self.outbox.mark(self.namespace, "revision")
            if isinstance(seen, int) and config.revision < seen:
                return self._ignore(
                    "stale_config",
                    f"its revision {config.revision} is older than revision {seen} this "
                    "agent has (a superseded configuration, published again)",
                )
            self.outbox.set_mark(self.namespace, "revision", config.revision)
        elif origin is not None and config.released_ms is not None:
            stale = self._stale_release(config, origin)
            if stale is not None:
                return self._ignore("old_release", stale)
        return self._configuration(config, origin, adopted, halt, pinned_key=pinned_key)

    def _stale_release(self, config: StreamConfig, origin: str) -> str | None:
        """Why a release of another origin than the pinned one is not for this agent: an
        older incarnation (or another server's), or not newer than the last release it
        saw; None when it may be followed."""
        server, created = origin.split("/", 1)
        if config.server != server or not created.isdigit():
            return f"it releases server {config.server}'s stream, not server {server}'s"
        if config.created_ms is None or config.created_ms < int(created):
            return (
                f"it releases an older incarnation of the stream (created at "
                f"{config.created_ms}, before {created}, the one this agent follows)"
            )
        seen = self.outbox.mark(self.namespace, "released_ms")
        assert config.released_ms is not None
        if isinstance(seen, int) and config.released_ms <= seen:
            return f"its release ({config.released_ms}) is not newer than the last seen ({seen})"
        return None

    def _configuration(
        self,
        config: StreamConfig,
        origin: str | None,
        adopted: StreamConfig | None,
        halt: Halt | None,
        *,
        pinned_key: bool,
    ) -> Verdict:
        """A verified configuration, not stale: adopted, ignored, or a halt (module
        docstring)."""
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
        self.refused = None
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
        """Pin the configuration's origin, what was seen of it (its revision, its release)
        and the key that signed it (the trusted one, or one it endorsed)."""
        ns = self.namespace
        if self.outbox.origin(ns) != config.origin:
            self.outbox.set_origin(ns, config.origin)
            self.outbox.set_mark(ns, "revision", config.revision)
        if config.released_ms is not None:
            self.outbox.set_mark(ns, "released_ms", config.released_ms)
        if config.key is not None and self.outbox.server_key(ns) != config.key:
            if self.outbox.server_key(ns) is not None:
                log.warning(
                    "stream %s: its server rotated its key to %s (endorsed by the key this "
                    "agent trusted); trusting the new key from now on",
                    self.options.stream,
                    config.key,
                )
            self.outbox.set_server_key(ns, config.key)
