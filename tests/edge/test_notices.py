"""Which of the server's notices an agent acts on (zeal_edge.notices), one message at a time
with no broker: only a notice signed by its server, for its own stream and device, about a
batch it committed, newer than the last it acted on. The same with real agents on the
deployment's broker: tests/server/broker/test_hostile_round4.py."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeal import Zeal
from zeal.mqtt.streamconfig import StreamConfig
from zeal.mqtt.topics import Notice, message_digest
from zeal.protocol import MAX_SEQUENCE
from zeal.signed import NOTICE_PURPOSE
from zeal_edge.configs import ConfigDesk
from zeal_edge.mqtt import Message
from zeal_edge.notices import NoticeDesk
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox
from zeal_edge.records import SealedBatch
from zeal_server.store.signing import Signer

TOPIC = "zeal/v1/temps/dev1/notice"
SERVER = Signer(secrets.token_bytes(32))
CONFIG = StreamConfig("temps", Zeal(lower=0, upper=110, epsilon=1), "zs-1", 1)
SENT = [b"batch-0", b"batch-1", b"batch-2"]


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite")
    namespace = box.ensure("temps", "dev1")
    sealed = [SealedBatch(namespace, k, p, 1, 0) for k, p in enumerate(SENT)]
    box.commit_batches(sealed, now_ms=0, fingerprint="0" * 16)
    yield box
    box.close()


def desk(outbox: Outbox) -> NoticeDesk:
    options = AgentOptions("temps", "dev1", Path("unused"), server_key=SERVER.public)
    namespace = outbox.ensure("temps", "dev1")
    trust = ConfigDesk(outbox, namespace, options, Throttle(60))
    return NoticeDesk(outbox, namespace, options, Throttle(60), trust)


def notice(reason: str = "too_old", **fields: Any) -> Message:
    values: dict[str, Any] = {
        "server": "zs-1",
        "stream": "temps",
        "device": "dev1",
        "reason": reason,
        "message": "m",
        "issued_ms": 10,
        "digest": message_digest(SENT[1]),
        "sequence": 1,
    } | fields
    document = SERVER.sign(Notice(**values).to_document(), NOTICE_PURPOSE)
    return Message(TOPIC, json.dumps(document).encode(), False)


def counted(outbox: Outbox) -> tuple[dict[str, int], dict[str, int]]:
    [status] = outbox.status()
    return status.server_rejects or {}, status.ignored or {}


def test_a_notice_about_a_batch_it_sent_is_acted_on_once(outbox: Outbox) -> None:
    d = desk(outbox)
    assert d.handle(notice(), CONFIG, 0) is None
    assert counted(outbox) == ({"too_old": 1}, {})
    d.handle(notice(), CONFIG, 0)  # the same notice again: a replay
    assert counted(outbox) == ({"too_old": 1}, {"notice_stale": 1})


def test_notices_of_another_device_stream_or_message_are_ignored_and_never_halt(
    outbox: Outbox,
) -> None:
    """unknown_stream about another device, another stream, a batch it never sent (garbage
    under its name: no sequence), a sequence that is not its digest's, another server."""
    d = desk(outbox)
    fatal = "unknown_stream"
    for message in (
        notice(fatal, device="dev2"),
        notice(fatal, stream="other"),
        notice(fatal, digest=message_digest(b"garbage"), sequence=None),
        notice(fatal, sequence=2),
        notice(fatal, server="zs-2"),
    ):
        assert d.handle(message, CONFIG, 0) is None
    assert counted(outbox) == (
        {},
        {"notice_not_ours": 2, "notice_not_sent": 2, "notice_foreign_server": 1},
    )


def test_a_notice_about_a_message_that_did_not_decode_names_its_batch(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    """No sequence in the notice (the server could not decode it), but its digest is batch
    #1's: counted, and the log names batch #1, never #None."""
    d = desk(outbox)
    d.handle(notice("bad_version", sequence=None), CONFIG, 0)
    assert counted(outbox) == ({"bad_version": 1}, {})
    assert "batch #1 (bad_version)" in caplog.text
    assert "#None" not in caplog.text
    halt = d.handle(notice("unknown_stream", sequence=None, issued_ms=11), CONFIG, 0)
    assert halt is not None  # about its own batch: the stream is gone


def test_a_sequence_reset_never_moves_numbers_past_what_the_outbox_can_hold(
    outbox: Outbox,
) -> None:
    d = desk(outbox)
    namespace = outbox.ensure("temps", "dev1")
    d.handle(notice("sequence_reset", last_sequence=99), CONFIG, 0)
    assert outbox.next_sequence(namespace) == 100
    for k, last in enumerate((MAX_SEQUENCE, 2**64 - 1, -5)):
        d.handle(notice("sequence_reset", last_sequence=last, issued_ms=20 + k), CONFIG, 0)
    assert outbox.next_sequence(namespace) == 100
