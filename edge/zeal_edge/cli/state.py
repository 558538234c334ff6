"""``zeal-edge status``, ``resume`` and ``forget``: what the agent keeps in its data
directory, read or changed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from zeal.mqtt.topics import CAPS_FIELDS
from zeal.policy import MICRO, day_of
from zeal_edge.budget import BudgetPolicy
from zeal_edge.outbox import Outbox
from zeal_edge.records import NamespaceStatus
from zeal_edge.settings import resolve

__all__ = ["forget", "resume", "status"]


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


def resume(args: argparse.Namespace) -> int:
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


def forget(args: argparse.Namespace) -> int:
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


def status(args: argparse.Namespace) -> int:
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
