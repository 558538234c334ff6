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
    """The desk of an agent given the server's key (as provisioned), unless `options` say
    otherwise."""
    options.setdefault("server_key", SERVER.public)
    agent = AgentOptions(stream="temps", device="dev1", data_dir=Path("unused"), **options)
    return ConfigDesk(outbox, outbox.ensure("temps", "dev1"), agent, Throttle(60))


def message(document: dict[str, Any], signer: Signer | None = SERVER) -> Message:
    body = document if signer is None else signer.sign(document, CONFIG_PURPOSE)
    return Message(TOPIC, json.dumps(body).encode(), True)


def config(
    params: Zeal = PARAMS, created_ms: int = 1, revision: int = 1, **extra: Any
) -> dict[str, Any]:
    return config_document(
        "temps", params, server="zs-1", created_ms=created_ms, revision=revision, **extra
    )


def adopt(d: ConfigDesk, document: dict[str, Any]) -> Verdict:
    verdict = d.offer(message(document), None, None)
    assert verdict.config is not None, verdict
    return verdict


def test_with_no_key_given_nothing_is_adopted_unless_trust_on_first_use_is_asked(
    outbox: Outbox,
) -> None:
    """An agent given no key adopts no configuration, however well signed, and says how to
    give it the key; only with --trust-first-use does it take the first one's key."""
    d = desk(outbox, server_key=None)
    assert d.offer(message(config()), None, None) == Verdict()
    assert d.refused is not None
    assert "--server-key" in d.refused
    assert outbox.server_key(outbox.ensure("temps", "dev1")) is None
    trusting = desk(outbox, server_key=None, trust_first_use=True)
    assert trusting.offer(message(config(), signer=FORGER), None, None).config is not None
    assert outbox.server_key(outbox.ensure("temps", "dev1")) == FORGER.public


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


def ignored(outbox: Outbox) -> dict[str, int]:
    [status] = outbox.status()
    return status.ignored or {}


def test_a_superseded_configuration_replayed_is_ignored_and_counted_never_halts(
    outbox: Outbox,
) -> None:
    """The operator lowered the policy from 8 to 2 (revision 1 to 2); the agent follows.
    Revision 1, signed by the server and published again, is ignored and counted: the
    agent keeps policy 2. An agent with a ceiling of 4 does not halt on it either
    (before: it moved back to 8, or halted over_ceiling)."""
    for ceiling in (8.0, 4.0):
        box = Outbox(outbox.path.parent / f"replay-{ceiling}.sqlite")
        d = desk(box, max_epsilon_per_day=ceiling)
        lowered = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=2)
        old = config(revision=1) if ceiling == 8 else None
        if old is not None:
            adopt(d, old)
        current = adopt(d, config(lowered, revision=2)).config
        replayed = d.offer(message(config(revision=1)), current, None)
        assert replayed == Verdict()  # no config, no halt
        assert ignored(box) == {"stale_config": 1}
        again = d.offer(message(config(lowered, revision=2)), current, None)
        assert again.config is not None  # its current one, published again: as it was
        assert again.config.params == lowered
        box.close()


def test_a_newer_revision_above_the_ceiling_halts_and_an_older_one_cannot_lift_it(
    outbox: Outbox,
) -> None:
    """Revision 2 asks for more than the agent's ceiling: it halts (over_ceiling). The older
    revision 1 replayed does not resume it; revision 3 with the policy lowered does."""
    d = desk(outbox, max_epsilon_per_day=8)
    adopted = adopt(d, config(revision=1)).config
    greedy = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=24)
    halted = d.offer(message(config(greedy, revision=2)), adopted, None)
    assert halted.halt is not None
    assert halted.halt[0] == "over_ceiling"
    halt = Halt(halted.halt[0], halted.halt[1], 0, None)
    assert d.offer(message(config(revision=1)), adopted, halt) == Verdict()
    assert ignored(outbox) == {"stale_config": 1}
    resumed = d.offer(message(config(revision=3)), adopted, halt)
    assert resumed.config is not None
    assert resumed.resumed


def test_an_old_incarnations_release_is_ignored_and_a_release_must_be_newer(
    outbox: Outbox,
) -> None:
    """The stream was released (created 1, released 3), deleted and created anew (5), and
    the agent follows the new one. The old incarnation's release, published again, is
    ignored and counted (before: the agent re-pinned the old origin, then halted
    stream_recreated); so is a release of the new one no newer than the last seen."""
    d = desk(outbox)
    adopt(d, config(created_ms=1, revision=1))
    first = d.offer(message(config(created_ms=1, released_ms=3, revision=3)), None, None)
    assert first.config is not None
    halted = d.offer(message(config(created_ms=5, revision=5)), first.config, None)
    assert halted.halt is not None
    halt = Halt(halted.halt[0], halted.halt[1], 0, None)
    follows = d.offer(message(config(created_ms=5, released_ms=6, revision=6)), None, halt)
    assert follows.config is not None
    namespace = outbox.ensure("temps", "dev1")
    assert outbox.origin(namespace) == "zs-1/5"
    old = d.offer(message(config(created_ms=1, released_ms=3, revision=3)), follows.config, None)
    assert old == Verdict()
    assert outbox.origin(namespace) == "zs-1/5"
    assert ignored(outbox) == {"old_release": 1}
    other = d.offer(message(config(created_ms=7, released_ms=6, revision=7)), None, None)
    assert other == Verdict()  # a newer incarnation, but a release no newer than seen
    assert ignored(outbox) == {"old_release": 2}


def test_a_rotated_key_is_followed_through_its_endorsement_and_a_forged_chain_is_not(
    outbox: Outbox,
) -> None:
    """The server rotates its key: the new key's configuration carries the old key's
    endorsement, and the agent given the old key adopts it and pins the new key. A chain
    whose link the old key did not sign is refused."""
    new = Signer(secrets.token_bytes(32))
    link = SERVER.endorse(new.public, "zs-1", 10)
    d = desk(outbox)
    adopt(d, config(revision=1))
    rotated = {**config(revision=2), "endorsements": [link]}
    verdict = d.offer(message(rotated, signer=new), None, None)
    assert verdict.config is not None
    assert outbox.server_key(outbox.ensure("temps", "dev1")) == new.public
    # Another agent, given the old key: a forger's chain that claims the old key endorsed it
    box = Outbox(outbox.path.parent / "forged.sqlite")
    forged_link = {**FORGER.endorse(FORGER.public, "zs-1", 10), "by": SERVER.public}
    forged = {**config(revision=2), "endorsements": [forged_link]}
    assert desk(box).offer(message(forged, signer=FORGER), None, None) == Verdict()
    assert box.status()[0].unverified == 1
    box.close()


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


def test_a_key_given_anew_replaces_the_pinned_one(outbox: Outbox) -> None:
    """A device provisioned again (a new key given) trusts the new key, not the one its
    outbox pinned; the same key given again keeps what it endorsed since."""
    adopt(desk(outbox), config())
    d = desk(outbox, server_key=FORGER.public)
    assert d.offer(message(config(revision=2)), None, None) == Verdict()
    assert d.offer(message(config(revision=2), signer=FORGER), None, None).config is not None
