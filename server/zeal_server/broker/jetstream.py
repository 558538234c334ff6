"""Data from NATS JetStream instead of an MQTT subscription (``ZEAL_NATS_URL``).

Devices publish MQTT (3.1.1, QoS 1) to any node of a NATS cluster. NATS's MQTT listener
stores every QoS 1 PUBLISH in its own JetStream stream, ``$MQTT_msgs`` (subject
``$MQTT.msgs.`` + the NATS subject, here ``zeal.v1.{stream}.{device}.up``; replicated as
its ``mqtt { stream_replicas }`` says), before it sends the PUBACK. Every collector pulls
from one durable consumer of that stream (``ZEAL_NATS_CONSUMER``) that they share: JetStream
hands each message to one of them, and redelivers what is not acknowledged within
``ZEAL_NATS_ACK_WAIT`` seconds (a collector that died); through a database stall the
collector keeps extending the wait of what it holds (``in_progress``). A collector
acknowledges a message only after the transaction that stored it committed; a redelivered
message that had been stored is a duplicate to the store (``store.sequences``), so nothing is
stored twice. The stream keeps a message while a consumer has yet to acknowledge it
(interest retention).

The consumer takes the whole stream, not a filter of the data subjects (a filtered one
starved the collectors sharing it): a message on another topic (a notice, a presence) is
acknowledged as it comes and counted (``skipped``). A consumer an earlier release filtered
is widened to ``>`` in place (:meth:`JetStreamSource._widened_filter`). NATS's own
``$MQTT_msgs`` is read, not a stream of ours: NATS acknowledges a device's publish once
``$MQTT_msgs`` has it, and a stream of ours loses what arrives while it elects a leader.
deploy/SCALING.md has the measurements behind both choices.

The collector logs in to NATS with its broker login (``ZEAL_MQTT_USERNAME``, ``_PASSWORD``),
which on a NATS deployment is one login for both (deploy/nats/users.conf.example).
nats-py is asyncio; it runs in a thread of its own, which asks for messages only while the
collector's queue has room (at most ``ZEAL_COLLECTOR_INFLIGHT`` unacknowledged, which is
also the consumer's ``max_ack_pending``) and acknowledges on the writer's behalf. It asks
with JetStream's pull requests itself (:class:`Pulls`), two in flight, and takes what they
bring in a subscription callback: nats-py's ``fetch`` spends a task and a timer on each
message, 60 µs a message against 15 this way (deploy/SCALING.md), which capped one
collector below what its writer stores.

NATS subjects cannot carry a ``.`` inside a name (it separates tokens), so a server with
``ZEAL_NATS_URL`` refuses stream and device names with one (:func:`name_problem`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, Header
from nats.js.errors import NotFoundError

from zeal.mqtt.topics import parse_data_topic
from zeal_server.broker import door
from zeal_server.broker.door import RejectBudget
from zeal_server.broker.sources import Offer, Translator

__all__ = ["MQTT_STREAM", "JetStreamSource", "Pulls", "topic_of"]

log = logging.getLogger(__name__)

#: NATS's own stream of the QoS 1 messages its MQTT listener received.
MQTT_STREAM = "$MQTT_msgs"
#: Its subjects: this prefix and the NATS subject of the MQTT topic.
MQTT_PREFIX = "$MQTT.msgs."
#: The API subject of a pull request to a consumer of ``$MQTT_msgs``, less its name.
PULL_SUBJECT = f"$JS.API.CONSUMER.MSG.NEXT.{MQTT_STREAM}."
#: At most this many messages per pull request, and twice as many asked for at once: the
#: server fills one request while the messages of the other are being taken.
FETCH_MAX = 1000
ASKED_MAX = 2 * FETCH_MAX
#: How long a pull request waits on the server for messages (seconds). One sent longer ago
#: than this and PULL_GRACE has ended on the server, whether or not its end was heard.
PULL_EXPIRES = 1.0
PULL_GRACE = 1.0
#: The headers of a status message (``Header``'s values, as nats-py keys them).
STATUS, DESCRIPTION = Header.STATUS.value, Header.DESCRIPTION.value
PENDING = "Nats-Pending-Messages"


def topic_of(subject: str) -> str:
    """The MQTT topic a subject of ``$MQTT_msgs`` came from (no name holds a '.', see
    name_problem)."""
    return subject.removeprefix(MQTT_PREFIX).replace(".", "/")


class Pulls:
    """How many messages the pull requests in flight may still bring.

    JetStream sends a request's messages with no mark of which request they answer, and
    says nothing when one is filled; it says how many one did not bring when the request
    expires (408) or is given up (409, ``Nats-Pending-Messages``). So the count goes up by
    each request's batch, down by each message and by what a status says was not brought,
    and to zero once the last request sent has surely ended on the server (a status not
    heard, after a reconnection say, costs a pause, never a message)."""

    def __init__(self) -> None:
        self.asked = 0
        self.sent_at = -1e18  # when the last request was sent (monotonic seconds)
        self.ends = 0  # statuses heard: requests that ended before they were filled

    def next_batch(self, room: int, now: float) -> int:
        """How many to ask for in a request now, 0 for none: up to min(room, ASKED_MAX) in
        flight (room: what the collector can still hold), asked again once half is in."""
        if self.asked and now - self.sent_at > PULL_EXPIRES + PULL_GRACE:
            self.asked = 0
        cap = min(room, ASKED_MAX)
        want = cap - self.asked
        if want < 1 or want < cap // 2:
            return 0
        return min(FETCH_MAX, want)

    def sent(self, batch: int, now: float) -> None:
        self.asked += batch
        self.sent_at = now

    def delivered(self) -> None:
        if self.asked:
            self.asked -= 1

    def ended(self, headers: dict[str, str]) -> None:
        """A status message: take off what its request will not bring."""
        self.ends += 1
        pending = headers.get(PENDING, "")
        if pending.isdigit():
            self.asked = max(0, self.asked - int(pending))

    def forget(self) -> None:
        self.asked = 0


class JetStreamSource:
    """Pulls data messages for the collector and acknowledges them after its commits (a
    ``sources.Source``). ``room()`` says how many more the collector can hold."""

    #: Its senders are devices on Zeal's broker; its messages are their batches as sent.
    reaches_devices = True
    stamps_logins = False
    translator: Translator | None = None

    def __init__(
        self,
        servers: list[str],
        *,
        consumer: str,
        inflight: int,
        ack_wait: float,
        name: str,
        login: tuple[str, str | None] | None = None,
    ) -> None:
        self.servers, self.consumer = servers, consumer
        self.inflight, self.client_name = inflight, name
        self.name = "jetstream"
        self.ack_wait, self.login = ack_wait, login
        self.connected = False
        self.last_error: str | None = None
        self.other_topics = 0  # messages of $MQTT_msgs on other topics than the data topics
        self._held: dict[int, tuple[Any, float]] = {}  # token -> (nats Msg, when fetched)
        self._refused: list[Any] = []  # shed at the door: acknowledged after the fetch
        self._logged = -1e18  # connection errors are logged once a minute
        self._last_progress = time.monotonic()
        self._next_token = 0
        self._pulls = Pulls()
        self._failure: str | None = None  # why the consumer cannot be asked (a status)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeal-jetstream", daemon=True)
        self.offer: Offer = lambda *_, **__: False
        self.room: Callable[[], int] = lambda: 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:  # also ends a connect still retrying
            loop.call_soon_threadsafe(task.cancel)
        self._thread.join(timeout=15)

    @property
    def ready(self) -> bool:
        return self.connected

    def skipped(self) -> dict[str, int]:
        return {"other_topic": self.other_topics}

    def refusal(self, topic: str, *, retained: bool, size: int, budget: RejectBudget) -> str | None:
        """A device's batch: the door's checks (``door.refusal``)."""
        return door.refusal(topic, retained=retained, size=size, budget=budget)

    def ack(self, messages: list[tuple[int, int]]) -> None:
        """Acknowledge these (token, qos) pairs (writer thread, after the commit)."""
        loop = self._loop
        held = (self._held.pop(token, None) for token, _qos in messages)
        messages = [message for message, _fetched in filter(None, held)]
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
                self.last_error = self._describe(exc)
                log.error("%s; retrying in 2 s", self.last_error)
                await asyncio.sleep(2)

    async def _consume(self) -> None:
        user, password = self.login or (None, None)
        client = await nats.connect(
            servers=self.servers,
            user=user,
            password=password,
            name=self.client_name,
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
            inbox = client.new_inbox()
            await client.subscribe(inbox, cb=self._delivered)
            subject = PULL_SUBJECT + self.consumer
            self._pulls.forget()
            self._failure = None
            self.connected, self.last_error = True, None
            log.info("collector %s pulls from JetStream %s", self.client_name, MQTT_STREAM)
            while not self._stop.is_set():
                if self._failure is not None:
                    raise RuntimeError(self._failure)
                await self._still_working()
                refused, self._refused = self._refused, []
                await self._ack_all(refused)
                now = time.monotonic()
                batch = self._pulls.next_batch(self.room(), now)
                if batch:
                    expires = int(PULL_EXPIRES * 1e9)
                    request = json.dumps({"batch": batch, "expires": expires}).encode()
                    await client.publish(subject, request, reply=inbox)
                    self._pulls.sent(batch, now)
                else:  # what is asked for arrives meanwhile, in _delivered
                    await asyncio.sleep(0.01)
        finally:
            self.connected = False
            await client.close()

    async def _delivered(self, message: Any) -> None:
        """A message of a pull request (nats-py's subscription task), or a status that ends
        one: 408 when it expired, 409 when the server gave it up (both say how many it did
        not bring), 503 when there is no consumer to ask (deleted: made again on
        reconnecting)."""
        headers = message.headers
        status = headers.get(STATUS) if headers else None
        if status is None:
            self._pulls.delivered()
            self._take(message)
            return
        self._pulls.ended(headers)
        description = str(headers.get(DESCRIPTION, "")).strip()
        if status == "503" or (status == "409" and "deleted" in description.lower()):
            self._failure = f"JetStream consumer {self.consumer}: {status} {description}"

    def _describe(self, exc: Exception) -> str:
        return f"NATS {','.join(self.servers)}: {type(exc).__name__}: {exc}"

    async def _error(self, exc: Exception) -> None:
        """nats-py's errors (it retries by itself): kept for /readyz, logged once a minute."""
        self.last_error = self._describe(exc)
        now = time.monotonic()
        if now - self._logged >= 60:
            self._logged = now
            log.error("%s; retrying (logged once a minute)", self.last_error)

    async def _disconnected(self) -> None:
        self.connected = False

    async def _reconnected(self) -> None:
        self.connected, self.last_error = True, None
        self._pulls.forget()  # the requests of the old connection are not heard of again
        log.info("collector %s reconnected to NATS", self.client_name)

    async def _still_working(self) -> None:
        """Every third of the ack wait, tell JetStream that the messages held longer than
        that are still being stored (``in_progress``): a database stall longer than the
        ack wait then costs no redelivery (copies the writer would store as duplicates)."""
        now = time.monotonic()
        period = self.ack_wait / 3
        if now - self._last_progress < period:
            return
        self._last_progress = now
        for message, since in list(self._held.values()):
            if now - since >= period:
                try:
                    await message.in_progress()
                except Exception as exc:  # noqa: BLE001 (at worst a redelivery, a duplicate)
                    log.warning("could not extend a JetStream message's ack wait: %s", exc)
                    return

    def _take(self, message: Any) -> None:
        topic = topic_of(message.subject)
        if parse_data_topic(topic) is None:  # a notice, a presence: not the collector's
            self.other_topics += 1
            self._refused.append(message)
            return
        token = self._next_token = self._next_token + 1
        self._held[token] = (message, time.monotonic())
        if not self.offer(topic, bytes(message.data), token, 1, retained=False):
            self._held.pop(token, None)
            self._refused.append(message)

    async def _ensure(self, js: Any) -> None:
        """Create the consumer when missing (the same settings by every collector). NATS
        creates ``$MQTT_msgs`` when the first MQTT client connects (the collector's own
        connection does, as it starts): it is waited for, up to half a minute."""
        for _ in range(60):
            try:
                await js.stream_info(MQTT_STREAM)
                break
            except NotFoundError:
                await asyncio.sleep(0.5)
        else:
            raise RuntimeError(
                f"NATS has no {MQTT_STREAM} stream: its MQTT listener (an mqtt block in the "
                "server's configuration) creates it when the first MQTT client connects"
            )
        await js.add_consumer(
            MQTT_STREAM,
            ConsumerConfig(
                durable_name=self.consumer,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=self.ack_wait,
                max_ack_pending=self.inflight,
                filter_subject=await self._widened_filter(js),
            ),
        )

    async def _widened_filter(self, js: Any) -> str | None:
        """None (no filter) for a new consumer; ``>`` (every subject) for one that has a
        filter, as an earlier release made it. Updating a filter away on an interest
        stream makes NATS 2.15.1 deliver nothing more, and drop what is then published
        as wanted by no consumer (tests/server/broker/test_cluster.py); widening it to ``>`` loses
        nothing."""
        try:
            config = (await js.consumer_info(MQTT_STREAM, self.consumer)).config
        except NotFoundError:
            return None
        return ">" if config.filter_subject or config.filter_subjects else None
