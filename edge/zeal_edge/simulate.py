"""``zeal-edge simulate``: many virtual devices in one process, replaying a real dataset.

Each device has its own namespace in one outbox database (its own sequence numbers) and
starts at a different row of the dataset. All devices share one MQTT connection and one
parameter set, so a round of batches is perturbed in one vectorised call, committed in one
transaction and published through the same outbox pipeline as the real agent.

``--rate`` is readings per second per device (timestamps follow that schedule, so batches
use the periodic encoding); ``--rate 0`` runs as fast as the broker acknowledges, for load
tests, keeping at most a few rounds unacknowledged.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from zeal import Zeal
from zeal.longitudinal import Memo
from zeal.mqtt.streamconfig import is_tombstone, params_from_config
from zeal.mqtt.topics import config_topic
from zeal.policy import DAY_MS, HOUR_MS, cap_micro, device_hour_cap, micro_epsilon, tally
from zeal.protocol import check_name
from zeal.signed import CONFIG_PURPOSE
from zeal.vocabulary import renamed
from zeal_edge.errors import UnverifiedError
from zeal_edge.mqtt import Connection, parse_broker_url
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Batcher, Draft, Pipeline
from zeal_edge.settings import add_arguments, resolve
from zeal_edge.trust import verified

__all__ = ["add_simulate_arguments", "run_simulation"]

log = logging.getLogger(__name__)
_SETTINGS = {
    "stream",
    "source",
    "broker",
    "protocol",
    "username",
    "password",
    "ca_file",
    "cert_file",
    "key_file",
    "params",
    "data_dir",
    "batch",
    "column",
    "device_max_epsilon_per_day",
    "log_level",
    "server_key",
}


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, _SETTINGS)
    parser.add_argument("--devices", type=int, required=True, help="number of virtual devices")
    renamed(parser, "--dataset", "--source csv:FILE", "dataset")
    parser.add_argument(
        "--rate",
        type=float,
        default=1.0,
        help="readings per second per device (0: as fast as acknowledged)",
    )
    parser.add_argument(
        "--readings",
        type=int,
        default=None,
        help="stop after this many readings per device (default: run until stopped)",
    )
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--device-prefix", default="sim", help="device ids are PREFIX-00000 ...")
    parser.add_argument(
        "--wait-params",
        type=float,
        default=30.0,
        help="seconds to wait for the retained stream configuration",
    )


def _load_column(path: Path, column: str) -> npt.NDArray[np.float64]:
    values = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                values.append(float(row[column]))
            except (KeyError, TypeError, ValueError):
                continue
    if not values:
        raise ValueError(f"{path} has no numeric values in column {column!r}")
    return np.array(values)


def _buried(payload: bytes) -> bool:
    """Whether a configuration topic's message is a deleted stream's tombstone."""
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(document, dict) and is_tombstone(document)


def _trusted(payload: bytes, key: object) -> bool:
    """Whether a configuration may be used: signed by the server's key when one was given
    (--server-key, as to a device); with none, the first one found (simulated devices)."""
    if key is None:
        return True
    try:
        verified(payload, CONFIG_PURPOSE, str(key))
    except UnverifiedError as exc:
        log.warning("ignoring a configuration: %s", exc)
        return False
    return True


def _params(values: dict[str, object], connection: Connection, stream: str, wait: float) -> Zeal:
    if values["params"]:
        return params_from_config(Path(str(values["params"])).read_text(), stream=stream)
    if values["server_key"] is None:
        log.warning(
            "no --server-key: the simulated devices use the first configuration of stream %s "
            "on the broker, whoever signed it (give the server's key, as real devices are "
            "given it, to use only the server's)",
            stream,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        while not connection.messages.empty():
            message = connection.messages.get_nowait()
            if message.topic == config_topic(stream) and message.payload:
                if _buried(message.payload):  # a tombstone: the stream was deleted
                    continue
                if _trusted(message.payload, values["server_key"]):
                    return params_from_config(message.payload, stream=stream)
        time.sleep(0.05)
    raise ValueError(
        f"no stream parameters on {config_topic(stream)} within {wait} s; "
        "give --params or create the stream on the server"
    )


def _progress(last_report: float, committed: int, pipeline: Pipeline) -> float:
    """Log the figures every 5 s; returns when they were last logged."""
    if time.monotonic() - last_report < 5:
        return last_report
    log.info(
        "%d readings committed, %d batches acknowledged, %d waiting",
        committed,
        pipeline.acknowledged,
        pipeline.unacknowledged,
    )
    return time.monotonic()


class _Ledger:
    """The stream's policy for the simulated devices (which all read on one schedule): a
    round whose readings would take a UTC day or hour past the policy, or a device past its
    cap across streams (`device_cap`, epsilon per UTC day: the stream is each device's only
    one) or the hour rule that cap sets (zeal.policy.device_hour_cap), is skipped whole,
    never privatized (the agent's rule; the collector would refuse it as over_budget or
    device_cap)."""

    def __init__(self, params: Zeal, device_cap: float | None = None) -> None:
        self.allowed, self.skipped = params.readings_per_day, 0
        hourly = params.readings_per_hour
        if self.allowed is not None and device_cap is not None:
            cost = micro_epsilon(params.epsilon)
            self.allowed = min(self.allowed, cap_micro(device_cap) // cost)
            ruled = device_hour_cap(cap_micro(device_cap), cost) // cost  # the device hour rule
            hourly = ruled if hourly is None else min(hourly, ruled)
        self.caps = [(DAY_MS, self.allowed), (HOUR_MS, hourly)]
        self.booked: dict[tuple[int, int], int] = {}  # (period size, period) -> readings

    def report(self, devices: int) -> None:
        if self.skipped:
            print(
                f"skipped {self.skipped * devices} readings at the stream's privacy policy and "
                f"the device cap ({self.allowed} readings per device per UTC day): never "
                "privatized or sent"
            )

    def admit(self, stamps: npt.NDArray[np.int64]) -> bool:
        entries = [
            ((size, period), count, cap)
            for size, cap in self.caps
            if cap is not None
            for period, count in tally(stamps, size)
        ]
        if any(self.booked.get(key, 0) + count > cap for key, count, cap in entries):
            if not self.skipped:
                log.warning("stream policy reached: rounds of readings are skipped from now on")
            self.skipped += len(stamps)
            return False
        for key, count, _ in entries:
            self.booked[key] = self.booked.get(key, 0) + count
        return True


def _drain_and_report(
    pipeline: Pipeline, devices: int, batch: int, committed: int, began: float
) -> int:
    """Wait up to 60 s for the broker to confirm what is left, print the figures, and
    return the exit status (1 if anything is still unconfirmed)."""
    drain_until = time.monotonic() + 60
    while pipeline.unacknowledged and time.monotonic() < drain_until:
        pipeline.pump()
        time.sleep(0.01)
    seconds = time.time() - began
    acked = pipeline.acknowledged * batch
    print(
        f"simulated {devices} devices: {committed} readings in {committed // batch} batches, "
        f"{acked} acknowledged, {seconds:.1f} s, {acked / seconds:,.0f} readings/s acknowledged"
    )
    return 0 if pipeline.unacknowledged == 0 else 1


def _connection(values: dict[str, object], stream: str, prefix: str) -> Connection:
    """The simulator's one MQTT connection (all its devices publish through it)."""
    broker = parse_broker_url(
        str(values["broker"]),
        username=values["username"],
        password=values["password"],
        ca_file=values["ca_file"],
        cert_file=values["cert_file"],
        key_file=values["key_file"],
        protocol=values["protocol"],
    )
    return Connection(
        broker,
        client_id=f"zeal-sim-{stream}-{prefix}-{os.getpid()}",
        subscriptions=[config_topic(stream)],
    )


def _dataset(values: dict[str, object], args: argparse.Namespace) -> npt.NDArray[np.float64]:
    """The readings of --source csv:FILE (or the old --dataset FILE)."""
    source = values["source"] or (f"csv:{args.dataset}" if "dataset" in args else None)
    if source is None or not str(source).startswith("csv:"):
        raise ValueError("simulate replays a CSV file with a header row: --source csv:FILE")
    return _load_column(Path(str(source)[4:]), str(values["column"]))


def run_simulation(args: argparse.Namespace) -> int:
    values = resolve(args, os.environ, _SETTINGS, {"stream"})
    logging.getLogger().setLevel(str(values["log_level"]))
    if args.devices < 1 or args.rate < 0:
        raise ValueError("--devices must be >= 1 and --rate >= 0")
    prefix = check_name("device prefix", args.device_prefix)
    stream = str(values["stream"])
    if "," in stream:
        raise ValueError("simulate runs one stream: give --stream one name")
    data = _dataset(values, args)
    connection = _connection(values, stream, prefix)
    outbox = Outbox(Path(str(values["data_dir"])) / "simulate.sqlite", digests=False)
    connection.start()
    try:
        params = _params(values, connection, stream, args.wait_params)
        log.info("simulating %d devices on stream %s with %r", args.devices, stream, params)
        names = [outbox.ensure(stream, f"{prefix}-{i:05d}") for i in range(args.devices)]
        pipeline = Pipeline(outbox, connection, window=max(100, 2 * args.devices))
        cap = values["device_max_epsilon_per_day"]
        fleet = _Fleet(args, params, data, names, int(values["batch"]))
        fleet.ledger = _Ledger(params, None if cap is None else float(str(cap)))
        fleet.run(Batcher(outbox, pipeline), pipeline)
        return _drain_and_report(
            pipeline, args.devices, fleet.batch, fleet.committed_readings, fleet.began
        )
    finally:
        connection.stop()
        outbox.close()


class _Fleet:
    """The simulated devices: every one reads on the same schedule, its own stretch of the
    dataset, at --rate readings a second (0: as fast as the broker confirms)."""

    def __init__(
        self,
        args: argparse.Namespace,
        params: Zeal,
        data: npt.NDArray[np.float64],
        names: list[str],
        batch: int,
    ) -> None:
        self.args, self.params, self.data, self.names = args, params, data, names
        self.batch = batch
        self.starts = (np.arange(args.devices) * (data.size // args.devices + 7)) % data.size
        self.period_ms = 0 if args.rate == 0 else 1000.0 / args.rate
        self.max_rounds = None if args.readings is None else -(-args.readings // batch)
        self.ledger = _Ledger(params)
        #: A longitudinal stream (zeal.longitudinal): each device's memo (in memory: the
        #: devices are virtual) and its own ledger of draws.
        self.memos = None if params.grid_points is None else [Memo.new(params) for _ in names]
        self.ledgers = [_Ledger(params) for _ in names] if self.memos else []
        self.began = time.time()
        self.rounds = 0
        self.committed_readings = 0

    def run(self, batcher: Batcher, pipeline: Pipeline) -> None:
        """Rounds until --readings or --duration, then the ledger's report."""
        args, last_report = self.args, time.monotonic()
        self.began = time.time()
        while not self._done(time.time() - self.began):
            paced = (
                (time.time() - self.began) * args.rate >= (self.rounds + 1) * self.batch
                if args.rate > 0  # at the given rate
                else pipeline.unacknowledged <= 2 * args.devices  # as fast as acknowledged
            )
            due = paced and (self.max_rounds is None or self.rounds < self.max_rounds)
            if due:
                self._round(batcher)
            pipeline.pump()
            if not due:
                time.sleep(0.002)
            last_report = _progress(last_report, self.committed_readings, pipeline)
        if self.memos is None:
            self.ledger.report(args.devices)
        elif skipped := sum(ledger.skipped for ledger in self.ledgers):
            print(
                f"skipped {skipped} readings whose new draws the stream's privacy policy had no "
                "room for: never privatized or sent"
            )

    def _memoized(
        self, stamps: npt.NDArray[np.int64], readings: npt.NDArray[np.float64]
    ) -> list[Draft]:
        """A longitudinal stream's round: each device's memoized codes, its round kept if
        its new draws fit its own ledger (else skipped whole, its draws forgotten)."""
        assert self.memos is not None
        drafts = []
        for d, ns in enumerate(self.names):
            held = self.memos[d]
            memo = Memo(held.key, held.offset, held.codes)
            reports = memo.report(self.params, readings[d])
            if not self.ledgers[d].admit(stamps[reports.fresh]):
                continue
            self.memos[d] = memo
            drafts.append(Draft(ns, stamps, reports.codes, fresh=reports.fresh))
        return drafts

    def _done(self, elapsed: float) -> bool:
        args = self.args
        return (self.max_rounds is not None and self.rounds >= self.max_rounds) or (
            args.duration is not None and elapsed >= args.duration
        )

    def _round(self, batcher: Batcher) -> None:
        """One reading of each device, committed as one batch each (unless the policy
        skips the round)."""
        batch, now_ms = self.batch, int(time.time() * 1000)
        rate_base = int(self.began * 1000 + self.rounds * batch * self.period_ms)
        base = now_ms if self.args.rate == 0 else rate_base
        stamps = base + np.round(np.arange(batch) * self.period_ms).astype(np.int64)
        self.rounds += 1
        offsets = self.starts[:, None] + (self.rounds - 1) * batch + np.arange(batch)
        if self.memos is not None:
            drafts = self._memoized(stamps, self.data[offsets % self.data.size])
            batcher.commit(self.params, drafts, now_ms=now_ms)
            self.committed_readings += batch * len(drafts)
            return
        if not self.ledger.admit(stamps):  # every device has the same schedule
            return
        codes = self.params.perturb(self.data[offsets % self.data.size])
        drafts = [Draft(ns, stamps, codes[d]) for d, ns in enumerate(self.names)]
        batcher.commit(self.params, drafts, now_ms=now_ms)
        self.committed_readings += batch * len(self.names)
