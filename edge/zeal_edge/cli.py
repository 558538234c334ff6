"""``zeal-edge``: run the agent, show its state, or simulate a fleet.

zeal-edge run --stream NAME --device ID --source SPEC [--broker URL] [--batch N] ...
zeal-edge status [--data-dir DIR] [--json]
zeal-edge resume [--data-dir DIR]       clear a halt (the server had stopped accepting)
zeal-edge forget STREAM/DEVICE [--data-dir DIR] [--force]   remove a stream's entry
zeal-edge simulate --devices N --source csv:FILE --stream NAME [--rate R] ...

Exit status: 0 done, 2 a bad setting (a stream no server serves included), 3 the agent
must not go on (its device id runs elsewhere, or the server no longer accepts its stream);
the message says why.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zeal import ParameterError
from zeal.mqtt.topics import CAPS_FIELDS
from zeal.policy import MICRO, ROLLING, day_of
from zeal_edge.budget import BudgetPolicy
from zeal_edge.errors import AgentError
from zeal_edge.mqtt import parse_broker_url
from zeal_edge.outbox import Outbox
from zeal_edge.records import NamespaceStatus
from zeal_edge.settings import SETTINGS, SettingsError, add_arguments, resolve
from zeal_edge.sources import Source, WindowMeans, open_source

__all__ = ["main"]

_RUN = {s.name for s in SETTINGS}
_BROKER = {"broker", "protocol", "username", "password", "ca_file", "cert_file", "key_file"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeal-edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="privatize a sensor's readings and publish them",
        description="Settings come from options, ZEAL_* variables or a "
        "TOML --config file, in that order of precedence.",
    )
    add_arguments(run, _RUN)
    run.add_argument(
        "--wait",
        action="store_true",
        help="wait for the stream to be created when no server serves it yet (without it, "
        "the agent ends with exit status 2 naming the streams served)",
    )
    status = commands.add_parser("status", help="outbox depth, sequences and privacy budget")
    add_arguments(status, {"data_dir"})
    status.add_argument("--json", action="store_true", help="machine-readable output")
    resume = commands.add_parser(
        "resume",
        help="clear a halt, so the agent sends its stream again",
        description="An agent halts when its server, in messages signed with its key, says "
        "it no longer accepts the stream (deleted), or gives it a configuration it must not "
        "follow (the stream created anew, a policy above the agent's ceiling). This clears "
        "the halt and the pinned origin: the next configuration signed with the server's "
        "key is adopted and pinned. (An agent run with --on-halt wait needs no visit: "
        "zeal-server streams release NAME frees it.)",
    )
    add_arguments(resume, {"data_dir"})
    forget = commands.add_parser(
        "forget",
        help="remove a stream and device from this agent's state (zeal-edge status)",
        description="Removes what the agent keeps for STREAM/DEVICE: its status entry, "
        "sequence numbers, batches, reported rejects and privacy spend. It refuses while "
        "batches are queued or epsilon was spent (the spend keeps the stream's policy "
        "per day) unless --force: a run started again would begin at sequence 0.",
    )
    forget.add_argument("entry", metavar="STREAM/DEVICE", help="as zeal-edge status names it")
    forget.add_argument("--force", action="store_true", help="drop queued batches and spend")
    add_arguments(forget, {"data_dir"})
    from zeal_edge.simulate import add_simulate_arguments

    add_simulate_arguments(
        commands.add_parser(
            "simulate", help="many virtual devices replaying a dataset (demos and load tests)"
        )
    )
    return parser


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


def _run(args: argparse.Namespace) -> int:
    from zeal_edge.agent import Agent

    values = resolve(args, os.environ, _RUN, {"stream", "device", "source"})
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


def _when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _day(day: int) -> str:
    return datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y-%m-%d")


def _told(outbox: Outbox, device: str) -> dict[str, Any] | None:
    """The device's caps as its server last told them and the agent adopted (its own
    ceiling still bounds each: zeal_edge.devicecaps), or None."""
    learned = outbox.learned_caps(device)
    if learned is None:
        return None
    revision, issued_ms, caps = learned
    fields = {CAPS_FIELDS[d]: v for d, v in sorted(caps.items()) if d in CAPS_FIELDS}
    return {**fields, "revision": revision, "issued": _when(issued_ms)}


def _status_record(outbox: Outbox, st: NamespaceStatus, now_ms: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "stream": st.stream,
        "device": st.device,
        "fingerprint": st.fingerprint,
        "outbox_batches": st.outbox_batches,
        "outbox_readings": st.outbox_readings,
        "next_sequence": st.next_sequence,
        "last_acknowledged": st.last_acked,
        "sent_batches": st.sent_batches,
        "sent_readings": st.sent_readings,
        "skipped_for_budget": st.skipped_budget,
        "last_skip": _when(st.last_skip_ms),
        "skipped_invalid": st.skipped_invalid,
        "clipped_below_range": st.clipped_low,
        "clipped_above_range": st.clipped_high,
        "server_rejects": st.server_rejects or {},
        "server_key": st.server_key,
        "unverified_messages": st.unverified,
        "ignored_signed": st.ignored or {},
        "device_caps_told": _told(outbox, st.device),
        "halted": None
        if st.halt is None
        else {"reason": st.halt.reason, "since": _when(st.halt.since_ms), "why": st.halt.message},
    }
    if st.day_cap_micro is not None:
        today = day_of(now_ms)
        days = outbox.spent_by_day(st.namespace, today - 6)
        record.update(
            policy_epsilon_per_day=st.day_cap_micro / MICRO,
            policy_spent_today=days.get(today, 0) / MICRO,
            policy_spent_by_day={_day(d): m / MICRO for d, m in sorted(days.items())},
            skipped_for_policy=st.skipped_policy,
        )
    if st.window_s is not None:
        spent = outbox.spent(st.namespace, now_ms=now_ms, window_s=st.window_s)
        record.update(
            budget_window_s=st.window_s,
            budget_spent=spent / 1e6,
            budget_cap=None if st.cap_micro is None else st.cap_micro / 1e6,
            epsilon_per_reading=(st.cost_micro or 0) / 1e6,
        )
        policy = BudgetPolicy(st.cap_micro, st.window_s)
        if st.cap_micro is not None:
            record["budget_remaining"] = max(0, st.cap_micro - spent) / 1e6
            cost = st.cost_micro or 0
            exhausted = not policy.allows(spent, cost)
            record["budget_exhausted"] = exhausted
            if exhausted:
                history = outbox.spend_history(st.namespace, now_ms=now_ms, window_s=st.window_s)
                resume = policy.resume_ms(history, 0, cost)
                record["resumes"] = (
                    "never (cap below one reading)" if resume is None else _when(resume)
                )
    return record


def _outbox(args: argparse.Namespace) -> Outbox | None:
    values = resolve(args, os.environ, {"data_dir"}, set())
    path = Path(values["data_dir"]) / "outbox.sqlite"
    if not path.exists():
        print(f"no agent state in {path}", file=sys.stderr)
        return None
    return Outbox(path)


def _resume(args: argparse.Namespace) -> int:
    outbox = _outbox(args)
    if outbox is None:
        return 1
    cleared = [st for st in outbox.status() if st.halt is not None]
    for st in cleared:
        outbox.set_halt(st.namespace, None)
        outbox.set_origin(st.namespace, None)  # and what it had seen of that origin:
        outbox.set_mark(st.namespace, "revision", None)
        outbox.set_mark(st.namespace, "released_ms", None)
        print(f"{st.stream}/{st.device}: halt cleared ({st.halt.reason if st.halt else ''})")
    outbox.close()
    if not cleared:
        print("no halted stream here")
    return 0


def _forget(args: argparse.Namespace) -> int:
    import time

    outbox = _outbox(args)
    if outbox is None:
        return 1
    try:
        now = int(time.time() * 1000)
        entries = {st.namespace: st for st in outbox.status()}
        st = entries.get(args.entry)
        if st is None:
            known = ", ".join(entries) or "none"
            print(
                f"zeal-edge: error: no entry {args.entry!r} here (entries: {known})",
                file=sys.stderr,
            )
            return 1
        record = _status_record(outbox, st, now)
        spent = sum(record.get("policy_spent_by_day", {}).values()) + record.get("budget_spent", 0)
        held = [
            f"{st.outbox_batches} queued batch(es)" if st.outbox_batches else "",
            f"{spent:g} epsilon spent in the last days" if spent else "",
        ]
        if any(held) and not args.force:
            print(
                f"zeal-edge: error: {args.entry} has {' and '.join(h for h in held if h)}; "
                "--force forgets them too",
                file=sys.stderr,
            )
            return 1
        outbox.forget(args.entry)
    finally:
        outbox.close()
    print(f"{args.entry}: forgotten")
    return 0


def _status(args: argparse.Namespace) -> int:
    import time

    outbox = _outbox(args)
    if outbox is None:
        return 1
    now = int(time.time() * 1000)
    records = [_status_record(outbox, st, now) for st in outbox.status()]
    outbox.close()
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    for r in records:
        print(f"{r['stream']}/{r['device']}  (parameters {r['fingerprint'] or 'not yet known'})")
        if r["halted"]:
            print(f"  HALTED            since {r['halted']['since']}: {r['halted']['why']}")
            print(
                "                    (zeal-edge resume clears it; an agent run with "
                "--on-halt wait resumes when its server releases the stream)"
            )
        print(
            f"  queued            {r['outbox_batches']} batches ({r['outbox_readings']} readings) "
            "in the outbox, awaiting the broker's PUBACK"
        )
        print(
            f"  sequences         next {r['next_sequence']}, last confirmed "
            f"{r['last_acknowledged'] if r['last_acknowledged'] is not None else 'none'}"
        )
        print(
            f"  confirmed         {r['sent_batches']} batches, {r['sent_readings']} readings "
            "(by the broker)"
        )
        if r["server_rejects"]:
            counts = ", ".join(f"{k} {v}" for k, v in r["server_rejects"].items())
            print(f"  server rejected   {counts}")
        elif r["sent_batches"]:
            print("  server rejected   none reported")
        if r["clipped_below_range"] or r["clipped_above_range"]:
            print(
                f"  clipped           {r['clipped_below_range']} reading(s) below the stream's "
                f"range, {r['clipped_above_range']} above it (sent as its ends)"
            )
        if r["skipped_invalid"]:
            print(f"  skipped           {r['skipped_invalid']} reading(s) not a finite number")
        print(f"  server key        {r['server_key'] or 'not yet pinned'}")
        if r["unverified_messages"]:
            print(
                f"  ignored           {r['unverified_messages']} configuration or notice "
                "message(s) not signed by that key"
            )
        if r["ignored_signed"]:
            counts = ", ".join(f"{k} {v}" for k, v in r["ignored_signed"].items())
            print(f"  ignored, signed   {counts} (docs/edge-agent.md: stale, not for it, not its)")
        if r["device_caps_told"]:
            told = r["device_caps_told"]
            caps = ", ".join(
                f"{k} {'none' if v is None else v}" for k, v in told.items() if k.startswith("max")
            )
            print(f"  device caps told  {caps} (revision {told['revision']}, {told['issued']})")
        _print_budgets(r)
    return 0


def _print_budgets(r: dict[str, Any]) -> None:
    """The stream policy's and the agent's own cap's lines of `zeal-edge status`."""
    if "policy_epsilon_per_day" in r:
        print(
            f"  stream policy     {r['policy_spent_today']:.6f} of "
            f"{r['policy_epsilon_per_day']:.6f} epsilon spent on today's readings (UTC); "
            f"{r['skipped_for_policy']} reading(s) skipped at the policy so far"
        )
        for day, spent in r["policy_spent_by_day"].items():
            print(f"                    {day}: {spent:.6f} epsilon spent on its readings")
    if "budget_spent" in r:
        cap = "no cap" if r["budget_cap"] is None else f"cap {r['budget_cap']:.6f}"
        print(
            f"  budget            {r['budget_spent']:.6f} epsilon spent in the last "
            f"{r['budget_window_s']} s ({cap}; {r['epsilon_per_reading']:.6f} per reading)"
        )
        if "budget_remaining" in r:
            print(f"  budget remaining  {r['budget_remaining']:.6f} epsilon")
        if r.get("budget_exhausted"):
            print(
                f"  BUDGET EXHAUSTED  {r['skipped_for_budget']} reading(s) not perturbed or "
                f"sent (last {r['last_skip']}); sending resumes {r['resumes']}"
            )
        elif r["skipped_for_budget"]:
            print(
                f"  skipped           {r['skipped_for_budget']} reading(s) at the budget cap "
                f"(last {r['last_skip']})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    args = _parser().parse_args(argv)
    try:
        if args.command == "simulate":
            from zeal_edge.simulate import run_simulation

            return run_simulation(args)
        command = {"run": _run, "status": _status, "resume": _resume, "forget": _forget}
        return command[args.command](args)
    except AgentError as exc:
        print(f"zeal-edge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (SettingsError, ParameterError, ValueError, OSError) as exc:
        print(f"zeal-edge: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
