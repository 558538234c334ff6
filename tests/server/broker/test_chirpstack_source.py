"""ChirpStack's broker as the collector's source, on a fake paho client
(tools/testbed/fakepaho.py): the same persistent subscription as Zeal's broker
(``broker.mqttsession``), its own topic and door. What ChirpStack and a real broker do is
tested with them (test_lorawan.py)."""

from __future__ import annotations

from tools.testbed.fakepaho import FakeClient
from zeal.mqtt.brokerurl import parse_broker_url
from zeal.mqtt.topics import FLUSH_FILTER
from zeal_server.broker.chirpstack.source import MAX_EVENT, ChirpStackSource
from zeal_server.broker.door import RejectBudget

TOPIC = "application/+/device/+/event/up"


def source(share_group: str = "") -> tuple[ChirpStackSource, FakeClient, list[int]]:
    fake, offered = FakeClient(), []
    src = ChirpStackSource(
        parse_broker_url("mqtt://127.0.0.1:1883"),
        client_id="zeal:c1-chirpstack",
        topic=TOPIC,
        share_group=share_group,
        inflight=10,
        client=fake,
    )
    src.offer = lambda _topic, _payload, token, _qos, **_: offered.append(token) is None
    return src, fake, offered


def test_it_subscribes_to_the_uplink_events_without_replaying_retained_ones() -> None:
    src, fake, _offered = source(share_group="zeal")
    src.start()
    fake.connected()
    [[(topic, options)]] = fake.subscribed
    assert topic == f"$share/zeal/{TOPIC}"
    assert options.retainHandling == 2
    assert (src.connected, src.ready, src.connects) == (True, True, 1)


def test_a_refused_subscription_leaves_it_not_ready_and_says_why() -> None:
    src, fake, _offered = source()
    src.start()
    fake.connected(refuse=0)
    assert (src.connected, src.ready) == (True, False)
    assert "ChirpStack's broker" in (src.last_error or "")
    assert "Not authorized" in (src.last_error or "")


def test_an_event_waits_for_the_commit_and_a_stop_flushes() -> None:
    src, fake, offered = source()
    src.start()
    fake.connected()
    mid = fake.deliver("application/1/device/0011223344556677/event/up", b"{}")
    assert (offered, fake.acked) == ([mid], [])
    src.ack([(mid, 1)])
    assert fake.acked == [(mid, 1)]
    src.stop()
    assert fake.unsubscribed == [FLUSH_FILTER]


def test_its_door_sheds_retained_and_oversized_events_and_spends_no_device_budget() -> None:
    src, _fake, _offered = source()
    budget = RejectBudget(burst=1, rate=0.0)
    assert src.refusal("t", retained=True, size=10, budget=budget) == "retained"
    assert src.refusal("t", retained=False, size=MAX_EVENT + 1, budget=budget) == "too_large"
    assert src.refusal("t", retained=False, size=MAX_EVENT, budget=budget) is None
    assert (src.reaches_devices, src.translator is src.uplinks, src.skipped()) == (
        False,
        True,
        {},
    )
