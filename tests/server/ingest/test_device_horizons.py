"""A device's privacy over an hour and over 30 days across its streams, at the collector:
the device hour rule (zeal.policy.device_hour_cap) and a rolling 30-day cap hold what a
device that ignores its ledger can store, on SQLite and PostgreSQL, and a transaction of
many messages stores exactly what storing them one at a time (in topic order) does.

The reference is a plain model of the rules written here from docs/privacy.md, one reading
at a time: a stream's readings per UTC day and hour, the device's epsilon per UTC day, per
UTC hour (the larger of twice its hourly share of the day cap and one reading) and over
every 30 consecutive UTC days that hold the reading's day."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select

from tests.server.ingest.homes import STREAMS, one_reading
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.models import PrincipalDay, PrincipalHour, Reject, Stream

#: Each stream's policy (one_reading): epsilon 1 a reading, 8 a UTC day (so 1 a UTC hour);
#: the device's cap is 8 a day (so its hour rule allows one reading an hour across streams).
EVERY_MS = 10 * 60_000  # one reading every 10 minutes into each stream


def rogue(device: str, first_day: int, days: int) -> list[tuple[str, int, bytes]]:
    """(stream, stamp, message) of a device that ignores its ledger: one reading every 10
    minutes into each stream, its own sequence per stream, in time order."""
    out = []
    for k in range(days * DAY_MS // EVERY_MS):
        stamp = first_day * DAY_MS + k * EVERY_MS
        for stream in STREAMS:
            out.append((stream, stamp, one_reading(stream, device, k, stamp)))
    return out


class Model:
    """The rules, one reading at a time (the module docstring)."""

    def __init__(self, month_cap: int) -> None:
        self.month_cap = month_cap
        self.stream_periods: Counter[tuple[str, str, int]] = Counter()
        self.days: Counter[int] = Counter()
        self.hours: Counter[int] = Counter()

    def offer(self, stream: str, stamp: int) -> str:
        day, hour = stamp // DAY_MS, stamp // HOUR_MS
        if (
            self.stream_periods[stream, "day", day] >= 8
            or self.stream_periods[stream, "hour", hour]
        ):
            return "over_budget"
        month = any(
            sum(self.days[d] for d in range(start, start + 30)) + 1 > self.month_cap
            for start in range(day - 29, day + 1)
        )
        if self.days[day] + 1 > 8 or self.hours[hour] + 1 > max(16 // 24, 1) or month:
            return "device_cap"
        self.stream_periods[stream, "day", day] += 1
        self.stream_periods[stream, "hour", hour] += 1
        self.days[day] += 1
        self.hours[hour] += 1
        return "stored"


def store_in(
    sessions: Any, ingest: Ingest, messages: list[tuple[str, int, bytes]], per_transaction: int
) -> list[str]:
    """Each message's outcome (stored, or its refusal's reason), `per_transaction` messages
    a transaction."""
    now = store.now_ms()
    out: list[str] = []
    for i in range(0, len(messages), per_transaction):
        chunk = messages[i : i + per_transaction]
        with sessions() as session, session.begin():
            got = ingest.add_many(
                session, [(f"zeal/v1/{s}/home-1/up", p, now) for s, _, p in chunk]
            )
        out.extend(o.status if o.status == "stored" else str(o.reason) for o in got)
    return out


def model_of(
    messages: list[tuple[str, int, bytes]], per_transaction: int, month_cap: int
) -> list[str]:
    """What the model stores of `messages` sent `per_transaction` a transaction: a
    transaction is stored as one at a time in topic order (ingest's rule)."""
    model, out = Model(month_cap), [""] * len(messages)
    for i in range(0, len(messages), per_transaction):
        order = sorted(range(i, min(i + per_transaction, len(messages))), key=lambda j: (
            messages[j][0], j
        ))  # fmt: skip
        for j in order:
            out[j] = model.offer(messages[j][0], messages[j][1])
    return out


def check_bounds(messages: list[tuple[str, int, bytes]], outcomes: list[str], cap: int) -> None:
    """What was stored never passes the hour rule, the day cap, nor the 30-day cap."""
    stamps = [m[1] for m, o in zip(messages, outcomes, strict=True) if o == "stored"]
    hours, days = Counter(s // HOUR_MS for s in stamps), Counter(s // DAY_MS for s in stamps)
    assert max(hours.values()) == 1
    assert max(days.values()) == 8
    first, last = min(days), max(days)
    windows = [sum(days[d] for d in range(s, s + 30)) for s in range(first - 29, last + 1)]
    assert max(windows) == cap


def test_a_rogue_device_over_40_days_stays_within_the_hour_rule_the_day_and_30_days(
    sessions: Any,
) -> None:
    """A device ignoring its ledger, one reading every 10 minutes into
    three streams for 40 days (17,280 messages, a day's a transaction), with a 30-day
    cap of 100: every UTC hour holds at most one reading, every day at most 8, every 30
    days at most 100; the rest refused as device_cap (or over_budget where its stream's own
    policy said so first); exactly what the rules give one at a time, in topic order."""
    today = day_of(store.now_ms())
    messages = rogue("home-1", today - 41, 40)
    ingest = Ingest(
        max_age_ms=45 * DAY_MS, device_max_epsilon_per_day=8.0, device_rolling_caps={30: 100.0}
    )
    per_day = len(STREAMS) * DAY_MS // EVERY_MS
    outcomes = store_in(sessions, ingest, messages, per_day)
    assert outcomes == model_of(messages, per_day, 100)
    check_bounds(messages, outcomes, 100)
    counts = Counter(outcomes)
    assert counts["stored"] == 12 * 8 + 4 + 10 * 8  # 100 by day 13, then what day 1.. frees
    assert counts == {"stored": 180, "device_cap": 14_088, "over_budget": 3_012}  # privacy.md
    with sessions() as session:
        rejects: Counter[str] = Counter()
        for r in session.scalars(select(Reject)):  # one row per stream and reason
            rejects[r.reason] += r.count
        day_rows = dict(session.execute(select(PrincipalDay.period, PrincipalDay.micro)).all())
        hour_rows = session.scalars(select(PrincipalHour.micro)).all()
    assert rejects == Counter({r: counts[r] for r in ("device_cap", "over_budget")})
    assert sum(day_rows.values()) == counts["stored"] * 1_000_000  # nothing refused is booked
    assert max(hour_rows) == 1_000_000
    assert sum(hour_rows) == counts["stored"] * 1_000_000


@pytest.mark.parametrize("per_transaction", [1, 7, 432, 2000])
def test_a_transaction_stores_what_one_message_at_a_time_stores(
    sessions: Any, per_transaction: int
) -> None:
    """Five days of the rogue device under a 30-day cap of 20 (8, 8, then 4, then none),
    sent one message a transaction, 7, a day's (432) and all (2,000 of them): each stores
    what the model stores one at a time in topic order, and one at a time the model and
    the collector agree message by message."""
    today = day_of(store.now_ms())
    messages = rogue("home-1", today - 6, 5)[:2000]
    ingest = Ingest(
        max_age_ms=8 * DAY_MS, device_max_epsilon_per_day=8.0, device_rolling_caps={30: 20.0}
    )
    outcomes = store_in(sessions, ingest, messages, per_transaction)
    assert outcomes == model_of(messages, per_transaction, 20)
    check_bounds(messages, outcomes, 20)
    assert outcomes.count("stored") == 20


def test_two_collectors_booking_one_device_on_two_days_keep_its_30_day_cap(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two collectors sharing PostgreSQL store one device's readings of two different days
    into two streams at once (its row in each stream and its principal made before, so
    nothing else makes one wait for the other), each day's 8 within the day cap and a
    30-day cap of 10 alone, 16 together.
    Collector A books its day and holds its transaction open (up to 3 s) until B has read
    the device's days; B locks the device's principal row first, so it waits for A's commit
    and reads A's 8: B stores 2 and refuses 6 as device_cap. Without that lock B would read
    before A commits (A then goes on at once) and store all 8: 16 in 30 days."""
    from zeal_server.store import ledger
    from zeal_server.store.db import make_engine, migrate, session_factory

    engine = make_engine(postgres_url)
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        for name in ("humidity", "occupancy"):
            stream = store.create_stream(session, name=name, lower=0, upper=100, epsilon=1)
            store.enroll(session, stream, "home")
        session.execute(Stream.__table__.update().values(created_ms=0))
        store.caps_of(session, [("home", "")], 8.0)  # its principal
    today = day_of(store.now_ms())
    read = threading.Event()

    class Watched(ledger.Rolling):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            if threading.current_thread().name == "B":
                read.set()

    monkeypatch.setattr(ledger, "Rolling", Watched)
    results: dict[str, list[str]] = {}

    def collector(name: str, stream: str, day: int) -> None:
        ingest = Ingest(
            max_age_ms=7 * DAY_MS, device_max_epsilon_per_day=8.0, device_rolling_caps={30: 10.0}
        )
        messages = [
            (f"zeal/v1/{stream}/home/up", one_reading(stream, "home", h,
                                                      day * DAY_MS + h * HOUR_MS), store.now_ms())
            for h in range(8)
        ]  # fmt: skip
        with sessions() as session, session.begin():
            outcomes = ingest.add_many(session, messages)
            if name == "A":
                started.set()
                read.wait(3)
        results[name] = [o.status if o.status == "stored" else str(o.reason) for o in outcomes]

    started = threading.Event()
    a = threading.Thread(target=collector, args=("A", "humidity", today - 1), name="A")
    b = threading.Thread(target=collector, args=("B", "occupancy", today - 2), name="B")
    a.start()
    assert started.wait(30)
    b.start()
    a.join(60)
    b.join(60)
    engine.dispose()
    assert results["A"] == ["stored"] * 8
    assert results["B"] == ["stored"] * 2 + ["device_cap"] * 6
