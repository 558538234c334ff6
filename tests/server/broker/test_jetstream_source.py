"""The JetStream source's own pull requests (``zeal_server.broker.jetstream``): how many it
asks for (``Pulls``, unit tests), and against a real nats-server that it takes every
message of a backlog once, never holds more than the collector has room for, and finds the
consumer again when it is deleted."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from tools.testbed.broker import free_port, wait_for_port
from tools.testbed.nats import nats_server
from tools.testbed.wait import wait_until
from zeal_server.broker.jetstream import (
    ASKED_MAX,
    FETCH_MAX,
    MQTT_PREFIX,
    MQTT_STREAM,
    PULL_EXPIRES,
    PULL_GRACE,
    JetStreamSource,
    Pulls,
)

# -- how many it asks for --------------------------------------------------------------


def test_two_requests_are_in_flight_and_the_next_goes_once_half_is_in() -> None:
    pulls = Pulls()
    assert pulls.next_batch(20_000, 0.0) == FETCH_MAX
    pulls.sent(FETCH_MAX, 0.0)
    assert pulls.next_batch(20_000, 0.0) == FETCH_MAX
    pulls.sent(FETCH_MAX, 0.0)
    assert pulls.asked == ASKED_MAX
    assert pulls.next_batch(20_000, 0.1) == 0
    for _ in range(ASKED_MAX // 2 - 1):
        pulls.delivered()
    assert pulls.next_batch(20_000, 0.1) == 0  # less than half the window free
    pulls.delivered()
    assert pulls.next_batch(20_000, 0.1) == FETCH_MAX


def test_it_never_asks_for_more_than_the_collector_has_room_for() -> None:
    pulls = Pulls()
    assert pulls.next_batch(10, 0.0) == 10
    pulls.sent(10, 0.0)
    assert pulls.next_batch(10, 0.0) == 0
    assert pulls.next_batch(0, 0.0) == 0
    for _ in range(4):
        pulls.delivered()
    assert pulls.next_batch(10, 0.0) == 0  # 4 of 10 free: less than half
    pulls.delivered()
    assert pulls.next_batch(10, 0.0) == 5
    # The writer holds more meanwhile: what is asked for already is the limit.
    assert pulls.next_batch(3, 0.0) == 0


def test_a_status_takes_off_what_its_request_will_not_bring() -> None:
    pulls = Pulls()
    pulls.sent(1000, 0.0)
    pulls.sent(1000, 0.0)
    for _ in range(300):
        pulls.delivered()
    pulls.ended({"Status": "408", "Nats-Pending-Messages": "700"})
    assert pulls.asked == 1000
    pulls.ended({"Status": "409", "Description": "Exceeded MaxWaiting"})  # no count: none
    assert pulls.asked == 1000
    pulls.ended({"Status": "408", "Nats-Pending-Messages": "5000"})  # never below zero
    assert (pulls.asked, pulls.ends) == (0, 3)


def test_requests_whose_end_was_not_heard_are_forgotten_once_they_have_surely_expired() -> None:
    pulls = Pulls()
    pulls.sent(FETCH_MAX, 10.0)
    pulls.sent(FETCH_MAX, 10.0)
    assert pulls.next_batch(20_000, 10.0 + PULL_EXPIRES) == 0
    assert pulls.next_batch(20_000, 10.0 + PULL_EXPIRES + PULL_GRACE + 0.01) == FETCH_MAX
    assert pulls.asked == 0


# -- against a real nats-server --------------------------------------------------------


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """One nats-server with JetStream, and the stream its MQTT listener would make."""
    port = free_port()
    log = (tmp_path / "nats.log").open("wb")
    process = subprocess.Popen(
        [nats_server(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "js")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout=30)
        url = f"nats://127.0.0.1:{port}"
        asyncio.run(make_stream(url))
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


async def make_stream(url: str) -> None:
    client = await nats.connect(url)
    try:
        await client.jetstream().add_stream(
            StreamConfig(
                name=MQTT_STREAM,
                subjects=[MQTT_PREFIX + ">"],
                retention=RetentionPolicy.INTEREST,
                storage=StorageType.FILE,
            )
        )
    finally:
        await client.close()


async def publish(url: str, first: int, count: int) -> None:
    """`count` batches as NATS's MQTT listener stores them (topic dots for slashes)."""
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        for i in range(first, first + count):
            await js.publish(f"{MQTT_PREFIX}zeal.v1.temps.d{i % 7}.up", str(i).encode())
    finally:
        await client.close()


async def delete_consumer(url: str, name: str) -> None:
    client = await nats.connect(url)
    try:
        await client.jetstream().delete_consumer(MQTT_STREAM, name)
    finally:
        await client.close()


class Holder:
    """The collector's side: takes what the source offers while it has room (`inflight`),
    and acknowledges when told, as the writer does after a commit."""

    def __init__(self, source: JetStreamSource, inflight: int) -> None:
        self.source, self.inflight = source, inflight
        self.lock = threading.Lock()
        self.taken: list[int] = []
        self.held: list[int] = []  # tokens not yet acknowledged
        self.most_held = 0
        source.offer = self.offer
        source.room = lambda: inflight - len(self.held)

    def offer(self, topic: str, payload: bytes, token: int, qos: int, retained: bool) -> bool:
        assert topic == f"zeal/v1/temps/d{int(payload) % 7}/up"
        with self.lock:
            self.taken.append(int(payload))
            self.held.append(token)
            self.most_held = max(self.most_held, len(self.held))
        return True

    def acknowledge(self) -> int:
        with self.lock:
            tokens, self.held = self.held, []
        self.source.ack([(token, 1) for token in tokens])
        return len(tokens)


def test_it_takes_a_backlog_once_each_within_the_collectors_room(nats_url: str) -> None:
    # The consumer would let it hold 1,000 (max_ack_pending); the collector has room for 300.
    source = JetStreamSource([nats_url], consumer="zeal-test", inflight=1000, ack_wait=30, name="t")
    holder = Holder(source, 300)
    source.start()
    try:
        # An interest stream keeps only what a consumer wants: the source makes its own
        # as it starts, and the backlog comes after it.
        wait_until(lambda: source.connected, what="the source's consumer")
        asyncio.run(publish(nats_url, 0, 2500))
        while len(holder.taken) < 2500:
            # The source fills the room, then waits for the commit's acknowledgements.
            wait_until(lambda: len(holder.held) >= 300 or len(holder.taken) == 2500)
            holder.acknowledge()
        assert sorted(holder.taken) == list(range(2500))
        assert holder.most_held == 300
        # Idle for longer than a request lasts: its end (408) is heard, the source asks
        # again, and a batch published now still comes.
        ends = source._pulls.ends
        wait_until(lambda: source._pulls.ends > ends, what="an idle request's end heard")
        asyncio.run(publish(nats_url, 2500, 1))
        wait_until(lambda: len(holder.taken) == 2501)
        holder.acknowledge()

        # The consumer deleted under it: the source says so and makes it again.
        asyncio.run(delete_consumer(nats_url, "zeal-test"))
        wait_until(lambda: source.last_error is not None, what="the source to see it gone")
        assert "zeal-test" in source.last_error
        wait_until(lambda: source.connected, what="the source to make the consumer again")
        asyncio.run(publish(nats_url, 2501, 50))
        wait_until(lambda: len(holder.taken) == 2551)
        holder.acknowledge()
    finally:
        source.stop()
    assert sorted(holder.taken) == list(range(2551))
