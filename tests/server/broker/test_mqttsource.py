"""Zeal's broker as the collector's source, on a fake paho client (tools/testbed/fakepaho.py):
what it subscribes to, which messages it hands to the door and which it acknowledges at
once, a take-over, and a stop that flushes. The collector takes a device's batch from it,
stores it, and only then acknowledges it. What a real broker does with all this is tested
on Mosquitto (test_collector_mqtt.py, test_hostile.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import NO_DEVICE_CAP, create_stream, settings
from tools.testbed.appstate import state
from tools.testbed.fakepaho import FakeClient
from zeal.mqtt.brokerurl import parse_broker_url
from zeal.mqtt.topics import CONFIG_FILTER, DATA_FILTER, FLUSH_FILTER
from zeal.wire import encode_batch
from zeal_server.app import create_app
from zeal_server.broker.collector import Collector
from zeal_server.broker.identity import TAKEOVER_RETRY
from zeal_server.broker.mqttsource import MqttSource
from zeal_server.settings import ServerSettings


class Desk:
    """The collector's side, recorded: configurations seen, connections, the door."""

    def __init__(self, *, take: bool = True) -> None:
        self.configs: list[tuple[str, bytes]] = []
        self.connects = 0
        self.offered: list[tuple[str, bytes, int, int, bool]] = []
        self.logins: list[str | None] = []
        self.take = take

    def offer(
        self,
        topic: str,
        payload: bytes,
        token: int,
        qos: int,
        *,
        retained: bool,
        login: str | None = None,
    ) -> bool:
        self.offered.append((topic, payload, token, qos, retained))
        self.logins.append(login)
        return self.take


def source(
    *, data: bool = True, take: bool = True, login_property: str | None = None
) -> tuple[MqttSource, FakeClient, Desk]:
    fake, desk = FakeClient(), Desk(take=take)
    src = MqttSource(
        parse_broker_url("mqtt://127.0.0.1:1883"),
        client_id="zeal:c1",
        share_group="",
        inflight=10,
        data=data,
        on_config=lambda stream, payload: desk.configs.append((stream, payload)),
        on_connect=lambda: setattr(desk, "connects", desk.connects + 1),
        client=fake,
        login_property=login_property,
    )
    src.offer = desk.offer
    return src, fake, desk


def test_it_subscribes_to_the_data_and_the_configurations_and_is_ready_after_the_suback() -> None:
    src, fake, desk = source()
    src.start()
    assert not src.ready
    assert fake.subscribed == []
    fake.connected()
    assert (src.connected, src.ready, src.connects, desk.connects) == (True, True, 1, 1)
    [topics] = fake.subscribed
    assert [topic for topic, _options in topics] == [DATA_FILTER, CONFIG_FILTER]
    data_options, config_options = (options for _topic, options in topics)
    assert data_options.retainHandling == 2  # a retained batch is never replayed
    assert config_options.noLocal  # our own configurations do not come back


def test_with_jetstream_it_subscribes_to_the_configurations_only() -> None:
    src, fake, _desk = source(data=False)
    src.start()
    fake.connected()
    assert [[topic for topic, _ in topics] for topics in fake.subscribed] == [[CONFIG_FILTER]]


def test_a_configuration_goes_to_the_sync_and_is_acknowledged_at_once() -> None:
    src, fake, desk = source()
    src.start()
    fake.connected()
    mid = fake.deliver("zeal/v1/temps/config", b"{}", retain=True)
    assert desk.configs == [("temps", b"{}")]
    assert desk.offered == []
    assert fake.acked == [(mid, 1)]


def test_a_data_message_waits_for_the_commit_unless_the_door_sheds_it() -> None:
    src, fake, desk = source()
    src.start()
    fake.connected()
    kept = fake.deliver("zeal/v1/temps/a/up", b"batch")
    assert desk.offered == [("zeal/v1/temps/a/up", b"batch", kept, 1, False)]
    assert fake.acked == []  # held until the writer commits
    src.ack([(kept, 1)])
    assert fake.acked == [(kept, 1)]
    desk.take = False
    shed = fake.deliver("zeal/v1/temps/a/up", b"x", retain=True)
    assert fake.acked == [(kept, 1), (shed, 1)]  # shed: acknowledged, or it comes back


def test_the_login_the_broker_names_goes_to_the_door_only_when_it_is_asked_for() -> None:
    """With ZEAL_MQTT_LOGIN_PROPERTY the login the broker stamped reaches the door ("" for a
    message without the stamp); without it, nothing a client sent is read as a login."""
    stamped = [("other", "x"), ("zeal-login", "home-1")]
    src, fake, desk = source(login_property="zeal-login")
    src.start()
    fake.connected()
    fake.deliver("zeal/v1/temps/home-1/up", b"a", user=stamped)
    fake.deliver("zeal/v1/temps/home-1/up", b"b")
    assert desk.logins == ["home-1", ""]
    plain, fake, desk = source()
    plain.start()
    fake.connected()
    fake.deliver("zeal/v1/temps/home-1/up", b"a", user=stamped)
    assert desk.logins == [None]


def test_a_topic_that_is_not_utf_8_reaches_the_door_as_empty() -> None:
    src, fake, desk = source()
    src.start()
    fake.connected()
    message = mqtt.MQTTMessage(mid=9, topic=b"zeal/v1/\xff/a/up")
    message.payload, message.qos = b"x", 1
    fake.on_message(fake, None, message)
    assert desk.offered == [("", b"x", 9, 1, False)]


def test_a_takeover_is_counted_and_the_session_taken_back_after_the_retry_delay() -> None:
    src, fake, _desk = source()
    src.start()
    fake.connected()
    fake.drop("Session taken over")
    assert (src.connected, src.ready, src.takeovers) == (False, False, 1)
    assert "zeal:c1" in (src.last_error or "")
    assert fake.reconnect_delay == (TAKEOVER_RETRY, TAKEOVER_RETRY)
    fake.connected()
    assert (src.ready, src.connects, fake.reconnect_delay) == (True, 2, (1, 30))


def test_a_refused_connection_says_why_and_is_not_counted() -> None:
    src, fake, desk = source()
    src.start()
    fake.connected("Not authorized")
    assert (src.connected, src.connects, desk.connects) == (False, 0, 0)
    assert "Not authorized" in (src.last_error or "")


def test_a_refused_subscription_leaves_it_not_ready_and_says_why() -> None:
    """A broker whose ACL does not let the collector read the data topics refuses that
    subscription in its SUBACK (the configurations' is granted): connected, not subscribed,
    and the error names the refusal; a later connection granted both is subscribed."""
    src, fake, _desk = source()
    src.start()
    fake.connected(refuse=0)
    assert (src.connected, src.ready, src.subscribed.is_set()) == (True, False, False)
    assert "refused the collector's subscription: Not authorized" in (src.last_error or "")
    fake.drop()
    fake.connected()
    assert (src.ready, src.last_error) == (True, None)


def test_stop_flushes_the_acknowledgements_before_it_disconnects() -> None:
    src, fake, _desk = source()
    src.start()
    fake.connected()
    src.stop()
    assert fake.unsubscribed == [FLUSH_FILTER]
    assert (fake.is_connected(), fake.running) == (False, False)


@pytest.fixture
def app(tmp_path: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings(f"sqlite:///{tmp_path / 'z.sqlite'}"))) as c:
        yield c


def test_the_collector_stores_a_batch_from_it_and_acknowledges_it_after_the_commit(
    app: TestClient, tmp_path: Any
) -> None:
    params = create_stream(app)
    server = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": "sqlite://",
            "ZEAL_MQTT_URL": "mqtt://127.0.0.1:1",
            "ZEAL_COLLECTOR_ID": "zeal-fake",
            **NO_DEVICE_CAP,  # three readings in one hour: past the device hour rule
        }
    )
    fake = FakeClient()
    collector = Collector(server, state(app).sessions, mqtt_client=fake)
    assert [s.name for s in collector.sources] == ["mqtt"]
    collector.mqtt.start()
    fake.connected()
    now = int(time.time() * 1000)
    codes = params.perturb(np.full(3, 20.0), rng=np.random.default_rng(1))
    payload = encode_batch(
        params, stream="temps", device="a", sequence=0, codes=codes, timestamps=[now] * 3
    )
    mid = fake.deliver("zeal/v1/temps/a/up", payload)
    assert fake.acked == []
    assert collector.holding == 1
    assert collector.writer._commit(collector.queue.take(10)) == "stored"
    assert fake.acked == [(mid, 1)]
    assert collector.holding == 0
    status = collector.status()
    assert (status.counts["stored"], status.counts["readings"], status.subscribed) == (1, 3, True)
    assert app.get("/api/v1/streams/temps/stats").json()["readings"] == 3
