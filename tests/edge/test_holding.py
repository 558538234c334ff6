"""Readings held until their batch is due (zeal_edge.holding), with no broker: each charged
against the stream's policy per UTC day and hour of its timestamp or skipped unperturbed
(and counted), stamped never before the ones held with it, released perturbed together.
The same end to end with a real agent, broker and server: tests/server/ingest/test_policy.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from zeal import Zeal
from zeal.policy import DAY_MS, HOUR_MS
from zeal_edge import holding as holding_module
from zeal_edge.budget import BudgetPolicy
from zeal_edge.holding import Holding
from zeal_edge.options import AgentOptions, Throttle
from zeal_edge.outbox import Outbox
from zeal_edge.pipeline import Batcher
from zeal_edge.sources import Reading

#: Eight readings a UTC day at epsilon 1, so one an hour.
PARAMS = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8)
#: A UTC day in the past (the holding's periods are its readings' own).
DAY = 20_000 * DAY_MS


class Clock:
    """The monotonic clock the holding reads for its interval, moved by the test."""

    def __init__(self) -> None:
        self.now = 500.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(holding_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox(tmp_path / "outbox.sqlite")
    yield box
    box.close()


def holding(outbox: Outbox, *, batch: int = 100, interval: float = 60.0) -> Holding:
    options = AgentOptions(
        stream="temps",
        device="dev1",
        data_dir=Path("unused"),
        batch=batch,
        interval=interval,
        budget=BudgetPolicy(None, 86_400),
    )
    return Holding(outbox, outbox.ensure("temps", "dev1"), options, Throttle(60))


def test_a_day_holds_what_the_policy_allows_and_the_rest_is_skipped_and_counted(
    outbox: Outbox, clock: Clock
) -> None:
    held = holding(outbox)
    for hour in range(24):  # one reading an hour: the hour's cap never binds
        held.admit(Reading(40.0, DAY + hour * HOUR_MS), PARAMS, now_ms=DAY + 2 * DAY_MS)
    assert PARAMS.readings_per_day == 8
    assert len(held) == 8  # the day's eight, the first come
    held.book_skips(final=True)
    [status] = outbox.status()
    assert status.skipped_policy == 16
    draft = held.release(PARAMS, now_ms=DAY + 2 * DAY_MS)
    assert draft is not None
    assert list(draft.timestamps) == [DAY + hour * HOUR_MS for hour in range(8)]


def test_an_hour_holds_its_share_of_the_day(outbox: Outbox, clock: Clock) -> None:
    held = holding(outbox)
    for second in range(10):
        held.admit(Reading(40.0, DAY + 1000 * second), PARAMS, now_ms=DAY + DAY_MS)
    assert PARAMS.readings_per_hour == 1
    assert len(held) == 1


def test_what_the_outbox_booked_for_a_day_counts_against_it(outbox: Outbox, clock: Clock) -> None:
    first = holding(outbox)
    for hour in range(5):
        first.admit(Reading(40.0, DAY + hour * HOUR_MS), PARAMS, now_ms=DAY)
    draft = first.release(PARAMS, now_ms=DAY)
    assert draft is not None
    # Sealed into the outbox as the agent does (nothing is published here).
    Batcher(outbox, SimpleNamespace(committed=lambda _keys: None)).commit(  # type: ignore[arg-type]
        PARAMS, [draft], now_ms=DAY
    )
    second = holding(outbox)  # a new batch: it reads what the outbox booked
    for hour in range(5, 24):
        second.admit(Reading(40.0, DAY + hour * HOUR_MS), PARAMS, now_ms=DAY)
    assert len(second) == 3  # 8 a day, 5 of them already sealed


def test_stamps_never_go_back_within_a_batch_and_a_missing_one_is_now(
    outbox: Outbox, clock: Clock
) -> None:
    params = Zeal(lower=0, upper=110, epsilon=1)  # no policy: all held
    held = holding(outbox)
    held.admit(Reading(40.0, DAY + 5_000), params, now_ms=DAY + 9_000)
    held.admit(Reading(41.0, DAY + 1_000), params, now_ms=DAY + 9_000)  # the clock stepped back
    held.admit(Reading(42.0, None), params, now_ms=DAY + 9_000)
    draft = held.release(params, now_ms=DAY + 10_000)
    assert draft is not None
    assert list(draft.timestamps) == [DAY + 5_000, DAY + 5_000, DAY + 9_000]


def test_the_release_perturbs_them_together_and_counts_what_the_range_clipped(
    outbox: Outbox, clock: Clock
) -> None:
    params = Zeal(lower=0, upper=110, epsilon=1)  # no policy: all held
    held = holding(outbox)
    for k, value in enumerate([-5.0, 50.0, 200.0, 300.0]):
        held.admit(Reading(value, DAY + k), params, now_ms=DAY)
    draft = held.release(params, now_ms=DAY)
    assert draft is not None
    assert held.clipped == (1, 2)
    assert draft.codes.dtype == np.uint64
    assert draft.codes.size == 4
    assert held.release(params, now_ms=DAY) is None  # nothing left


def test_a_batch_is_due_when_full_when_its_source_ended_or_after_the_interval(
    outbox: Outbox, clock: Clock
) -> None:
    params = Zeal(lower=0, upper=110, epsilon=1)
    held = holding(outbox, batch=3, interval=60.0)
    assert not held.due(ended=True)  # nothing held
    held.admit(Reading(40.0, DAY), params, now_ms=DAY)
    assert not held.due(ended=False)
    assert held.due(ended=True)
    clock.now += 59.9
    assert not held.due(ended=False)
    clock.now += 0.1
    assert held.due(ended=False)  # its oldest reading waited the interval
    held.drop()
    assert len(held) == 0
    for k in range(3):
        held.admit(Reading(40.0, DAY + k), params, now_ms=DAY)
    assert held.due(ended=False)  # full


def test_a_dropped_holding_spent_nothing(outbox: Outbox, clock: Clock) -> None:
    held = holding(outbox)
    held.admit(Reading(40.0, DAY), PARAMS, now_ms=DAY)
    held.drop()
    assert held.release(PARAMS, now_ms=DAY) is None
    assert outbox.spent_by_day(outbox.ensure("temps", "dev1"), DAY // DAY_MS) == {}


#: A longitudinal stream (zeal.longitudinal) under the same policy: 12 grid values.
MEMOIZED = Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=8, grid_points=12)


def seal(outbox: Outbox, params: Zeal, draft: object) -> None:
    Batcher(outbox, SimpleNamespace(committed=lambda _keys: None)).commit(  # type: ignore[arg-type]
        params,
        [draft],
        now_ms=DAY,  # type: ignore[list-item]
    )


def test_a_longitudinal_stream_books_a_value_once_and_sends_its_memoized_code(
    outbox: Outbox, clock: Clock
) -> None:
    """24 hourly readings of one value: the policy (8 a day, 1 an hour) would hold 8 on a
    plain stream; here the first draws and the other 23 repeat its code at no cost."""
    held = holding(outbox)
    for hour in range(24):
        held.admit(Reading(40.0, DAY + hour * HOUR_MS), MEMOIZED, now_ms=DAY)
    assert len(held) == 24
    draft = held.release(MEMOIZED, now_ms=DAY)
    assert draft is not None
    assert draft.fresh is not None
    assert draft.fresh.tolist() == [True] + [False] * 23
    assert len(set(draft.codes.tolist())) == 1
    seal(outbox, MEMOIZED, draft)
    assert outbox.spent_by_day(outbox.ensure("temps", "dev1"), DAY // DAY_MS) == {
        DAY // DAY_MS: 1_000_000
    }
    stored = outbox.memo(outbox.ensure("temps", "dev1"))
    assert stored is not None
    assert "offset" in stored
    # A restart: the memo comes back from the outbox, and so does the code, at no cost.
    again = holding(outbox)
    again.admit(Reading(40.0, DAY + DAY_MS), MEMOIZED, now_ms=DAY + DAY_MS)
    later = again.release(MEMOIZED, now_ms=DAY + DAY_MS)
    assert later is not None
    assert later.fresh is not None
    assert later.codes.tolist() == draft.codes[:1].tolist()
    assert not later.fresh.any()


def test_new_grid_values_cost_and_meet_the_hour_cap(outbox: Outbox, clock: Clock) -> None:
    """Readings that visit a new grid value each draw (one epsilon): within one hour only
    one fits (the hour's cap is 1), the rest are skipped unperturbed; a lost memo table
    draws, and books, again."""
    held = holding(outbox)
    for k, value in enumerate([5.0, 35.0, 65.0, 95.0]):  # four grid values, 30 apart
        held.admit(Reading(value, DAY + k * 1000), MEMOIZED, now_ms=DAY)
    assert len(held) == 1
    draft = held.release(MEMOIZED, now_ms=DAY)
    assert draft is not None
    seal(outbox, MEMOIZED, draft)
    namespace = outbox.ensure("temps", "dev1")
    assert outbox.spent_by_day(namespace, DAY // DAY_MS) == {DAY // DAY_MS: 1_000_000}
    outbox._db.execute("DELETE FROM memos")  # the table lost
    fresh = holding(outbox)
    fresh.admit(Reading(5.0, DAY + 2 * HOUR_MS), MEMOIZED, now_ms=DAY)
    redrawn = fresh.release(MEMOIZED, now_ms=DAY)
    assert redrawn is not None
    assert redrawn.fresh is not None
    assert redrawn.fresh.all()
    seal(outbox, MEMOIZED, redrawn)
    assert outbox.spent_by_day(namespace, DAY // DAY_MS) == {DAY // DAY_MS: 2_000_000}
