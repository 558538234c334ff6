"""Which configuration message an agent adopts and which halts it (zeal_edge.configs), one
message at a time with no broker: the pins (key and origin), the ceilings, tombstones and
releases. The same on a real broker with a real server: tests/server/broker/test_config_trust.py."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeal import Zeal
from zeal.mqtt.streamconfig import config_document, tombstone_document
from zeal.signed import CONFIG_PURPOSE
from zeal_edge.configs import ConfigDesk, Verdict
from zeal_edge.mqtt import Message
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox
from zeal_edge.records import Halt
from zeal_server.store.signing import Signer

TOPIC = "zeal/v1/temps/config"
PARAMS = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8)
SERVER = Signer(secrets.token_bytes(32))
FORGER = Signer(secrets.token_bytes(32))


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite")
    yield box
    box.close()


def desk(outbox: Outbox, **options: Any) -> ConfigDesk:
    agent = AgentOptions(stream="temps", device="dev1", data_dir=Path("unused"), **options)
    return ConfigDesk(outbox, outbox.ensure("temps", "dev1"), agent, Throttle(60))


def message(document: dict[str, Any], signer: Signer | None = SERVER) -> Message:
    body = document if signer is None else signer.sign(document, CONFIG_PURPOSE)
    return Message(TOPIC, json.dumps(body).encode(), True)


def config(params: Zeal = PARAMS, created_ms: int = 1, **extra: Any) -> dict[str, Any]:
    return config_document("temps", params, server="zs-1", created_ms=created_ms, **extra)


def adopt(d: ConfigDesk, document: dict[str, Any]) -> Verdict:
    verdict = d.offer(message(document), None, None)
    assert verdict.config is not None, verdict
    return verdict


def test_the_first_signed_configuration_is_adopted_and_pins_its_key_and_origin(
    outbox: Outbox,
) -> None:
    d = desk(outbox)
    verdict = adopt(d, config())
    assert verdict.config is not None
    assert verdict.config.params == PARAMS
    namespace = outbox.ensure("temps", "dev1")
    assert outbox.server_key(namespace) == SERVER.public
    assert outbox.origin(namespace) == "zs-1/1"


def test_unsigned_forged_and_foreign_messages_are_ignored_and_counted(outbox: Outbox) -> None:
    d = desk(outbox)
    adopt(d, config())
    unsigned = d.offer(message(config(), signer=None), None, None)
    forged = d.offer(message(config(created_ms=2), signer=FORGER), None, None)
    empty = d.offer(Message(TOPIC, b"", True), None, None)
    assert unsigned == forged == empty == Verdict()  # ignored: no config, no halt
    [status] = outbox.status()
    assert status.unverified == 3  # counted for zeal-edge status
    # A forger's tombstone halts nothing either.
    tomb = tombstone_document("temps", server="zs-1", created_ms=1, deleted_ms=5)
    assert d.offer(message(tomb, signer=FORGER), None, None) == Verdict()


def test_the_verified_tombstone_of_its_stream_halts_it(outbox: Outbox) -> None:
    d = desk(outbox)
    adopt(d, config())
    tomb = tombstone_document("temps", server="zs-1", created_ms=1, deleted_ms=5)
    verdict = d.offer(message(tomb), None, None)
    assert verdict.halt is not None
    assert verdict.halt[0] == "stream_deleted"
    # Another origin's tombstone buries another stream.
    older = tombstone_document("temps", server="zs-1", created_ms=0, deleted_ms=1)
    assert d.offer(message(older), None, None) == Verdict()


def test_the_stream_created_anew_halts_it_until_the_operator_releases_it(outbox: Outbox) -> None:
    d = desk(outbox)
    adopted = adopt(d, config()).config
    anew = d.offer(message(config(created_ms=2)), adopted, None)
    assert anew.halt is not None
    assert anew.halt[0] == "stream_recreated"
    halt = Halt(anew.halt[0], anew.halt[1], 0, None)
    released = d.offer(message(config(created_ms=2, released_ms=3)), adopted, halt)
    assert released.config is not None
    assert released.resumed
    assert outbox.origin(outbox.ensure("temps", "dev1")) == "zs-1/2"  # pinned anew


def test_a_configuration_above_the_ceilings_is_refused_before_and_halts_after_adoption(
    outbox: Outbox,
) -> None:
    d = desk(outbox, max_epsilon_per_day=8)
    greedy = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=24)
    before = d.offer(message(config(greedy)), None, None)
    assert before.config is None
    assert before.refused is not None
    adopted = adopt(d, config()).config
    after = d.offer(message(config(greedy)), adopted, None)
    assert after.halt is not None
    assert after.halt[0] == "over_ceiling"


def test_a_key_given_on_the_command_line_is_the_only_one_trusted(outbox: Outbox) -> None:
    d = desk(outbox, server_key=FORGER.public)
    assert d.offer(message(config()), None, None) == Verdict()  # signed, by another key
    assert d.offer(message(config(), signer=FORGER), None, None).config is not None
