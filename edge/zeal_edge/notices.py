"""What the agent does with the server's notices about its device (``zeal.mqtt.topics``): a
notice must verify under the server's key (``zeal_edge.trust``; else it is ignored and
counted), notices from another server are ignored (logged), a sequence reset moves the
outbox's sequence numbers past the server's, a rejection is counted (``zeal-edge status``)
and logged, and a FATAL one halts the agent."""

from __future__ import annotations

import logging

from zeal.mqtt.streamconfig import StreamConfig
from zeal.mqtt.topics import Notice, TopicError
from zeal.signed import NOTICE_PURPOSE
from zeal_edge.configs import ConfigDesk
from zeal_edge.mqtt import Message
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox

__all__ = ["FATAL", "NoticeDesk"]

log = logging.getLogger(__name__)
#: Notices after which the agent stops: the server no longer has the stream.
FATAL = frozenset({"unknown_stream"})


class NoticeDesk:
    """Reads the notices of one device (its namespace in the outbox)."""

    def __init__(
        self,
        outbox: Outbox,
        namespace: str,
        options: AgentOptions,
        throttle: Throttle,
        trust: ConfigDesk,
    ) -> None:
        self.outbox, self.namespace = outbox, namespace
        self.options, self.throttle = options, throttle
        #: What verifies the server's signature (the configurations' desk keeps the key).
        self.trust = trust

    def _read(self, message: Message) -> Notice | None:
        """The notice, if its server signed it and it is one (else None, logged)."""
        document = self.trust.verify(message, NOTICE_PURPOSE)
        if document is None:
            return None
        try:
            return Notice.from_document(document)
        except TopicError as exc:
            log.warning("ignoring a notice on %s: %s", message.topic, exc)
            return None

    def handle(
        self, message: Message, config: StreamConfig | None, now: int
    ) -> tuple[str, str] | None:
        """Act on one notice; (reason, message) when the agent must halt, else None."""
        notice = self._read(message)
        if notice is None:
            return None
        ours = config.server if config else None
        if ours is not None and notice.server != ours:
            if self.throttle.ready(f"foreign-{notice.server}-{notice.reason}"):
                log.warning(
                    "server %s, which did not configure stream %s (server %s did), reports "
                    "%s: %s. Two servers share the broker; this agent follows %s.",
                    notice.server,
                    self.options.stream,
                    ours,
                    notice.reason,
                    notice.message,
                    ours,
                )
            return None
        if notice.reason == "sequence_reset":
            log.warning(
                "the server already knew device %s: %s. No reading is lost.",
                self.options.device,
                notice.message,
            )
            if notice.last_sequence is not None and self.outbox.advance_sequence(
                self.namespace, notice.last_sequence + 1
            ):
                log.info("sequence numbers continue at %d", notice.last_sequence + 1)
            return None
        self.outbox.record_server_reject(self.namespace, notice.reason, now_ms=now)
        created = config.created_ms if config else None
        if created is not None and notice.time_ms < created:
            return None  # about the stream of that name before it was created anew
        if notice.reason in FATAL and ours is not None:
            return notice.reason, f"the server rejected a batch: {notice.message}"
        if self.throttle.ready(f"notice-{notice.reason}"):
            log.error(
                "the server rejected batch #%s (%s): %s (logged once a minute; counted in "
                "zeal-edge status)",
                notice.sequence,
                notice.reason,
                notice.message,
            )
        return None
