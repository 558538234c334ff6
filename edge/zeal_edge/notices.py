"""What the agent does with the server's notices about its device (``zeal.mqtt.topics``).

A notice counts only if all of these hold, else it is ignored and counted (``zeal-edge
status``, by why) and never halts the agent:

- it verifies under the server's key (``zeal_edge.trust``; else ``unverified``);
- it is for this agent's stream and device (``not_ours``: a notice of another device or
  stream re-published here) and from the server that configured the stream
  (``foreign_server``);
- it is about a message this agent sent: its digest is one of the last batches committed
  to the outbox (``Outbox.sent_sequence``), with the same sequence when the notice names
  one (``not_sent``: a message someone else published under this device's name, or a
  batch too old to remember);
- it was issued after the last notice acted on (``stale``: a replay).

Then a sequence reset moves the outbox's sequence numbers past the server's (never beyond
``MAX_SEQUENCE``), a jump is logged, a rejection is counted and logged, and a FATAL one
halts the agent.
"""

from __future__ import annotations

import logging

from zeal.mqtt.streamconfig import StreamConfig
from zeal.mqtt.topics import Notice, TopicError
from zeal.protocol import MAX_SEQUENCE
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

    def _ignore(self, kind: str, notice: Notice, why: str, now: int) -> None:
        """Count an ignored notice; say why at most once a minute per kind."""
        self.outbox.record_ignored(self.namespace, f"notice_{kind}", now_ms=now)
        if self.throttle.ready(f"ignored-notice-{kind}"):
            log.warning(
                "ignoring a %s notice signed by the server: %s (counted in zeal-edge status; "
                "logged once a minute)",
                notice.reason,
                why,
            )

    def _about(self, notice: Notice, config: StreamConfig | None, now: int) -> int | None:
        """The sequence of the batch this agent sent that `notice` is about (its digest's,
        also when the server could not decode it), once the notice passed every check of
        the module docstring; None when it is ignored (counted)."""
        options = self.options
        if (notice.stream, notice.device) != (options.stream, options.device):
            self._ignore(
                "not_ours",
                notice,
                f"it is about device {notice.device} of stream {notice.stream}, not this "
                f"agent's {options.device} of {options.stream}",
                now,
            )
            return None
        ours = config.server if config else None
        if ours is not None and notice.server != ours:
            self._ignore(
                "foreign_server",
                notice,
                f"server {notice.server} did not configure stream {options.stream} (server "
                f"{ours} did): two servers share the broker",
                now,
            )
            return None
        sent = self.outbox.sent_sequence(self.namespace, notice.digest)
        if sent is None or (notice.sequence is not None and notice.sequence != sent):
            self._ignore(
                "not_sent",
                notice,
                f"this agent sent no message with digest {notice.digest}"
                + ("" if notice.sequence is None else f" as batch #{notice.sequence}")
                + " among its last batches: someone else published under its name, or the "
                "notice is about a batch too old to remember",
                now,
            )
            return None
        last = self.outbox.mark(self.namespace, "notice_ms")
        if isinstance(last, int) and notice.issued_ms <= last:
            self._ignore(
                "stale",
                notice,
                "it was issued before the last notice this agent acted on (a replay)",
                now,
            )
            return None
        self.outbox.set_mark(self.namespace, "notice_ms", notice.issued_ms)
        return sent

    def handle(
        self, message: Message, config: StreamConfig | None, now: int
    ) -> tuple[str, str] | None:
        """Act on one notice; (reason, message) when the agent must halt, else None."""
        notice = self._read(message)
        if notice is None:
            return None
        sequence = self._about(notice, config, now)
        if sequence is None:
            return None
        which = f"batch #{sequence}"
        if notice.reason in ("sequence_reset", "sequence_jump"):
            self._moved(notice, which)
            return None
        self.outbox.record_server_reject(self.namespace, notice.reason, now_ms=now)
        created = config.created_ms if config else None
        if created is not None and notice.issued_ms < created:
            return None  # about the stream of that name before it was created anew
        if notice.reason in FATAL and config is not None:
            return notice.reason, f"the server rejected {which}: {notice.message}"
        if self.throttle.ready(f"notice-{notice.reason}"):
            log.error(
                "the server rejected %s (%s): %s (logged once a minute; counted in "
                "zeal-edge status)",
                which,
                notice.reason,
                notice.message,
            )
        return None

    def _moved(self, notice: Notice, which: str) -> None:
        """A batch stored after a sequence reset or as a jump: continue past the server's
        highest sequence, where it says one a device can store."""
        log.warning(
            "the server stored %s of device %s: %s. No reading is lost.",
            which,
            self.options.device,
            notice.message,
        )
        last = notice.last_sequence
        if notice.reason != "sequence_reset" or last is None:
            return
        if not 0 <= last < MAX_SEQUENCE:
            log.error(
                "the server's notice says its highest sequence is %d, past what this agent "
                "numbers up to (%d): sequence numbers stay where they are",
                last,
                MAX_SEQUENCE,
            )
            return
        if self.outbox.advance_sequence(self.namespace, last + 1):
            log.info("sequence numbers continue at %d", last + 1)
