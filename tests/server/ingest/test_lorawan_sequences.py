"""A LoRaWAN device's frame counters as its sequence (SQLite and PostgreSQL): the frames
withheld are counted missing once the import window has passed them, a retransmission of
its last frame heard later is a duplicate, and a rejoin's frames (a new session address,
the counter from 0) are stored as sequence resets. Through the writer's own path
(``Uplinks.translate``, then ``Ingest.add_many`` with the frame's identity), no broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from chirpstack_api.integration import UplinkEvent
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.server.helpers import create, operator_client
from tools.testbed.appstate import state
from zeal.lorawan import encode_lorawan
from zeal_server import store
from zeal_server.broker.chirpstack.uplinks import Translated, Uplinks
from zeal_server.ingest import Ingest, Outcome
from zeal_server.store import retention
from zeal_server.store.models import Device

APP = "a1b2c3d4-0000-4000-8000-000000000001"
DEV_EUI = "70b3d57ed0050001"
MINUTE = 60_000
NOW = (store.now_ms() // MINUTE) * MINUTE


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    yield from operator_client(database_url)


class Air:
    """Uplinks of one device as ChirpStack publishes them, stored as the writer stores them."""

    def __init__(self, client: TestClient) -> None:
        self.sessions = state(client).sessions
        with self.sessions() as session, session.begin():
            stream = store.stream_by_name(session, "temps")
            assert stream is not None
            store.bind(session, APP, 10, stream, now_ms=NOW)
            self.params = store.params_of(stream)
        self.uplinks, self.ingest = Uplinks(), Ingest()
        self.rng = np.random.default_rng(5)

    def send(self, f_cnt: int, time_ms: int, dev_addr: str, data: bytes | None = None) -> Outcome:
        if data is None:
            codes = self.params.perturb(np.full(3, 20.0), rng=self.rng)
            data = encode_lorawan(
                self.params, stream="temps", device=DEV_EUI, codes=codes, spacing_seconds=10
            )
        up = UplinkEvent(deduplication_id=str(uuid.uuid4()), f_cnt=f_cnt, f_port=10, data=data,
                         dr=5, dev_addr=dev_addr)  # fmt: skip
        up.time.FromMilliseconds(time_ms)
        up.device_info.application_id = APP
        up.device_info.dev_eui = DEV_EUI
        topic = f"application/{APP}/device/{DEV_EUI}/event/up"
        with self.sessions() as session, session.begin():
            self.uplinks.load(session)
            found = self.uplinks.translate(
                session, self.ingest, topic, up.SerializeToString(), time_ms
            )
            assert isinstance(found, Translated), found
            message = [(found.topic, found.payload, time_ms)]
            return self.ingest.add_many(session, message, originals=[found.original])[0]

    def counted(self) -> tuple[int, int, int]:
        """(missing, late, sequence resets) of the device."""
        with self.sessions() as session:
            row = session.execute(
                select(
                    func.sum(Device.missing),
                    func.sum(Device.late),
                    func.sum(Device.sequence_resets),
                )
            ).one()
            return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)

    def housekeep(self, now_ms: int, max_age_ms: int) -> None:
        with self.sessions() as session, session.begin():
            retention.housekeep(session, store.list_streams(session), now_ms, max_age_ms=max_age_ms)


def test_the_frames_withheld_are_counted_missing_and_a_rejoin_is_a_reset(
    client: TestClient,
) -> None:
    create(client)
    air = Air(client)
    withheld = {3, 7, 10}
    for f_cnt in range(12):
        if f_cnt not in withheld:
            outcome = air.send(f_cnt, NOW + f_cnt * MINUTE, "26000001")
            assert outcome.status == "stored", outcome
    # The last frame retransmitted (the same session, counter and payload), heard later.
    with air.sessions() as session:
        assert session.scalar(select(func.sum(Device.readings))) == 27
    last = encode_lorawan(
        air.params,
        stream="temps",
        device=DEV_EUI,
        codes=air.params.perturb(np.full(3, 20.0), rng=np.random.default_rng(11)),
        spacing_seconds=10,
    )
    assert air.send(12, NOW + 12 * MINUTE, "26000001", last).status == "stored"
    again = air.send(12, NOW + 12 * MINUTE + 5_000, "26000001", last)
    assert again.status == "duplicate"
    assert air.counted() == (0, 0, 0)
    air.housekeep(NOW + 30 * MINUTE, 20 * MINUTE)  # horizon NOW + 10 min: before frame 11
    assert air.counted() == (0, 0, 0)
    air.housekeep(NOW + 40 * MINUTE, 20 * MINUTE)  # horizon past every frame
    assert air.counted() == (len(withheld), 0, 0)
    # A rejoin: a new DevAddr, the counter from 0; its frames are stored, none dropped.
    for f_cnt in range(3):
        outcome = air.send(f_cnt, NOW + (41 + f_cnt) * MINUTE, "26000002")
        assert (outcome.status, outcome.reset) == ("stored", True)
    assert air.counted() == (len(withheld), 0, 3)
    devices = client.get("/api/v1/streams/temps/devices").json()["devices"]
    assert [(d["missing"], d["late"]) for d in devices] == [(3, 0)]
    assert client.get("/api/v1/streams/temps/stats").json()["missing"] == 3
