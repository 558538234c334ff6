"""The collector's door: what is refused in paho's network thread, before a message is
queued, decoded or written, and the bookkeeping that keeps a hostile client from costing
memory or log lines (every structure keyed by what clients send is bounded).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from zeal import ParameterError
from zeal.mqtt.topics import MAX_TOPIC_LENGTH, parse_data_topic
from zeal.protocol import REJECT_REASONS, check_name
from zeal.wire import MAX_PAYLOAD_BYTES
from zeal_server.ingest.bounded import MAX_KEYS, Bounded

__all__ = [
    "LOG_LINES_PER_MINUTE",
    "REJECT_BURST",
    "REJECT_RATE",
    "LogThrottle",
    "RejectBudget",
    "budget_key",
    "door_check",
    "refusal",
]

log = logging.getLogger(__name__)

#: A device may cause this many rejects in a burst, then REJECT_RATE per second; beyond that
#: its messages are dropped at the door (acknowledged, counted as ``rate_limited``) without
#: being decoded or written, so a device flooding garbage cannot crowd out the others.
REJECT_BURST = 100
REJECT_RATE = 10.0
#: At most this many reject lines are logged per minute in all (each (reason, device) at
#: most once a minute besides); the rest are counted in one summary line.
LOG_LINES_PER_MINUTE = 30


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
                "rejected a message from %s: %s, %s (logged once a minute per reason and device)",
                key[1],
                key[0],
                REJECT_REASONS.get(reason, "?"),
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
