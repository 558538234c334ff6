"""Whom the collector tells their caps, and when (zeal_server.broker.devicecaps), with the
publishing recorded: a device once per stream it sent to, again only when its caps
changed; every document signed for zeal-caps/1 and newer than the one before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from zeal.mqtt.topics import DeviceCapsNotice
from zeal.signed import CAPS_PURPOSE, KEY, SIGNATURE, decode_field, signed_bytes
from zeal_server import store
from zeal_server.broker.devicecaps import CapsTeller
from zeal_server.broker.notices import Notifier
from zeal_server.store.db import make_engine, migrate, session_factory


def test_devices_are_told_once_per_stream_and_again_when_their_caps_change(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'caps.sqlite'}")
    migrate(engine)
    sessions = session_factory(engine)
    sent: list[tuple[str, dict[str, Any]]] = []
    notifier = Notifier(lambda topic, payload: sent.append((topic, json.loads(payload))))
    with sessions() as session, session.begin():
        notifier.signer = store.signer(session)
        server = store.installation_id(session)
    teller = CapsTeller(notifier, 8.0, {30: 100.0})

    def tell() -> list[tuple[str, DeviceCapsNotice]]:
        sent.clear()
        with sessions() as session:
            teller.tell(session, server, store.caps_version(session))
        out = []
        for topic, document in sent:
            key = Ed25519PublicKey.from_public_bytes(decode_field(document[KEY], 32))
            key.verify(decode_field(document[SIGNATURE], 64), signed_bytes(document, CAPS_PURPOSE))
            out.append((topic, DeviceCapsNotice.from_document(document)))
        return out

    teller.seen({("temps", "a"), ("humid", "a"), ("temps", "b")})
    first = tell()
    assert [t for t, _ in first] == [
        "zeal/v1/humid/a/notice",
        "zeal/v1/temps/a/notice",
        "zeal/v1/temps/b/notice",
    ]
    assert {d.device: d.caps for _, d in first} == {
        "a": {1: 8.0, 30: 100.0, 365: None},
        "b": {1: 8.0, 30: 100.0, 365: None},
    }
    teller.seen({("temps", "a"), ("humid", "a")})  # told already
    assert tell() == []
    teller.seen({("co2", "a")})  # a stream it was not told on
    assert [t for t, _ in tell()] == ["zeal/v1/co2/a/notice"]
    with sessions() as session, session.begin():
        store.set_device_cap(session, "b", 4.0)
    changed = tell()  # the revision moved: only b's caps changed
    assert [(t, d.caps[1]) for t, d in changed] == [("zeal/v1/temps/b/notice", 4.0)]
    assert changed[0][1].revision == 1
    assert changed[0][1].issued_ms > max(d.issued_ms for _, d in first)
    with sessions() as session, session.begin():
        store.set_tag_cap(session, "site", "x", 2.0, days=365)  # no device carries it
    assert tell() == []
    engine.dispose()
