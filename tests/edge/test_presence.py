"""The agent's claim on its device id (zeal_edge.presence), on its real MQTT connection
(zeal_edge.mqtt.Connection) over a fake paho client (tools/testbed/fakepaho.py): when the
claim is announced, who gives way to whom, and when it is withdrawn. Two real agents on a
real broker: tests/edge/test_agent_mqtt.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tools.testbed.fakepaho import FakeClient
from zeal.mqtt.brokerurl import parse_broker_url
from zeal.mqtt.topics import Presence
from zeal_edge import presence
from zeal_edge.mqtt import Connection
from zeal_edge.presence import RETAINED_GRACE, DeviceClaim

TOPIC = "zeal/v1/temps/dev1/presence"
STARTED_MS = 1_700_000_000_000


class Clock:
    """The monotonic clock presence reads, moved by the test (the grace is what is tested)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    shim = SimpleNamespace(monotonic=fake.monotonic, strftime=time.strftime, gmtime=time.gmtime)
    monkeypatch.setattr(presence, "time", shim)
    return fake


def claim(instance: str = "me") -> tuple[DeviceClaim, FakeClient]:
    fake = FakeClient()
    connection = Connection(
        parse_broker_url("mqtt://127.0.0.1:1883"),
        client_id="dev1",
        subscriptions=[TOPIC],
        client=fake,
    )
    connection.start()
    return DeviceClaim(
        connection, TOPIC, instance=instance, started_ms=STARTED_MS, name="dev1"
    ), fake


def announced(fake: FakeClient) -> list[Presence]:
    return [Presence.from_json(m.payload) for m in fake.published if m.topic == TOPIC]


def other(instance: str, since_ms: int, *, online: bool = True) -> bytes:
    return Presence(instance, online, since_ms).to_json()


def test_the_claim_is_announced_once_the_retained_presence_had_time_to_arrive(
    clock: Clock,
) -> None:
    mine, fake = claim()
    assert not mine.due()  # not connected: no SUBACK yet
    fake.connected()  # CONNACK, then the SUBACK of the presence topic
    assert not mine.due()  # the grace starts at the SUBACK
    clock.now += RETAINED_GRACE - 0.01
    assert not mine.due()
    clock.now += 0.01
    assert mine.due()
    mine.announce()
    assert not mine.due()  # once per connection
    [message] = fake.published
    assert (message.topic, message.retain, message.qos) == (TOPIC, True, 1)
    assert announced(fake) == [Presence("me", True, STARTED_MS)]


def test_it_announces_again_after_a_reconnection(clock: Clock) -> None:
    mine, fake = claim()
    fake.connected()
    mine.due()
    clock.now += RETAINED_GRACE
    mine.announce()
    fake.drop()
    fake.connected()
    assert not mine.due()
    clock.now += RETAINED_GRACE
    assert mine.due()


def test_another_instance_online_before_the_announcement_stops_the_newcomer() -> None:
    mine, _fake = claim()
    reason = mine.seen(other("them", STARTED_MS - 60_000))
    assert reason is not None
    assert "dev1 is already running elsewhere (agent instance them" in reason


def test_its_own_an_offline_an_empty_or_a_broken_presence_stops_nothing() -> None:
    mine, _fake = claim()
    assert mine.seen(other("me", STARTED_MS)) is None
    assert mine.seen(other("them", STARTED_MS - 1, online=False)) is None
    assert mine.seen(b"") is None  # a cleared retained message
    assert mine.seen(b"{not json") is None


def test_after_the_announcement_the_younger_agent_gives_way(clock: Clock) -> None:
    mine, fake = claim()
    fake.connected()
    mine.due()
    clock.now += RETAINED_GRACE
    mine.announce()
    # A younger one (started later): told to stop by a repeated announcement.
    assert mine.seen(other("young", STARTED_MS + 5_000)) is None
    assert announced(fake) == [Presence("me", True, STARTED_MS)] * 2
    # An older one: this one stops.
    assert mine.seen(other("old", STARTED_MS - 5_000)) is not None


def test_a_clean_stop_marks_it_offline_unless_another_was_the_last_seen(clock: Clock) -> None:
    mine, fake = claim()
    fake.connected()
    mine.due()
    clock.now += RETAINED_GRACE
    mine.announce()
    mine.release(STARTED_MS + 1_000)
    assert announced(fake)[-1] == Presence("me", False, STARTED_MS + 1_000)

    theirs, fake = claim()
    fake.connected()
    theirs.seen(other("someone", STARTED_MS + 9_000, online=False))
    theirs.release(STARTED_MS + 10_000)
    assert fake.published == []  # it must not overwrite another instance's message


def test_a_disconnected_agent_does_not_queue_its_release() -> None:
    mine, fake = claim()
    mine.release(STARTED_MS)
    assert fake.published == []
