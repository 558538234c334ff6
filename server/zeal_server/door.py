"""The collector's door: what is refused in paho's network thread, before a message is
queued, decoded or written, and the bookkeeping that keeps a hostile client from costing
memory or log lines (every structure keyed by what clients send is bounded).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from typing import Any, Generic, NamedTuple, TypeVar

from paho.mqtt.subscribeoptions import SubscribeOptions

from zeal import ParameterError
from zeal.protocol import check_name
from zeal.topics import CONFIG_FILTER, DATA_FILTER, MAX_TOPIC_LENGTH, parse_data_topic
from zeal.wire import MAX_PAYLOAD_BYTES

__all__ = [
    "LOG_LINES_PER_MINUTE",
    "MAX_KEYS",
    "REJECT_BURST",
    "REJECT_RATE",
    "Bounded",
    "Inbox",
    "LogThrottle",
    "Received",
    "RejectBudget",
    "Shed",
    "budget_key",
    "data_subscription",
    "door_check",
    "refusal",
    "subscriptions",
]

log = logging.getLogger("zeal_server.collector")

#: A device may cause this many rejects in a burst, then REJECT_RATE per second; beyond that
#: its messages are dropped at the door (acknowledged, counted as ``rate_limited``) without
#: being decoded or written, so a device flooding garbage cannot crowd out the others.
REJECT_BURST = 100
REJECT_RATE = 10.0
#: The longest data topic with valid names: zeal/v1/ + 64 + / + 64 + /up. Anything longer
#: is refused at the door before any other work (no decoding, no database, no log of it).
#: Bookkeeping keyed by what clients choose (budgets, log and notice throttles) holds at
#: most this many keys, forgetting the least recently used: memory stays flat whatever
#: topics arrive.
MAX_KEYS = 50_000
#: At most this many reject lines are logged per minute in all (each (reason, device) at
#: most once a minute besides); the rest are counted in one summary line.
LOG_LINES_PER_MINUTE = 30

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A dict that keeps at most `limit` keys, dropping the least recently used."""

    def __init__(self, limit: int = MAX_KEYS) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V) -> V:
        value = self._items.get(key)
        if value is None:
            return default
        self._items.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def find(self, key: K) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def clear(self) -> None:
        self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


def budget_key(topic: str) -> str:
    """Whom a reject is charged to: the device level of the topic (with the deployment's
    ACL, a device can publish only under its own user name there, so this is the broker
    user), or "" for topics without one."""
    parts = topic.split("/", 4)
    return parts[3][:64] if len(parts) == 5 else ""


class RejectBudget:
    """A token bucket per device (``budget_key``), spent by rejected messages only."""

    def __init__(self, burst: int = REJECT_BURST, rate: float = REJECT_RATE) -> None:
        self.burst, self.rate = float(burst), rate
        self._buckets: Bounded[str, tuple[float, float]] = Bounded()
        self._lock = threading.Lock()

    def _level(self, key: str, now: float) -> float:
        tokens, since = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - since) * self.rate)

    def __len__(self) -> int:
        """How many devices the budget remembers (at most MAX_KEYS)."""
        return len(self._buckets)

    def allows(self, topic: str) -> bool:
        if not self._buckets:  # no device has been refused anything: the usual case
            return True
        key = budget_key(topic)
        with self._lock:
            return key not in self._buckets or self._level(key, time.monotonic()) >= 1

    def spend(self, topic: str) -> None:
        key = budget_key(topic)
        with self._lock:
            now = time.monotonic()
            # Never below -burst: a device that stops misbehaving is heard again within
            # (burst + 1) / rate seconds (about 10 s), however long it flooded.
            self._buckets[key] = (max(-self.burst, self._level(key, now) - 1), now)


def door_check(topic: str) -> str | None:
    """Why a data message is refused before any work (``bad_topic``), or None."""
    if len(topic) > MAX_TOPIC_LENGTH:
        return "bad_topic"
    return _names_check(topic)


@functools.lru_cache(maxsize=MAX_KEYS)  # the same devices' topics, message after message
def _names_check(topic: str) -> str | None:
    names = parse_data_topic(topic)
    if names is None:
        return "bad_topic"
    try:
        check_name("stream", names[0])
        check_name("device", names[1])
    except ParameterError:
        return "bad_topic"
    return None


class LogThrottle:
    """Reject log lines: each key at most once a minute, at most LOG_LINES_PER_MINUTE lines a
    minute in all; what was held back is summed up in one line."""

    def __init__(self) -> None:
        self._last: Bounded[tuple[str, str], float] = Bounded()
        self._minute, self._lines, self._held = -1e18, 0, 0

    def reject(self, reason: str, stream: str, device: str) -> None:
        """Log a reject of (stream, device) if the throttle lets it through."""
        # Names reach here checked (<= 64 characters) or empty; cut anyway, never trust.
        key = (reason, f"{stream[:64]}/{device[:64]}")
        if self.ready(key, time.monotonic()):
            log.warning(
                "rejected a message from %s: %s (logged once a minute per reason and device)",
                key[1],
                key[0],
            )

    def ready(self, key: tuple[str, str], now: float) -> bool:
        if now - self._minute >= 60:
            if self._held:
                log.warning(
                    "%d more rejects were not logged in the last minute (see /metrics and "
                    "the stream's stats)",
                    self._held,
                )
            self._minute, self._lines, self._held = now, 0, 0
        if now - self._last.get(key, -1e18) < 60:
            return False
        if self._lines >= LOG_LINES_PER_MINUTE:
            self._held += 1
            return False
        self._last[key] = now
        self._lines += 1
        return True


def refusal(topic: str, *, retained: bool, size: int, budget: RejectBudget) -> str | None:
    """Why a message on a data topic is shed at the door (a reason of the catalogue), or
    None to queue it: a bad topic, a retained message, a payload over the wire's limit, or
    a device past its reject budget."""
    reason = door_check(topic)
    if reason is None:
        if retained:
            reason = "retained"
        elif size > MAX_PAYLOAD_BYTES:
            reason = "too_large"
        elif not budget.allows(topic):
            reason = "rate_limited"
    return reason


def data_subscription(share_group: str) -> str:
    """What the collector subscribes to: every device's data, shared when a group is set.

    One collector (the default) uses a plain subscription. Mosquitto (2.0.11 here) loses
    messages of a *shared* subscription across a broker restart: those queued for the
    collector's session while it was away are dropped when it subscribes again, and without
    subscribing again it receives nothing new (tests/server/test_crash.py,
    test_broker_restart_while_100_devices_publish, found it; deploy/SCALING.md). Several
    collectors need a group (ZEAL_SHARE_GROUP), on a broker whose shared subscriptions
    survive restarts.
    """
    return f"$share/{share_group}/{DATA_FILTER}" if share_group else DATA_FILTER


def subscriptions(data_topic: str, *, v311: bool, data: bool = True) -> list[tuple[str, Any]]:
    """What the collector subscribes to: the data topic (unless the data come from
    JetStream) and the stream configurations.

    Under MQTT v5 our own configuration messages are not echoed back (no_local); the
    retained ones of every stream arrive once, and other servers' changes as they happen.
    Retained data messages are never sent at subscription (retainHandling 2): a batch
    retained on a data topic would otherwise be replayed at every resubscribe. MQTT 3.1.1
    has neither option: our own configurations come back (the sync finds them equal to
    the database's and does nothing), and retained data messages are refused at the door.
    """
    if v311:
        return [(data_topic, 1), (CONFIG_FILTER, 1)][0 if data else 1 :]
    return [
        (data_topic, SubscribeOptions(qos=1, retainHandling=2)),
        (CONFIG_FILTER, SubscribeOptions(qos=1, noLocal=True)),
    ][0 if data else 1 :]


class Received(NamedTuple):
    """A data message that passed the door, queued for the writer (a tuple: the network
    thread makes one per message)."""

    topic: str
    payload: bytes
    mid: int
    qos: int
    received_ms: int


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
#: each 2 ms poll. A higher rate (10,000 was tried) is not reached by a network thread
#: slowed down by a writer storing beside it, and the two stay in that slow way.
BUSY_RATE = 500
#: How long the writer gathers under such an inflow, at most (seconds): the commit lag it
#: may add. A heavy inflow fills the broker's window (ZEAL_COLLECTOR_INFLIGHT, the most a
#: transaction takes) sooner; with 1 s, a drain of 20,000 messages was cut in two, and the
#: first part stored while the rest arrived.
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
