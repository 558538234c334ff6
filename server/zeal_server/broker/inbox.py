"""The queue between the network thread (or the JetStream source) and the writer: the
messages that passed the door, and the counts of those shed at it."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, NamedTuple

from zeal.mqtt.topics import parse_data_topic

if TYPE_CHECKING:
    from zeal_server.broker.sources import Source

__all__ = ["BUSY_RATE", "STRETCH", "Inbox", "Received", "Shed"]


class Received(NamedTuple):
    """A data message that passed the door, queued for the writer (a tuple: the network
    thread makes one per message)."""

    topic: str
    payload: bytes
    mid: int
    qos: int
    received_ms: int
    #: Where it came from: what acknowledges it, whether its sender is a device on Zeal's
    #: broker, and what translates it into a batch when it is not one yet
    #: (``sources.Source``).
    source: Source
    #: The broker login that published it, where the broker says (ZEAL_MQTT_LOGIN_PROPERTY).
    login: str | None = None


class Shed:
    """Messages shed at the door, counted by (stream, device, reason) until the writer
    records them in the rejects table. Names are kept only when valid (else ""): the
    rejects table and logs never hold strings a client chose beyond 64 checked characters."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, topic: str, reason: str) -> None:
        names = parse_data_topic(topic) if reason != "bad_topic" else None
        with self._lock:
            self._counts[(*(names or ("", "")), reason)] += 1

    def take(self) -> Counter[tuple[str, str, str]]:
        """The counts so far, and start again from none."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def give_back(self, counts: Counter[tuple[str, str, str]]) -> None:
        """Counts that could not be recorded, to be tried again."""
        with self._lock:
            self._counts.update(counts)


#: Messages a second from which the writer goes on gathering (``Inbox.take``): one in
#: each 2 ms poll, a rate a network thread slowed by the writer still reaches
#: (deploy/SCALING.md).
BUSY_RATE = 500
#: How long the writer gathers under such an inflow, at most (seconds): the commit lag it
#: may add (a heavy inflow fills the broker's window, ZEAL_COLLECTOR_INFLIGHT, sooner).
STRETCH = 2.0
_POLL = 0.002


class Inbox:
    """The bounded queue from the network thread (or the JetStream source) to the writer.

    A deque, whose append and popleft are atomic, and an event the idle writer waits on:
    a message costs a fraction of ``queue.Queue``'s two locks and condition. When it holds
    `maxsize` messages (the broker sent more than Receive Maximum: docs/server.md), ``put``
    waits for the writer to take some, as ``queue.Queue.put`` would.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[Received] = deque()
        self._arrived = threading.Event()
        self._room = threading.Event()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def put(self, item: Received) -> bool:
        """Queue `item`: True at once, False if it first had to wait for room."""
        full = len(self._items) >= self.maxsize
        while len(self._items) >= self.maxsize:
            self._room.clear()
            if len(self._items) >= self.maxsize:
                self._room.wait(0.1)
        self._items.append(item)
        if not self._arrived.is_set():  # the writer cleared it before it looked and waits
            self._arrived.set()
        return not full

    def take(
        self, batch_max: int, *, wait: float = 0.2, gather: float = 0.05, stretch: float = STRETCH
    ) -> list[Received]:
        """What the writer stores in one transaction: the first message within `wait`
        seconds, then whatever else arrives within `gather` seconds (10 ms when a backlog
        was waiting), or for as long as messages keep coming at BUSY_RATE or faster (at
        most `stretch` seconds), up to `batch_max` (empty when nothing came).

        The writer and paho's network thread share one interpreter lock: a writer that
        stores while the network thread reads at full speed waits for the lock at every
        database call and loses several times its own work to the switching. Under a
        heavy inflow it therefore lets the network thread read, and stores the lot in one
        transaction (measured: bench/message_cost.py; docs/server.md)."""
        items = self._items
        if not items:
            self._arrived.clear()
            if not items and not self._arrived.wait(wait):
                return []
        taken: list[Received] = []
        start = time.monotonic()
        deadline, limit = start + min(gather, stretch), start + stretch
        busy, backlog = max(1, int(BUSY_RATE * _POLL)), BUSY_RATE * gather
        while True:
            before = len(taken)
            while items and len(taken) < batch_max:
                taken.append(items.popleft())
            if len(taken) > before and not self._room.is_set():
                self._room.set()  # a network thread waiting in put may go on
            now = time.monotonic()
            if before == 0 and len(taken) >= backlog:  # a backlog: no need to wait for more
                deadline = now + 5 * _POLL
            if len(taken) - before >= busy:  # still coming fast: gather a little longer
                deadline = min(limit, max(deadline, now + 5 * _POLL))
            if len(taken) >= batch_max or now >= deadline:
                break
            time.sleep(_POLL)
        return taken
