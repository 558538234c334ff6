"""The edge agent: readings in, privatized and encoded batches out over MQTT, nothing lost.

Life of a reading: a source yields it; the agent charges its epsilon against the budget (or
skips it at the cap, never perturbing it); up to ``batch`` readings wait in memory (at most
``interval`` seconds); then they are perturbed with the CSPRNG, encoded with the next
sequence number, and committed to the outbox together with the budget spend ("queued").
Only then is the batch published (QoS 1); it leaves the outbox on PUBACK ("confirmed by
the broker"). A crash before the commit loses the in-memory readings (never released);
after it, the same bytes are sent again on restart.

The agent stops (:class:`AgentError`, exit status 3) rather than spend budget in vain:

- another agent already runs this device id (``presence``: each announces itself on the
  device's presence topic, and a newcomer that finds another instance online refuses);
- the server that configured the stream withdraws its configuration (the stream was
  deleted) or reports ``unknown_stream`` on the device's notice topic. The halt is kept in
  the outbox, so a restart refuses too, until the stream is created anew (a new
  configuration) or ``zeal-edge resume`` clears it.

Other notices are logged and counted (``zeal-edge status``); a ``sequence_reset`` notice
(the outbox is new but the server knows the device) moves the sequence numbers past the
server's.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zeal import ParameterError, Zeal, encode_batch
from zeal.streamconfig import StreamConfig, read_config
from zeal.topics import Notice, Presence, TopicError, config_topic, notice_topic, presence_topic
from zeal_edge.budget import BudgetPolicy, micro_epsilon
from zeal_edge.errors import AgentError
from zeal_edge.mqtt import BrokerSettings, Connection, Message
from zeal_edge.outbox import DataDirLock, Halt, Outbox
from zeal_edge.pipeline import Pipeline
from zeal_edge.presence import DeviceClaim
from zeal_edge.sources import Reading, Source

__all__ = ["Agent", "AgentError", "AgentOptions", "Throttle", "config_topic"]

log = logging.getLogger("zeal_edge.agent")
_END = object()
#: Notices after which the agent stops: the server no longer has the stream.
FATAL = frozenset({"unknown_stream"})
#: How long a starting agent waits for the broker before it goes on offline (seconds).
PRESENCE_WAIT = 5.0
#: On a stop, how long to wait for the broker to confirm what is in flight (seconds).
DRAIN_WAIT = 5.0


class Throttle:
    """Lets a repeated log message through at most once per `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def ready(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e18) >= self.seconds:
            self._last[key] = now
            return True
        return False


@dataclass
class AgentOptions:
    """What the agent needs besides its connection (see settings.py for the meaning)."""

    stream: str
    device: str
    data_dir: Path
    batch: int = 60
    interval: float = 60.0
    params_file: Path | None = None
    budget: BudgetPolicy = field(default_factory=lambda: BudgetPolicy(None, 86400))
    wait_for_params: float = float("inf")
    #: Refuse a configuration whose privacy loss per reading (the realized epsilon where the
    #: sampler's is known, else the nominal one) exceeds this.
    max_epsilon: float = 5.0
    #: Adopt only the configuration with this parameter fingerprint (16 hex digits).
    pin: str | None = None


def refusal(config: StreamConfig, options: AgentOptions) -> str | None:
    """Why this agent must not adopt `config` (its pin, its epsilon ceiling), or None.

    Whoever can retain a configuration on the broker (a broker without ACLs, a leaked
    collector login) could otherwise hand agents epsilon 20 and read their readings off the
    wire. A refused configuration is never used: nothing is privatized with it.
    """
    fingerprint = config.params.fingerprint.hex()
    if options.pin is not None and fingerprint != options.pin:
        return (
            f"its fingerprint {fingerprint} is not the pinned {options.pin} (--pin): the "
            "stream's parameters changed, or someone else published them"
        )
    loss = max(config.params.epsilon, config.params.realized_epsilon or 0.0)
    if loss > options.max_epsilon:
        return (
            f"its privacy loss per reading, epsilon {loss:.6g}, exceeds this agent's ceiling "
            f"{options.max_epsilon:g} (--max-epsilon): raise the ceiling only if the "
            "operator really chose it"
        )
    return None


class Agent:
    """One device's agent. ``run(source)`` returns when the source ends and all is sent."""

    def __init__(
        self, options: AgentOptions, broker: BrokerSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.options = options
        self.clock = clock
        self.broker = broker
        self.lock = DataDirLock(options.data_dir, options.stream, options.device)
        try:
            self.outbox = Outbox(options.data_dir / "outbox.sqlite")
        except BaseException:
            self.lock.release()
            raise
        stream, device = options.stream, options.device
        self.namespace = self.outbox.ensure(stream, device)
        self.instance = self.outbox.instance(self.namespace)
        self.started_ms = self.now_ms()
        self.topics = {
            "config": config_topic(stream),
            "presence": presence_topic(stream, device),
            "notice": notice_topic(stream, device),
        }
        offline = Presence(self.instance, False, self.started_ms).to_json()
        self.connection = Connection(
            broker,
            client_id=f"zeal-edge-{stream}-{device}-{self.instance[:8]}",
            subscriptions=list(self.topics.values()),
            will=(self.topics["presence"], offline),
        )
        self.pipeline = Pipeline(self.outbox, self.connection)
        self.claim = DeviceClaim(
            self.connection,
            self.topics["presence"],
            instance=self.instance,
            started_ms=self.started_ms,
            name=f"device {device} of stream {stream}",
        )
        self.config: StreamConfig | None = None
        self._pending: list[Reading] = []
        self._pending_since = 0.0
        self._stop = threading.Event()
        self._throttle = Throttle(60)
        self._failure: AgentError | None = None
        self._refused: str | None = None
        self._invalid_booked = 0

    @property
    def params(self) -> Zeal | None:
        return None if self.config is None else self.config.params

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def stop(self) -> None:
        """Ask run() to flush what it holds and return (e.g. on SIGTERM)."""
        self._stop.set()

    def _fail(self, error: AgentError) -> None:
        if self._failure is None:
            self._failure = error
        self._stop.set()

    # -- messages from the broker -------------------------------------------------------

    def _take_messages(self) -> None:
        while not self.connection.messages.empty():
            message = self.connection.messages.get_nowait()
            if message.topic == self.topics["config"]:
                self._on_config(message)
            elif message.topic == self.topics["presence"]:
                conflict = self.claim.seen(message.payload)
                if conflict is not None:
                    self._fail(AgentError(conflict))
            elif message.topic == self.topics["notice"]:
                self._on_notice(message)
        if self.connection.taken_over.is_set():
            self._fail(
                AgentError(
                    f"another client connected to {self.broker.url} with this agent's client "
                    f"id and took its session over: is a second agent running device "
                    f"{self.options.device} of stream {self.options.stream} from a copy of "
                    f"the data directory {self.options.data_dir}? Stop one of them."
                )
            )

    def _on_config(self, message: Message) -> None:
        if self.options.params_file is not None:
            return  # --params given: the local document is the configuration
        if not message.payload:
            if self.config is not None:
                self._halt(
                    "stream_deleted",
                    f"the server withdrew the configuration of stream {self.options.stream} "
                    "from the broker: the stream was deleted",
                )
            return
        try:
            config = read_config(message.payload, stream=self.options.stream)
        except ParameterError as exc:
            log.error("ignoring stream configuration on %s: %s", message.topic, exc)
            return
        why = refusal(config, self.options)
        if why is not None:
            self._refused = f"refused the configuration on {message.topic}: {why}"
            log.error(
                "%s. %s",
                self._refused,
                "Still using the adopted one." if self.config else "Not reading or sending.",
            )
            return
        if self.config is not None and config.params != self.config.params:
            log.warning(
                "stream %s has new parameters (fingerprint %s); flushing and switching",
                self.options.stream,
                config.params.fingerprint.hex(),
            )
            self._flush()
        if self.config is None or config.identity != self.config.identity:
            log.info("stream parameters: %r (server %s)", config.params, config.server)
        self._use(config)

    def _use(self, config: StreamConfig) -> None:
        halt = self.outbox.halt(self.namespace)
        if halt is not None:
            if halt.identity == config.identity:
                self._fail(AgentError(_halted_text(self.options, halt)))
                return
            log.info(
                "stream %s was created anew since this agent stopped (%s): sending again",
                self.options.stream,
                halt.reason,
            )
            self.outbox.set_halt(self.namespace, None)
        self.config = config
        policy = self.options.budget
        self.outbox.set_policy(
            self.namespace,
            cost_micro=micro_epsilon(config.params.epsilon),
            cap_micro=policy.cap_micro,
            window_s=policy.window_s,
        )

    def _check_presence(self) -> None:
        """Announce the claim on the device id once its retained presence had time to come."""
        if self._failure is None and self.claim.due():
            self._take_messages()
            if self._failure is None:
                self.claim.announce()

    def _on_notice(self, message: Message) -> None:
        try:
            notice = Notice.from_json(message.payload)
        except TopicError as exc:
            log.warning("ignoring a notice on %s: %s", message.topic, exc)
            return
        ours = self.config.server if self.config else None
        if ours is not None and notice.server != ours:
            if self._throttle.ready(f"foreign-{notice.server}-{notice.reason}"):
                log.warning(
                    "server %s, which did not configure stream %s (server %s did), reports "
                    "%s: %s. Two servers share the broker; this agent follows %s.",
                    notice.server,
                    self.options.stream,
                    ours,
                    notice.reason,
                    notice.message,
                    ours,
                )
            return
        now = self.now_ms()
        if notice.reason == "sequence_reset":
            log.warning(
                "the server already knew device %s: %s. No reading is lost.",
                self.options.device,
                notice.message,
            )
            if notice.last_sequence is not None and self.outbox.advance_sequence(
                self.namespace, notice.last_sequence + 1
            ):
                log.info("sequence numbers continue at %d", notice.last_sequence + 1)
            return
        self.outbox.record_server_reject(self.namespace, notice.reason, now_ms=now)
        created = self.config.created_ms if self.config else None
        if created is not None and notice.time_ms < created:
            return  # about the stream of that name before it was created anew
        if notice.reason in FATAL and ours is not None:
            self._halt(notice.reason, f"the server rejected a batch: {notice.message}")
            return
        if self._throttle.ready(f"notice-{notice.reason}"):
            log.error(
                "the server rejected batch #%s (%s): %s (logged once a minute; counted in "
                "zeal-edge status)",
                notice.sequence,
                notice.reason,
                notice.message,
            )

    def _halt(self, reason: str, message: str) -> None:
        identity = self.config.identity if self.config else None
        halt = Halt(reason, message, self.now_ms(), identity)
        self.outbox.set_halt(self.namespace, halt)
        self._pending = []  # never perturbed: nothing spent on them
        self._fail(AgentError(_halted_text(self.options, halt)))

    # -- parameters and presence before reading ---------------------------------------

    def _load_params(self) -> None:
        if self.options.params_file is not None:
            try:
                text = self.options.params_file.read_text()
            except OSError as exc:
                raise ParameterError(
                    f"cannot read --params {self.options.params_file}: {exc}"
                ) from exc
            config = read_config(text, stream=self.options.stream)
            why = refusal(config, self.options)
            if why is not None:
                raise ParameterError(f"refusing --params {self.options.params_file}: {why}")
            self._use(config)
            log.info("stream parameters from %s: %r", self.options.params_file, self.params)
            return
        deadline = time.monotonic() + self.options.wait_for_params
        while self.config is None and not self._stop.is_set():
            if time.monotonic() > deadline:
                raise ParameterError(
                    f"no stream parameters arrived on {config_topic(self.options.stream)}"
                    + (f" that this agent accepts ({self._refused})" if self._refused else "")
                )
            if self._throttle.ready("params"):
                log.warning(
                    "waiting for stream parameters on %s at %s (no --params given): not "
                    "reading or sending until they arrive",
                    config_topic(self.options.stream),
                    self.broker.url,
                )
            self._step()
            time.sleep(0.1)

    def _await_presence(self) -> None:
        """Before reading anything, make sure no other agent runs this device id."""
        deadline = time.monotonic() + PRESENCE_WAIT
        while not self.claim.announced and not self._stop.is_set():
            if time.monotonic() > deadline:
                log.warning(
                    "no broker at %s yet: starting offline (batches wait in the outbox; the "
                    "device id is checked once connected)",
                    self.broker.url,
                )
                return
            self._step()
            time.sleep(0.05)

    def _step(self) -> None:
        self._pump()
        self._take_messages()
        self._check_presence()

    def _pump(self) -> None:
        """Publish what waits, and say which batches the broker confirmed."""
        confirmed = sorted(seq for _, seq in self.pipeline.pump())
        if confirmed:
            which = (
                f"batch #{confirmed[0]}"
                if len(confirmed) == 1
                else f"{len(confirmed)} batches, #{confirmed[0]} to #{confirmed[-1]}"
            )
            log.info("confirmed by the broker: %s", which)

    # -- batches ----------------------------------------------------------------------------

    def _admit(self, reading: Reading) -> None:
        """Charge a reading against the budget, or skip it at the cap (never perturbed)."""
        assert self.params is not None
        cost = micro_epsilon(self.params.epsilon)
        policy = self.options.budget
        if policy.cap_micro is not None:
            now = self.now_ms()
            spent = self.outbox.spent(self.namespace, now_ms=now, window_s=policy.window_s)
            pending = cost * len(self._pending)
            if not policy.allows(spent + pending, cost):
                self.outbox.record_skips(self.namespace, 1, now_ms=now)
                if self._throttle.ready("budget"):
                    log.warning(
                        "privacy budget cap reached: %.6f of %.6f epsilon spent in the last %d s; "
                        "readings are neither perturbed nor sent until the window allows",
                        (spent + pending) / 1e6,
                        policy.cap_micro / 1e6,
                        policy.window_s,
                    )
                return
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(reading)

    def _flush(self) -> None:
        """Perturb, encode and commit the readings held in memory as one batch."""
        if not self._pending or self.params is None or self._failure is not None:
            return
        readings, self._pending = self._pending, []
        now = self.now_ms()
        stamps, last = [], 0
        for r in readings:
            last = max(last, r.timestamp_ms if r.timestamp_ms is not None else now)
            stamps.append(last)  # a clock that steps back is held level within a batch
        codes = self.params.perturb(np.array([r.value for r in readings]))
        sequence = self.outbox.next_sequence(self.namespace)
        payload = encode_batch(
            self.params,
            stream=self.options.stream,
            device=self.options.device,
            sequence=sequence,
            timestamps=stamps,
            codes=codes,
        )
        offsets = [r.offset for r in readings if r.offset is not None]
        self.outbox.commit_batches(
            [
                (
                    self.namespace,
                    sequence,
                    payload,
                    len(readings),
                    micro_epsilon(self.params.epsilon) * len(readings),
                    offsets[-1] if offsets else None,
                )
            ],
            now_ms=now,
            fingerprint=self.params.fingerprint.hex(),
        )
        self.pipeline.committed([(self.namespace, sequence)])
        waiting = self.pipeline.unacknowledged
        log.info(
            "batch #%d: %d readings, %d bytes, queued (%d batch%s awaiting the broker%s)",
            sequence,
            len(readings),
            len(payload),
            waiting,
            "" if waiting == 1 else "es",
            "" if self.connection.connected else f"; not connected to {self.broker.url}",
        )

    def _book_invalid(self, source: Source) -> None:
        skipped = getattr(source, "skipped", 0)
        if skipped > self._invalid_booked:
            self.outbox.record_invalid(self.namespace, skipped - self._invalid_booked)
            self._invalid_booked = skipped

    # -- main loop --------------------------------------------------------------------------

    def run(self, source_factory: Callable[[int], Source], *, linger: bool = True) -> int:
        """Send everything the source yields; return 0 once it ends and all is acknowledged.

        ``source_factory(offset)`` opens the source, skipping ``offset`` already-sent rows.
        Raises AgentError when the agent must stop (see the module docstring).
        """
        if self.outbox.is_new(self.namespace):
            log.info(
                "new outbox for stream %s, device %s in %s: sequence numbers start at 0",
                self.options.stream,
                self.options.device,
                self.options.data_dir,
            )
        self.connection.start()
        source: Source | None = None
        try:
            self._load_params()
            self._await_presence()
            if self._stop.is_set():
                return self._finish()
            source = source_factory(self.outbox.source_offset(self.namespace))
            log.info(
                "reading %s for stream %s as device %s",
                source.description,
                self.options.stream,
                self.options.device,
            )
            inbox: queue.Queue[Any] = queue.Queue(maxsize=10_000)
            reader = threading.Thread(
                target=_read_into,
                args=(source, inbox, self._stop),
                name="zeal-edge-source",
                daemon=True,
            )
            reader.start()
            ended = False
            while not self._stop.is_set():
                try:
                    item = inbox.get(timeout=0.05)
                except queue.Empty:
                    item = None
                self._take_messages()
                self._check_presence()
                if item is _END:
                    ended = True
                elif isinstance(item, Reading) and self._failure is None:
                    self._admit(item)
                full = len(self._pending) >= self.options.batch
                stale = (
                    self._pending
                    and time.monotonic() - self._pending_since >= self.options.interval
                )
                if full or stale or (ended and self._pending):
                    self._flush()
                self._book_invalid(source)
                self._pump()
                self._warn_if_waiting()
                if (
                    ended
                    and not self._pending
                    and (not linger or self.pipeline.unacknowledged == 0)
                ):
                    return self._finish()
            self._flush()
            return self._finish()
        finally:
            if source is not None:
                self._book_invalid(source)
            self._close()

    def _warn_if_waiting(self) -> None:
        if self.connection.connected or not self.pipeline.unacknowledged:
            return
        if self._throttle.ready("waiting"):
            log.warning(
                "not connected to the broker at %s: %d batches wait in the outbox",
                self.broker.url,
                self.pipeline.unacknowledged,
            )

    def _finish(self) -> int:
        """Give in-flight batches a moment to be confirmed, say what is left, or raise."""
        deadline = time.monotonic() + DRAIN_WAIT
        while (
            self.pipeline.unacknowledged
            and self.connection.connected
            and self._failure is None
            and time.monotonic() < deadline
        ):
            self._pump()
            time.sleep(0.02)
        self._pump()
        if self._failure is not None:
            raise self._failure
        return 0

    def _close(self) -> None:
        left = self.outbox.pending(self.namespace, limit=1_000_000)
        if left:
            log.warning(
                "stopping with %d batches (%d readings) not confirmed by the broker: they stay "
                "in %s and are sent on the next start",
                len(left),
                sum(b.readings for b in left),
                self.outbox.path,
            )
        else:
            log.info("stopping: every batch was confirmed by the broker")
        self.claim.release(self.now_ms())
        self.connection.stop()
        self.outbox.close()
        self.lock.release()


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _halted_text(options: AgentOptions, halt: Halt) -> str:
    fetch = (
        f" (with --params: save the new stream's configuration to {options.params_file})"
        if options.params_file is not None
        else ""
    )
    return (
        f"stream {options.stream} is no longer accepted by its server ({halt.reason}, since "
        f"{_when(halt.since_ms)}): {halt.message}. Stopped: no further reading of device "
        f"{options.device} is privatized or sent. Started again, the agent sends once the "
        f"stream has been created anew{fetch}; `zeal-edge resume --data-dir "
        f"{options.data_dir}` clears the halt at once."
    )


def _read_into(source: Source, inbox: queue.Queue[Any], stop: threading.Event) -> None:
    try:
        for reading in source:
            while not stop.is_set():
                try:
                    inbox.put(reading, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
    except Exception:
        log.exception("source failed")
    finally:
        inbox.put(_END)


def install_signal_handlers(agent: Agent) -> None:
    """SIGTERM, SIGINT and SIGHUP flush the readings in memory and stop the agent cleanly."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: agent.stop())
