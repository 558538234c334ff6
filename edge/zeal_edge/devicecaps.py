"""The device's caps across streams, learnt from its server (zeal.mqtt.topics.DeviceCapsNotice).

A server tells each device its caps (per UTC day, which also sets the device hour rule, and
over 30 and 365 days) on its notice topics, when it first stores a batch of it and whenever
one changes. The agent adopts a caps document only if all of these hold, else it ignores it
and counts it (``zeal-edge status``, by why):

- it verifies under the server's key for ``zeal-caps/1`` (a notice's signature does not
  pass for one; else ``unverified``);
- it is about this agent's device (``caps_not_ours``) and from the server that configured
  the stream (``caps_foreign_server``);
- its revision and issue time are newer than those of the last document adopted for the
  device (``caps_stale``: a replay, or an older server's); one of the same revision and
  caps as those adopted changes nothing and is not counted (the server tells each of the
  device's streams, and tells it again after a restart).

Then each cap takes the lower of the server's and the agent's own (``--device-max-epsilon-
per-day`` and the 30- and 365-day ones: its ceiling, 8 a day by default); a cap above the
ceiling is refused and logged, the ceiling stays. The caps adopted are kept in the outbox:
an agent that restarts keeps them before it hears from its server again.
"""

from __future__ import annotations

import json
import logging

from zeal.mqtt.streamconfig import StreamConfig
from zeal.mqtt.topics import CAPS_FIELDS, CAPS_FORMAT, DeviceCapsNotice, TopicError
from zeal.signed import CAPS_PURPOSE
from zeal_edge.device import DeviceLedger
from zeal_edge.mqtt import Message
from zeal_edge.notices import NoticeDesk

__all__ = ["CapsDesk", "is_caps"]

log = logging.getLogger(__name__)


def is_caps(message: Message) -> bool:
    """Whether a message on a notice topic claims to be a caps document (not verified)."""
    try:
        document = json.loads(message.payload)
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(document, dict) and document.get("format") == CAPS_FORMAT


class CapsDesk:
    """Reads the caps documents of one agent's device: beside its notices (`notices`: the
    same outbox namespace, options, log throttle and trusted key), for its `ledger`."""

    def __init__(self, notices: NoticeDesk, ledger: DeviceLedger) -> None:
        self.outbox, self.namespace = notices.outbox, notices.namespace
        self.options, self.throttle, self.trust = notices.options, notices.throttle, notices.trust
        self.ledger = ledger

    def _ignore(self, kind: str, why: str, now: int) -> None:
        self.outbox.record_ignored(self.namespace, f"caps_{kind}", now_ms=now)
        if self.throttle.ready(f"ignored-caps-{kind}"):
            log.warning(
                "ignoring a caps document signed by the server: %s (counted in zeal-edge "
                "status; logged once a minute)",
                why,
            )

    def _refused(
        self, caps: DeviceCapsNotice, config: StreamConfig | None
    ) -> tuple[str, str] | None:
        """Why a verified document is not adopted (kind and reason; kind "" for one that
        tells what the agent holds already), or None."""
        device = self.options.device
        if caps.device != device:
            return "not_ours", f"it is about device {caps.device}, not {device}"
        ours = config.server if config else None
        if ours is not None and caps.server != ours:
            return "foreign_server", f"server {caps.server} did not configure it"
        last = self.outbox.learned_caps(device)
        if last is not None and caps.revision == last[0] and caps.caps == last[2]:
            return "", "told again on another stream, or after the server restarted"
        if last is not None and (caps.revision, caps.issued_ms) <= last[:2]:
            return "stale", "it is not newer than the caps adopted before"
        return None

    def handle(self, message: Message, config: StreamConfig | None, now: int) -> bool:
        """Adopt the caps document `message` holds if it passes every check of the module
        docstring; whether it was adopted."""
        document = self.trust.verify(message, CAPS_PURPOSE)
        if document is None:
            return False
        try:
            caps = DeviceCapsNotice.from_document(document)
        except TopicError as exc:
            log.warning("ignoring a caps document on %s: %s", message.topic, exc)
            return False
        device = self.options.device
        refused = self._refused(caps, config)
        if refused is not None:
            if refused[0]:  # else what it holds already: nothing to count
                self._ignore(*refused, now)
            return False
        above = self.ledger.learn(caps.caps)
        self.outbox.set_learned_caps(device, caps.revision, caps.issued_ms, caps.caps)
        told = ", ".join(
            f"{CAPS_FIELDS[d]} {'none' if v is None else f'{v:g}'}" for d, v in caps.caps.items()
        )
        log.info("device %s: its server holds its caps at %s", device, told)
        for days in above:
            log.warning(
                "device %s: its server's %s (%g) is above this agent's own ceiling: the "
                "ceiling stays (raise it with --device-max-epsilon-per-%s)",
                device,
                CAPS_FIELDS[days],
                caps.caps[days],
                "day" if days == 1 else f"{days}-days",
            )
        return True
