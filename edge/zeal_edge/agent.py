"""The edge agent: readings in, privatized and encoded batches out over MQTT, nothing lost.

Life of a reading: a source yields it; the agent charges its epsilon against the budget (or
skips it at the cap, never perturbing it); up to ``batch`` readings wait in memory (at most
``interval`` seconds); then they are perturbed with the CSPRNG, encoded with the next
sequence number, and committed to the outbox together with the budget spend. Only then is
the batch published (QoS 1); it leaves the outbox on PUBACK. A crash before the commit loses
the in-memory readings (never released); after it, the same bytes are sent again on restart.
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
from zeal.streamconfig import params_from_config
from zeal_edge.budget import BudgetPolicy, micro_epsilon
from zeal_edge.mqtt import BrokerSettings, Connection
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Pipeline
from zeal_edge.sources import Reading, Source

__all__ = ["Agent", "AgentOptions", "Throttle", "config_topic"]

log = logging.getLogger("zeal_edge.agent")
_END = object()


def config_topic(stream: str) -> str:
    """Where a stream's parameters are retained."""
    return f"zeal/v1/{stream}/config"


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


class Agent:
    """One device's agent. ``run(source)`` returns when the source ends and all is sent."""

    def __init__(
        self, options: AgentOptions, broker: BrokerSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.options = options
        self.clock = clock
        self.outbox = Outbox(options.data_dir / "outbox.sqlite")
        self.namespace = self.outbox.ensure(options.stream, options.device)
        self.connection = Connection(
            broker,
            client_id=f"zeal-edge-{options.stream}-{options.device}",
            subscriptions=[config_topic(options.stream)],
        )
        self.pipeline = Pipeline(self.outbox, self.connection)
        self.params: Zeal | None = None
        self._pending: list[Reading] = []
        self._pending_since = 0.0
        self._stop = threading.Event()
        self._throttle = Throttle(60)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def stop(self) -> None:
        """Ask run() to flush what it holds and return (e.g. on SIGTERM)."""
        self._stop.set()

    # -- parameters -------------------------------------------------------------------------

    def _take_config_messages(self) -> None:
        while not self.connection.messages.empty():
            topic, payload = self.connection.messages.get_nowait()
            if topic != config_topic(self.options.stream) or not payload:
                continue
            try:
                params = params_from_config(payload, stream=self.options.stream)
            except ParameterError as exc:
                log.error("ignoring stream configuration on %s: %s", topic, exc)
                continue
            if self.params is not None and params != self.params:
                log.warning(
                    "stream %s has new parameters (fingerprint %s); flushing and switching",
                    self.options.stream,
                    params.fingerprint.hex(),
                )
                self._flush()
            if params != self.params:
                log.info("stream parameters: %r", params)
            self._use(params)

    def _use(self, params: Zeal) -> None:
        self.params = params
        policy = self.options.budget
        self.outbox.set_policy(
            self.namespace,
            cost_micro=micro_epsilon(params.epsilon),
            cap_micro=policy.cap_micro,
            window_s=policy.window_s,
        )

    def _load_params(self) -> None:
        if self.options.params_file is not None:
            try:
                text = self.options.params_file.read_text()
            except OSError as exc:
                raise ParameterError(
                    f"cannot read --params {self.options.params_file}: {exc}"
                ) from exc
            self._use(params_from_config(text, stream=self.options.stream))
            log.info("stream parameters from %s: %r", self.options.params_file, self.params)
            return
        deadline = time.monotonic() + self.options.wait_for_params
        while self.params is None and not self._stop.is_set():
            if time.monotonic() > deadline:
                raise ParameterError(
                    f"no stream parameters arrived on {config_topic(self.options.stream)}"
                )
            if self._throttle.ready("params"):
                log.warning(
                    "waiting for stream parameters on %s (no --params given): not reading "
                    "or sending until they arrive",
                    config_topic(self.options.stream),
                )
            self.pipeline.pump()
            self._take_config_messages()
            time.sleep(0.1)

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
        if not self._pending or self.params is None:
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
        log.info("batch #%d: %d readings, %d bytes", sequence, len(readings), len(payload))

    # -- main loop --------------------------------------------------------------------------

    def run(self, source_factory: Callable[[int], Source], *, linger: bool = True) -> int:
        """Send everything the source yields; return 0 once it ends and all is acknowledged.

        ``source_factory(offset)`` opens the source, skipping ``offset`` already-sent rows.
        """
        self.connection.start()
        try:
            self._load_params()
            if self._stop.is_set():
                return 0
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
                self._take_config_messages()
                if item is _END:
                    ended = True
                elif isinstance(item, Reading):
                    self._admit(item)
                full = len(self._pending) >= self.options.batch
                stale = (
                    self._pending
                    and time.monotonic() - self._pending_since >= self.options.interval
                )
                if full or stale or (ended and self._pending):
                    self._flush()
                self.pipeline.pump()
                if (
                    ended
                    and not self._pending
                    and (not linger or self.pipeline.unacknowledged == 0)
                ):
                    return 0
            self._flush()
            return 0
        finally:
            self.pipeline.pump()
            self.connection.stop()
            self.outbox.close()


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
    """SIGTERM and SIGINT flush the readings in memory and stop the agent cleanly."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
