"""Data from NATS JetStream instead of an MQTT subscription (``ZEAL_NATS_URL``).

Devices publish MQTT (3.1.1, QoS 1) to any node of a NATS cluster; NATS maps the topic
``zeal/v1/{stream}/{device}/up`` to the subject ``zeal.v1.{stream}.{device}.up``, which a
JetStream stream (``ZEAL_NATS_STREAM``, replicated ``ZEAL_NATS_REPLICAS`` times) keeps.
Every collector pulls from one durable consumer (``ZEAL_NATS_CONSUMER``) that they share:
JetStream hands each message to one of them, and redelivers what is not acknowledged
within ``ZEAL_NATS_ACK_WAIT`` seconds (a collector that died); through a database stall
the collector keeps extending the wait of what it holds (``in_progress``). A collector
acknowledges a message only after the transaction that stored it committed; a redelivered
message that had been stored is a duplicate to the store (``batches``), so nothing is
stored twice. The stream and the consumer are created by the first collector that finds
them missing, with the same settings by every collector.

The collector logs in to NATS with its broker login (``ZEAL_MQTT_USERNAME``, ``_PASSWORD``),
which on a NATS deployment is one login for both (deploy/nats/users.conf.example).
nats-py is asyncio; it runs in a thread of its own, which fetches only while the
collector's queue has room (at most ``ZEAL_COLLECTOR_INFLIGHT`` unacknowledged, which is
also the consumer's ``max_ack_pending``) and acknowledges on the writer's behalf.

NATS subjects cannot carry a ``.`` inside a name (it separates tokens), so a server with
``ZEAL_NATS_URL`` refuses stream and device names with one (:func:`name_problem`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.errors import NotFoundError

__all__ = ["SUBJECTS", "JetStreamSource", "name_problem", "topic_of"]

log = logging.getLogger("zeal_server.collector")

#: What the JetStream stream captures: every data topic, as NATS maps it.
SUBJECTS = "zeal.v1.*.*.up"
#: At most this many messages per fetch.
FETCH_MAX = 1000


def name_problem(kind: str, name: str) -> str | None:
    """Why NATS cannot carry `name` as a stream or device name (None: it can)."""
    if "." in name:
        return (
            f"{kind} names cannot contain '.' on a NATS deployment (ZEAL_NATS_URL is set): "
            f"NATS maps the MQTT topic to a subject whose tokens '.' separates; got {name!r}"
        )
    return None


def topic_of(subject: str) -> str:
    """The MQTT topic a subject came from (no name holds a '.', see name_problem)."""
    return subject.replace(".", "/")


class JetStreamSource:
    """Pulls data messages for the collector and acknowledges them after its commits.

    ``offer(topic, payload, token)`` is the collector's door: it returns False when the
    message was refused there (it is then acknowledged at once), True when it was queued.
    ``room()`` says how many more the collector can hold.
    """

    def __init__(
        self,
        servers: list[str],
        *,
        stream: str,
        consumer: str,
        replicas: int,
        inflight: int,
        ack_wait: float,
        name: str,
        login: tuple[str, str | None] | None = None,
    ) -> None:
        self.servers, self.stream, self.consumer = servers, stream, consumer
        self.replicas, self.inflight, self.name = replicas, inflight, name
        self.ack_wait, self.login = ack_wait, login
        self.connected = False
        self.last_error: str | None = None
        self._held: dict[int, Any] = {}  # token -> nats Msg, until acknowledged
        self._refused: list[Any] = []  # shed at the door: acknowledged after the fetch
        self._logged = -1e18  # connection errors are logged once a minute
        self._since: dict[int, float] = {}  # token -> when fetched (for in_progress)
        self._last_progress = time.monotonic()
        self._next_token = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeal-jetstream", daemon=True)
        self.offer: Callable[[str, bytes, int], bool] = lambda _t, _p, _k: False
        self.room: Callable[[], int] = lambda: 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:  # also ends a connect still retrying
            loop.call_soon_threadsafe(task.cancel)
        self._thread.join(timeout=15)

    def ack(self, tokens: list[int]) -> None:
        """Acknowledge these messages (writer thread, after the commit)."""
        loop = self._loop
        messages = [m for m in (self._held.pop(t, None) for t in tokens) if m is not None]
        for token in tokens:
            self._since.pop(token, None)
        if loop is None or not messages:
            return
        asyncio.run_coroutine_threadsafe(self._ack_all(messages), loop)

    @staticmethod
    async def _ack_all(messages: list[Any]) -> None:
        for message in messages:
            try:
                await message.ack()
            except Exception as exc:  # noqa: BLE001 (a lost ack only means a redelivery)
                log.warning("could not acknowledge a JetStream message: %s", exc)
                return

    # -- the thread's own loop ---------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._task = loop.create_task(self._main())
        try:
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass  # stopped
        finally:
            loop.close()

    async def _main(self) -> None:
        while not self._stop.is_set():
            try:
                await self._consume()
            except Exception as exc:  # noqa: BLE001 (NATS down or refusing: said, retried)
                self.connected = False
                self.last_error = f"NATS {','.join(self.servers)}: {type(exc).__name__}: {exc}"
                log.error("%s; retrying in 2 s", self.last_error)
                await asyncio.sleep(2)

    async def _consume(self) -> None:
        user, password = self.login or (None, None)
        client = await nats.connect(
            servers=self.servers,
            user=user,
            password=password,
            name=self.name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            connect_timeout=5,
            error_cb=self._error,
            disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected,
        )
        try:
            js = client.jetstream()
            await self._ensure(js)
            subscription = await js.pull_subscribe_bind(self.consumer, self.stream)
            self.connected, self.last_error = True, None
            log.info("collector %s pulls from JetStream %s", self.name, self.stream)
            while not self._stop.is_set():
                await self._still_working()
                room = min(FETCH_MAX, self.room())
                if room < 1:
                    await asyncio.sleep(0.02)
                    continue
                try:
                    messages = await subscription.fetch(room, timeout=0.5)
                except NatsTimeout:
                    continue
                for message in messages:
                    self._take(message)
                refused, self._refused = self._refused, []
                await self._ack_all(refused)
        finally:
            self.connected = False
            await client.close()

    async def _error(self, exc: Exception) -> None:
        """nats-py's errors (it retries by itself): kept for /readyz, logged once a minute."""
        self.last_error = f"NATS {','.join(self.servers)}: {type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now - self._logged >= 60:
            self._logged = now
            log.error("%s; retrying (logged once a minute)", self.last_error)

    async def _disconnected(self) -> None:
        self.connected = False

    async def _reconnected(self) -> None:
        self.connected, self.last_error = True, None
        log.info("collector %s reconnected to NATS", self.name)

    async def _still_working(self) -> None:
        """Every third of the ack wait, tell JetStream that the messages held longer than
        that are still being stored (``in_progress``): a database stall longer than the
        ack wait then costs no redelivery (copies the writer would store as duplicates)."""
        now = time.monotonic()
        period = self.ack_wait / 3
        if now - self._last_progress < period:
            return
        self._last_progress = now
        for token, since in list(self._since.items()):
            message = self._held.get(token)
            if message is None:
                self._since.pop(token, None)
            elif now - since >= period:
                try:
                    await message.in_progress()
                except Exception as exc:  # noqa: BLE001 (at worst a redelivery, a duplicate)
                    log.warning("could not extend a JetStream message's ack wait: %s", exc)
                    return

    def _take(self, message: Any) -> None:
        token = self._next_token = self._next_token + 1
        self._held[token] = message
        self._since[token] = time.monotonic()
        if not self.offer(topic_of(message.subject), bytes(message.data), token):
            self._held.pop(token, None)
            self._refused.append(message)

    async def _ensure(self, js: Any) -> None:
        """Create the stream and the consumer when missing (the same settings everywhere)."""
        try:
            await js.stream_info(self.stream)
        except NotFoundError:
            await js.add_stream(
                StreamConfig(name=self.stream, subjects=[SUBJECTS], num_replicas=self.replicas)
            )
            log.info("created JetStream stream %s (%d replicas)", self.stream, self.replicas)
        await js.add_consumer(
            self.stream,
            ConsumerConfig(
                durable_name=self.consumer,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self.ack_wait,
                max_ack_pending=self.inflight,
                num_replicas=self.replicas,
            ),
        )
