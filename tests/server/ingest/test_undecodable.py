"""A message whose decoding raises an unexpected error is refused alone as ``undecodable``,
logged with its traceback, and the messages beside it are stored (zeal_server.ingest.undecodable).

Unit tests of the layer above the decoders: the decoder is replaced by one with a bug set
off by one payload; the store (SQLite) is real."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.server.helpers import PARAMS, T0
from zeal import encode_batch
from zeal.wirebatches import decode_many
from zeal_server import store
from zeal_server.broker.chirpstack import uplinks as uplinks_module
from zeal_server.broker.chirpstack.events import Uplink
from zeal_server.broker.chirpstack.uplinks import Translated, Uplinks
from zeal_server.ingest import Ingest
from zeal_server.ingest import undecodable as undecodable_module
from zeal_server.store.db import make_engine, migrate, session_factory

POISON = b"\x02poison"


@pytest.fixture
def sessions(tmp_path: Path) -> Any:
    engine = make_engine(f"sqlite:///{tmp_path / 'z.sqlite'}")
    migrate(engine)
    made = session_factory(engine)
    with made() as session, session.begin():
        store.create_stream(session, name="temps", lower=0, upper=110, epsilon=1,
                            payload_bits=6, max_epsilon_per_day=1e6)  # fmt: skip
    yield made
    engine.dispose()


def batch(device: str, sequence: int, now: int) -> tuple[str, bytes, int]:
    codes = PARAMS.perturb(np.array([20.0, 30.0]), rng=np.random.default_rng(sequence))
    payload = encode_batch(PARAMS, stream="temps", device=device, sequence=sequence,
                           timestamps=[now - 2000, now - 1000], codes=codes)  # fmt: skip
    return f"zeal/v1/temps/{device}/up", payload, now


def test_a_payload_that_sets_off_a_decoder_bug_is_refused_alone_and_the_rest_stored(
    sessions: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Among three messages, the one whose decoding raises ZeroDivisionError is rejected
    as undecodable; the two others are stored; the bug is logged with its traceback."""

    def buggy(payloads: list[bytes], *args: Any, **kwargs: Any) -> Any:
        if POISON in payloads:
            raise ZeroDivisionError("a bug in the decoder")
        return decode_many(payloads, *args, **kwargs)

    monkeypatch.setattr(undecodable_module, "decode_many", buggy)
    now = store.now_ms()
    messages = [batch("a", 0, now), ("zeal/v1/temps/b/up", POISON, now), batch("c", 0, now)]
    with caplog.at_level(logging.ERROR), sessions() as session, session.begin():
        outcomes = Ingest().add_many(session, messages)
    assert [(o.status, o.reason) for o in outcomes] == [
        ("stored", None),
        ("rejected", "undecodable"),
        ("stored", None),
    ]
    record = next(r for r in caplog.records if "unexpected error" in r.getMessage())
    assert record.exc_info is not None
    assert record.exc_info[0] is ZeroDivisionError
    with sessions() as session:
        assert store.rejects(session, "temps") == {"undecodable": 1}


def test_an_uplink_that_sets_off_a_translation_bug_is_refused_as_undecodable(
    sessions: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uplink of a bound application whose translation raises OverflowError is an
    undecodable reject of its device, not an error of the writer."""

    def buggy(*args: Any, **kwargs: Any) -> bytes:
        raise OverflowError("a bug in the translation")

    monkeypatch.setattr(uplinks_module, "to_batch", buggy)
    uplinks = Uplinks()
    uplinks.bindings = {("app", 10): ("temps", "dev_eui")}
    up = Uplink("app", "0102030405060708", "k", "26000001", 10, 1, T0, "d", b"\x01\x02")
    monkeypatch.setattr(uplinks_module, "parse_uplink", lambda _payload: up)
    with sessions() as session, session.begin():
        done = uplinks.translate(session, Ingest(), "t", b"{}", store.now_ms())
    assert not isinstance(done, Translated)
    assert (done.status, done.reason, done.device) == ("rejected", "undecodable", up.dev_eui)
