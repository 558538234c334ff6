"""What the collector tells a device on its notice topic (``zeal.mqtt.topics``): why a message
was rejected, that a sequence number came back with other content, or that a batch jumped
far beyond the device's numbering. At most one notice per device and reason every
NOTICE_EVERY seconds. Each is signed with the installation's key (``store.signing``) and
bound to the message it is about (its stream, device, digest and batch sequence) and to
when it was issued, strictly later than the notifier's previous one: an agent acts only on
a notice that verifies under its server's key, about a message it sent, newer than the last
it acted on (zeal_edge.notices).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from zeal import ParameterError
from zeal.mqtt.topics import Notice, message_digest, notice_topic
from zeal.protocol import MAX_SEQUENCE, check_name
from zeal.signed import NOTICE_PURPOSE
from zeal_server import store
from zeal_server.ingest import Outcome
from zeal_server.ingest.bounded import Bounded

__all__ = ["NOTICES", "NOTICE_EVERY", "Notifier"]

#: A device hears about the same reason at most this often (seconds).
NOTICE_EVERY = 5.0

#: The reasons a device is told about, with the advice it is given.
NOTICES = {
    "unknown_stream": "this server has no stream {stream} (it was deleted, or never created "
    "here): nothing of this batch was stored",
    "fingerprint_mismatch": "the batch was encoded with other parameters than stream "
    "{stream}'s, or for another device: fetch the stream's configuration again",
    "future_timestamp": "the batch holds readings stamped in the future (beyond the server's "
    "ZEAL_MAX_FUTURE_SECONDS): check the device's clock",
    "too_old": "the batch holds readings older than the server accepts (ZEAL_MAX_AGE_SECONDS "
    "before their arrival): check the device's clock, or ask the operator to raise the "
    "import window",
    "too_many_buckets": "the batch spans more time buckets of stream {stream} than the "
    "server accepts in one batch (ZEAL_MAX_BUCKETS_PER_BATCH): send smaller batches",
    "not_enrolled": "stream {stream} accepts data only from enrolled devices, and device "
    "{device} is not one: ask the operator to enroll it",
    "bad_version": "the batch uses an older wire format than this server accepts: upgrade "
    "the agent",
    "before_stream": "the batch holds readings stamped before stream {stream} was created: "
    "check the device's clock",
    "over_budget": "the batch would take device {device} past stream {stream}'s privacy "
    "policy (its max_epsilon_per_day, counted per UTC day of the readings' timestamps): "
    "nothing of it was stored; the agent's ledger should have held it back (was its outbox "
    "reset, or does another agent use this device id?)",
    "device_cap": "the batch would take device {device} past its privacy caps across all "
    "its streams (per UTC day and hour of the readings' timestamps, and over 30 and 365 "
    "days where set): nothing of it was stored; run the device's streams in one agent "
    "(zeal-edge run --stream a,b,...) so that they share its caps, which the agent learns "
    "from this server",
    "transport_mismatch": "device {device} of stream {stream} is a LoRaWAN device on this "
    "server (ChirpStack delivers its frames): a batch under its name over MQTT is refused; "
    "give this device another name",
    "sequence_reset": "stored; but this server had already stored sequence {sequence} of "
    "device {device} with other content (its highest stored sequence is {last}): the "
    "device's outbox is new (reinstalled?), or another agent uses this device id",
    "sequence_jump": "stored; but its sequence {sequence} is more than 65,536 above the "
    "highest this server stored of device {device} ({last}), or beyond 2**63 - 1: counted "
    "as a sequence reset, not as missing batches. A device numbers its batches one by one",
}


class Notifier:
    """Publishes notices through `publish(topic, payload)` (QoS 1, not retained)."""

    def __init__(self, publish: Callable[[str, bytes], object]) -> None:
        self._publish = publish
        self._sent: Bounded[tuple[str, str, str], float] = Bounded()
        #: The installation's signer, once the writer has read it from the database.
        self.signer: store.Signer | None = None
        #: When the last notice was issued (ms): the next is strictly later.
        self._issued = 0

    def notify(self, server_id: str | None, outcome: Outcome, reason: str, payload: bytes) -> None:
        """Tell the device of `outcome` (of the message whose payload was `payload`) about
        `reason`, unless it is not a reason devices are told about, the server's id or key
        is not known yet, the names are not valid, or it heard about it within
        NOTICE_EVERY seconds."""
        if reason not in NOTICES or server_id is None or self.signer is None:
            return
        try:
            check_name("stream", outcome.stream)
            check_name("device", outcome.device)
        except ParameterError:
            return
        key = (outcome.stream, outcome.device, reason)
        now = time.monotonic()
        if now - self._sent.get(key, -1e18) < NOTICE_EVERY:
            return
        self._sent[key] = now
        issued = self.issue()
        last = outcome.last_sequence
        notice = Notice(
            server=server_id,
            stream=outcome.stream,
            device=outcome.device,
            reason=reason,
            message=NOTICES[reason].format(
                stream=outcome.stream,
                device=outcome.device,
                sequence=outcome.sequence,
                last="none" if last is None else last,
            ),
            issued_ms=issued,
            digest=message_digest(payload),
            sequence=outcome.sequence,
            # never a sequence to continue from that a device cannot store
            last_sequence=last if last is not None and last < MAX_SEQUENCE else None,
        )
        signed = self.signer.sign(notice.to_document(), NOTICE_PURPOSE)
        self.publish(notice_topic(outcome.stream, outcome.device), json.dumps(signed).encode())

    def issue(self) -> int:
        """When a notice issued now is issued (ms): strictly later than the previous one."""
        self._issued = max(int(time.time() * 1000), self._issued + 1)
        return self._issued

    def publish(self, topic: str, payload: bytes) -> None:
        """Publish a signed document to a device (QoS 1, not retained)."""
        self._publish(topic, payload)
