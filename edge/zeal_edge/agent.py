"""The edge agent: readings in, privatized and encoded batches out over MQTT, nothing lost.

Life of a reading: a source yields it; the agent charges its epsilon against the stream's
policy per UTC day and its own cap (or skips it, never perturbing it); up to ``batch``
readings wait in memory (at most ``interval`` s); then they are perturbed with the CSPRNG,
encoded with the next sequence number, and committed to the outbox with the spend ("queued").
Only then is the batch published (QoS 1); it leaves the outbox on PUBACK ("confirmed by
the broker"). A crash before the commit loses the in-memory readings (never released);
after it, the same bytes are sent again on restart. The agent stops (:class:`AgentError`,
exit status 3) rather than spend budget in vain when another agent already runs this
device id (``zeal_edge.presence``). It *halts* when its server, in messages signed with
its key, deletes the stream or reports that it no longer has it (``zeal_edge.notices``),
or gives it a configuration it must not follow (the stream created anew, a policy above
its ceiling: ``zeal_edge.configs``). The halt is kept in the outbox. With ``--on-halt
exit`` (the default) the agent then stops, and a restart refuses too, until ``zeal-edge
resume`` clears it; with ``--on-halt wait`` it stays connected, privatizing and reading
nothing, until its server signs a configuration it may follow (``zeal-server streams
release``), and then goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from zeal import ParameterError, Zeal
from zeal.mqtt.streamconfig import StreamConfig, is_tombstone
from zeal.mqtt.topics import (
    CONFIG_FILTER,
    Presence,
    config_topic,
    notice_topic,
    parse_config_topic,
    presence_topic,
)
from zeal_edge.budget import micro_epsilon
from zeal_edge.configs import NO_KEY, ConfigDesk
from zeal_edge.datadir import DataDirLock
from zeal_edge.device import DeviceLedger
from zeal_edge.devicecaps import CapsDesk, is_caps
from zeal_edge.errors import AgentError, UnservedStreamError
from zeal_edge.holding import Holding
from zeal_edge.mqtt import BrokerSettings, Connection, Message
from zeal_edge.notices import NoticeDesk
from zeal_edge.options import (
    AgentOptions,
    Throttle,
    config_from_file,
    halt_cause,
    halted_text,
)
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Batcher, Pipeline, which_batches
from zeal_edge.presence import DeviceClaim
from zeal_edge.records import Halt
from zeal_edge.sources import END, Reading, Source, read_into

__all__ = ["Agent"]

log = logging.getLogger(__name__)
#: How long a starting agent waits for the broker before it goes on offline (seconds).
PRESENCE_WAIT = 5.0
#: Seconds after subscribing before a stream that no server retains is called unserved.
UNSERVED_WAIT = 5.0
#: On a stop, how long to wait for the broker to confirm what is in flight (seconds).
DRAIN_WAIT = 5.0


class Agent:
    """One device's agent. ``run(source)`` returns when the source ends and all is sent."""

    def __init__(
        self,
        options: AgentOptions,
        broker: BrokerSettings,
        clock: Callable[[], float] = time.time,
        ledger: DeviceLedger | None = None,
    ) -> None:
        """`ledger`: the device's ledger across streams, shared by the agents of its other
        streams in this process (zeal_edge.device); by default one for this stream alone."""
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
        # Every stream's retained configuration, not only this one's: the streams the
        # servers serve, so that a stream on none of them is said instead of awaited.
        subscriptions = [CONFIG_FILTER, self.topics["presence"], self.topics["notice"]]
        offline = Presence(self.instance, False, self.started_ms).to_json()
        self.connection = Connection(
            broker,
            client_id=f"zeal-edge-{stream}-{device}-{self.instance[:8]}",
            subscriptions=subscriptions,
            will=(self.topics["presence"], offline),
        )
        self.pipeline = Pipeline(self.outbox, self.connection)
        self.batcher = Batcher(self.outbox, self.pipeline)
        self.claim = DeviceClaim(
            self.connection,
            self.topics["presence"],
            instance=self.instance,
            started_ms=self.started_ms,
            name=f"device {device} of stream {stream}",
        )
        self.config: StreamConfig | None = None
        #: The halt the agent waits in (--on-halt wait), or None.
        self.parked: Halt | None = None
        self._stop = threading.Event()
        self._throttle = Throttle(60)
        if ledger is None:
            ledger = DeviceLedger(
                self.outbox,
                options.device,
                options.device_max_epsilon_per_day,
                [options.stream],
                rolling=options.device_rolling_caps,
            )
        self.holding = Holding(self.outbox, self.namespace, options, self._throttle, ledger)
        self.configs = ConfigDesk(self.outbox, self.namespace, options, self._throttle)
        self.notices = NoticeDesk(
            self.outbox, self.namespace, options, self._throttle, self.configs
        )
        self.caps = CapsDesk(self.notices, ledger)
        self._failure: AgentError | None = None
        self._invalid_booked = 0
        self._clipped_told: set[str] = set()
        #: The streams whose configuration a server retains (by name, with their server).
        self.served: dict[str, str] = {}
        self._subscribed_at: float | None = None
        self._served_told = False

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
            elif (other := parse_config_topic(message.topic)) is not None:
                self._on_other_config(other, message)
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
        verdict = self.configs.offer(message, self.config, self.parked)
        if verdict.refused is not None:
            if self.options.on_halt == "wait":
                log.error("%s. Waiting for a configuration this agent may follow.", verdict.refused)
                return
            self._fail(AgentError(f"{verdict.refused}. Nothing was read or sent."))
            return
        if verdict.halt is not None:
            self._halt(*verdict.halt)
            return
        config = verdict.config
        if config is None:
            return
        if verdict.resumed:
            self.parked = None
            log.warning("stream %s: released; reading and sending again", self.options.stream)
        if self.config is not None and config.params != self.config.params:
            log.warning(
                "stream %s has new parameters from its server (fingerprint %s, policy %s "
                "epsilon per day); flushing and switching",
                self.options.stream,
                config.params.fingerprint.hex(),
                config.params.max_epsilon_per_day,
            )
            self._flush()
        if self.config is None or config.identity != self.config.identity:
            log.info("stream parameters: %r (server %s)", config.params, config.server)
        self._use(config)

    def _on_other_config(self, stream: str, message: Message) -> None:
        """Note which streams servers serve (an empty retained message: none)."""
        if not message.payload:
            self.served.pop(stream, None)
            return
        try:
            document = json.loads(message.payload)
            server = document.get("server")
        except (ValueError, AttributeError):
            return
        if is_tombstone(document):
            self.served.pop(stream, None)
            return
        self.served[stream] = str(server)

    def _use(self, config: StreamConfig) -> None:
        """Adopt a configuration (ConfigDesk's, or --params'), unless the agent is halted."""
        halt = self.outbox.halt(self.namespace)
        if halt is not None:
            self._stay_halted(halt)
            return
        self.config, policy = config, self.options.budget
        self.outbox.set_policy(
            self.namespace,
            cost_micro=micro_epsilon(config.params.epsilon),
            cap_micro=policy.cap_micro,
            window_s=policy.window_s,
            max_epsilon_per_day=config.params.max_epsilon_per_day,
        )

    def _check_presence(self) -> None:
        """Announce the claim on the device id once its retained presence had time to come."""
        if self._failure is None and self.claim.due():
            self._take_messages()
            if self._failure is None:
                self.claim.announce()

    def _on_notice(self, message: Message) -> None:
        if is_caps(message):  # its device's caps (zeal_edge.devicecaps)
            self.caps.handle(message, self.config, self.now_ms())
            return
        halt = self.notices.handle(message, self.config, self.now_ms())
        if halt is not None:
            self._halt(*halt)

    def _halt(self, reason: str, message: str) -> None:
        identity = self.config.identity if self.config else None
        halt = Halt(reason, message, self.now_ms(), identity)
        self.outbox.set_halt(self.namespace, halt)
        self.holding.drop()  # never perturbed: nothing spent on them
        self._stay_halted(halt)

    def _stay_halted(self, halt: Halt) -> None:
        """Stop (--on-halt exit), or wait for the server to release the stream."""
        if self.options.on_halt != "wait" or self.options.params_file is not None:
            self._fail(AgentError(halted_text(self.options, halt)))
            return
        if self.parked is None:
            log.error(
                "%s Waiting (--on-halt wait): nothing is read or privatized until its server "
                "signs a configuration this agent may follow (zeal-server streams release "
                "%s), or zeal-edge resume clears the halt here.",
                halt_cause(self.options, halt),
                self.options.stream,
            )
        self.parked = halt

    # -- parameters and presence before reading ---------------------------------------

    def _load_params(self) -> None:
        if (
            self.options.params_file is None
            and self.configs.trusted_key() is None
            and not self.options.trust_first_use
        ):
            raise ParameterError(f"refusing to start stream {self.options.stream}: {NO_KEY}")
        if self.options.params_file is not None:
            config = config_from_file(self.options)
            if config.key is not None and self.outbox.server_key(self.namespace) is None:
                self.outbox.set_server_key(self.namespace, config.key)  # for the notices
            self._use(config)
            log.info("stream parameters from %s: %r", self.options.params_file, self.params)
            return
        deadline = time.monotonic() + self.options.wait_for_params
        while self.config is None and not self._stop.is_set():
            if self.parked is not None:  # halted: waits for its server's release, unbounded
                self._step()
                time.sleep(0.1)
                continue
            if time.monotonic() > deadline:
                raise ParameterError(
                    f"no stream parameters arrived on {config_topic(self.options.stream)}"
                    + (
                        f" that this agent accepts ({refused})"
                        if (refused := self.configs.refused)
                        else ""
                    )
                )
            self._check_served()
            if self._throttle.ready("params"):
                log.warning(
                    "waiting for stream parameters on %s at %s (no --params given): not "
                    "reading or sending until they arrive%s",
                    config_topic(self.options.stream),
                    self.broker.url,
                    ""
                    if self.served
                    else " (no server retains any stream's configuration there yet)",
                )
            self._step()
            time.sleep(0.1)

    def _check_served(self) -> None:
        """A stream that no server serves, while others are, is a wrong name or a deleted
        stream: said once, naming the streams served, and the agent ends (non-zero) unless
        it was told to wait (--wait). Decided UNSERVED_WAIT s after the subscription, when
        the retained configurations have arrived."""
        if self.options.wait or self._served_told or not self.served:
            return
        if self._subscribed_at is None:
            if self.connection.subscribed:
                self._subscribed_at = time.monotonic()
            return
        if time.monotonic() - self._subscribed_at < UNSERVED_WAIT:
            return
        self._served_told = True
        self._fail(
            UnservedStreamError(
                f"no server at {self.broker.url} serves stream {self.options.stream!r}; the "
                f"streams served there: {', '.join(sorted(self.served))}. Check the name, or "
                "run with --wait to wait for the stream to be created"
            )
        )

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
        confirmed = self.pipeline.pump()
        if confirmed:
            log.info("confirmed by the broker: %s", which_batches(confirmed))

    # -- batches ----------------------------------------------------------------------------

    def _flush(self) -> None:
        """Perturb, encode and commit the readings held in memory as one batch."""
        if self.params is None or self._failure is not None or self.parked is not None:
            return
        now = self.now_ms()
        draft = self.holding.release(self.params, now_ms=now)
        if draft is None:
            return
        (sealed,) = self.batcher.commit(self.params, [draft], now_ms=now)
        self._book_clipped(*self.holding.clipped)
        waiting = self.pipeline.unacknowledged
        log.info(
            "batch #%d: %d readings, %d bytes, queued (%d batch%s awaiting the broker%s)",
            sealed.sequence,
            sealed.readings,
            len(sealed.payload),
            waiting,
            "" if waiting == 1 else "es",
            "" if self.connection.connected else f"; not connected to {self.broker.url}",
        )

    def _book_clipped(self, low: int, high: int) -> None:
        """Count readings outside the stream's range, and say so the first time on each side:
        Zeal.perturb sends them as the range's nearer end (docs/edge-agent.md)."""
        if not (low or high) or self.params is None:
            return
        self.outbox.record_clipped(self.namespace, low, high)
        for side, count, end in (("below", low, "lower"), ("above", high, "upper")):
            if count and side not in self._clipped_told:
                self._clipped_told.add(side)
                log.warning(
                    "stream %s: readings %s its range [%g, %g] are sent as its %s end "
                    "(counted in zeal-edge status; this is said once per side)",
                    self.options.stream,
                    side,
                    self.params.lower,
                    self.params.upper,
                    end,
                )

    def _book_invalid(self, source: Source, *, final: bool = False) -> None:
        skipped = getattr(source, "skipped", 0)
        if skipped > self._invalid_booked:
            self.outbox.record_invalid(self.namespace, skipped - self._invalid_booked)
            self._invalid_booked = skipped
        self.holding.book_skips(final=final)

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
            halt = self.outbox.halt(self.namespace)
            if halt is not None:  # a halt of an earlier run: refused, or waited in
                self._stay_halted(halt)
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
                target=read_into,
                args=(source, inbox, self._stop),
                name="zeal-edge-source",
                daemon=True,
            )
            reader.start()
            ended = False
            while not self._stop.is_set():
                ended = self._tick(inbox, source, ended=ended)
                drained = not linger or self.pipeline.unacknowledged == 0
                if ended and not self.holding and drained:
                    return self._finish()
            self._flush()
            return self._finish()
        finally:
            if source is not None:
                self._book_invalid(source, final=True)
            self._close()

    def _tick(self, inbox: queue.Queue[Any], source: Source, *, ended: bool) -> bool:
        """One turn of the loop: take a reading (or the source's end) and the broker's
        messages, batch what is due, publish; True once the source has ended."""
        item = None
        if self.parked is not None:  # halted: the source waits, nothing is read
            self._stop.wait(0.05)
        else:
            with contextlib.suppress(queue.Empty):
                item = inbox.get(timeout=0.05)
        self._take_messages()
        self._check_presence()
        ended = ended or item is END
        if isinstance(item, Reading) and self._failure is None and self.params is not None:
            self.holding.admit(item, self.params, now_ms=self.now_ms())
        if self.holding.due(ended=ended):
            self._flush()
        self._book_invalid(source)
        self._pump()
        self._warn_if_waiting()
        return ended

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
        elif any(st.namespace == self.namespace and st.sent_batches for st in self.outbox.status()):
            log.info("stopping: every batch was confirmed by the broker")
        else:
            log.info("stopping: nothing was sent")
        self.claim.release(self.now_ms())
        self.connection.stop()
        self.outbox.close()
        self.lock.release()
