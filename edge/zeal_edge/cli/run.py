"""``zeal-edge run``: one stream's agent, or a device's streams side by side in one process."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from zeal import ParameterError
from zeal.policy import ROLLING
from zeal_edge.budget import BudgetPolicy
from zeal_edge.errors import AgentError
from zeal_edge.mqtt import parse_broker_url
from zeal_edge.outbox import Outbox
from zeal_edge.settings import SETTINGS, SettingsError, resolve
from zeal_edge.sources import Source, WindowMeans, open_source

__all__ = ["RUN", "run"]


RUN = {s.name for s in SETTINGS}


_BROKER = {"broker", "protocol", "username", "password", "ca_file", "cert_file", "key_file"}


def _broker(values: dict[str, Any]) -> Any:
    """The broker settings, TLS files checked together: a client certificate needs its key
    and mqtts:// (SettingsError)."""
    cert, key = values["cert_file"], values["key_file"]
    if bool(cert) != bool(key):
        raise SettingsError("--cert and --key go together: the client certificate and its key")
    if (cert or values["ca_file"]) and not str(values["broker"]).startswith("mqtts://"):
        raise SettingsError(
            f"--ca and --cert are for TLS: the broker URL must be mqtts://, not {values['broker']}"
        )
    return parse_broker_url(
        values["broker"],
        username=values["username"],
        password=values["password"],
        ca_file=values["ca_file"],
        cert_file=values["cert_file"],
        key_file=values["key_file"],
        protocol=values["protocol"],
    )


def _options(values: dict[str, Any], stream: str, wait: bool) -> Any:
    from zeal_edge.options import AgentOptions

    return AgentOptions(
        stream=stream,
        device=values["device"],
        data_dir=Path(values["data_dir"]),
        batch=values["batch"],
        interval=values["batch_seconds"],
        params_file=Path(values["params"]) if values["params"] else None,
        budget=BudgetPolicy.from_epsilon(values["budget_cap"], values["budget_window_seconds"]),
        max_epsilon=values["max_epsilon"],
        max_epsilon_per_day=values["max_epsilon_per_day"],
        device_max_epsilon_per_day=values["device_max_epsilon_per_day"],
        device_rolling_caps=_rolling(values),
        pin=values["pin"],
        server_key=values["server_key"],
        on_halt=values["on_halt"],
        trust_first_use=values["trust_first_use"],
        wait=wait,
    )


def run(args: argparse.Namespace) -> int:
    from zeal_edge.agent import Agent

    values = resolve(args, os.environ, RUN, {"stream", "device", "source"})
    logging.getLogger().setLevel(values["log_level"])
    broker = _broker(values)
    streams = values["stream"].split(",")
    if len(streams) > 1 and values["cert_file"]:
        raise SettingsError(
            "a client certificate is one session on the broker (its name is the login and the "
            "client id), and each stream is a connection of its own: run one stream per "
            "certificate, or several streams with a password login"
        )
    if len(streams) > 1 or values["shares"] is not None:
        return _run_together(values, streams, broker, wait=args.wait)
    options = _options(values, streams[0], args.wait)

    def source(offset: int) -> Source:
        opened = open_source(
            values["source"], column=values["column"], speedup=values["speedup"], start=offset
        )
        if values["window_mean_seconds"] is None or agent.params is None:
            return opened
        bounds = (agent.params.lower, agent.params.upper)
        return WindowMeans(opened, values["window_mean_seconds"], bounds)

    open_source(values["source"], column=values["column"])  # fail fast on a bad spec
    agent = Agent(options, broker)
    # SIGTERM, SIGINT and SIGHUP flush the readings in memory and stop the agent cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: agent.stop())
    return agent.run(source)


def _rolling(values: dict[str, Any]) -> dict[int, float | None]:
    """The device's caps over 30 and 365 UTC days given (zeal.policy.ROLLING)."""
    return {days: values[f"device_max_epsilon_per_{days}_days"] for days in ROLLING}


def _run_together(values: dict[str, Any], streams: list[str], broker: Any, *, wait: bool) -> int:
    """One device's streams in one process, an agent each in its own thread, keeping one
    ledger of the device's cap across them (zeal_edge.device). They read one CSV source, a
    column each, or a source each: a spec with ``{stream}`` in it is opened once per stream
    with the stream's name there. The exit status is the highest of theirs."""
    from zeal_edge.agent import Agent
    from zeal_edge.device import DeviceLedger

    spec_of, columns = _sources(values, streams)
    outbox = Outbox(Path(values["data_dir"]) / "outbox.sqlite")
    ledger = DeviceLedger(
        outbox,
        values["device"],
        values["device_max_epsilon_per_day"],
        streams,
        values["shares"] or (),
        rolling=_rolling(values),
    )
    agents: dict[str, Agent] = {}
    results: dict[str, int] = {}
    failures: list[Exception] = []  # told after the others have stopped
    stopping = threading.Event()

    def one(stream: str, name: str) -> None:
        try:
            agent = agents[stream] = Agent(_options(values, stream, wait), broker, ledger=ledger)
            if stopping.is_set():
                agent.stop()

            def source(offset: int) -> Source:
                opened = open_source(
                    spec_of(stream), column=name, speedup=values["speedup"], start=offset
                )
                if values["window_mean_seconds"] is None or agent.params is None:
                    return opened
                bounds = (agent.params.lower, agent.params.upper)
                return WindowMeans(opened, values["window_mean_seconds"], bounds)

            results[stream] = agent.run(source)
        except (AgentError, SettingsError, ParameterError, ValueError, OSError) as exc:
            failures.append(exc)
            results[stream] = exc.exit_code if isinstance(exc, AgentError) else 2
            stop()

    def stop() -> None:
        stopping.set()
        for agent in list(agents.values()):
            agent.stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop())
    threads = [
        threading.Thread(target=one, args=(s, c), name=f"agent-{s}", daemon=True)
        for s, c in zip(streams, columns, strict=True)
    ]
    _start_and_wait(threads)
    outbox.close()
    for exc in failures:
        print(f"zeal-edge: error: {exc}", file=sys.stderr)
    return max(results.values(), default=0)


def _start_and_wait(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # signals reach the main thread between waits


def _sources(values: dict[str, Any], streams: list[str]) -> tuple[Any, list[str]]:
    """Each stream's source spec (a function of its name) and CSV column, checked."""
    column, spec = values["column"], values["source"]
    each = "{stream}" in spec
    columns = column.split(",") if "," in column else [column] * len(streams) if each else streams
    if len(columns) != len(streams):
        raise SettingsError(
            f"--column names {len(columns)} columns for {len(streams)} streams: give one per "
            "stream, comma-separated (or none: each stream reads the column named like it)"
        )
    if not (each or spec.startswith("csv:")):
        raise SettingsError(
            "several streams read one csv:PATH source, a column each, or a source each: "
            "put {stream} in the spec (csv:data/{stream}.csv, cmd:read-sensor {stream})"
        )
    if values["params"]:
        raise SettingsError("--params gives one stream's configuration: run one stream with it")

    def spec_of(stream: str) -> str:
        return str(spec).replace("{stream}", stream)

    for stream, name in zip(streams, columns, strict=True):  # fail fast on a bad spec
        open_source(spec_of(stream), column=name, limit=0)
    return spec_of, columns
