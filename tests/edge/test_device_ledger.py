"""The agent's ledger of one device across its streams (zeal_edge.device): the day cap, the
device hour rule and caps over 30 and 365 days, against a plain model of the rules (the
one the collector's test, tests/server/ingest/test_device_horizons.py, holds the collector
to), and what an earlier run booked in the outbox counts."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from zeal.policy import DAY_MS, HOUR_MS
from zeal_edge.device import DeviceLedger
from zeal_edge.outbox import Outbox
from zeal_edge.records import SealedBatch

MICRO = 1_000_000


def allowed(
    days: Counter[int], hours: Counter[int], stamp: int, cost: int, caps: dict[int, int]
) -> bool:
    """The rules, from docs/privacy.md: the day's spend within the day cap, the hour's
    within the larger of a twelfth of it and the reading, every window of N days holding
    the day within the N-day cap."""
    day, hour = stamp // DAY_MS, stamp // HOUR_MS
    if days[day] + cost > caps[1] or hours[hour] + cost > max(caps[1] * 2 // 24, cost):
        return False
    return all(
        sum(days[d] for d in range(start, start + n)) + cost <= cap
        for n, cap in caps.items()
        if n > 1
        for start in range(day - n + 1, day + 1)
    )


def test_the_ledger_admits_what_the_rules_admit(tmp_path: Path) -> None:
    """2,000 readings of two streams (epsilon 0.5 and 2) at random times over 5 days, then
    80, not in time order (a backfill), under a day cap of 8, a 30-day cap of 60 and a 365-day cap
    of 150: the ledger admits exactly the model's, and the hour rule, the day, 30 and 365
    days all bind at some point."""
    outbox = Outbox(tmp_path / "outbox.sqlite")
    for stream in ("a", "b"):
        outbox.ensure(stream, "home")
    ledger = DeviceLedger(outbox, "home", 8.0, ["a", "b"], rolling={30: 60.0, 365: 150.0})
    caps = {1: 8 * MICRO, 30: 60 * MICRO, 365: 150 * MICRO}
    rng = random.Random(64)
    days: Counter[int] = Counter()
    hours: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    start = 20_000 * DAY_MS
    for k in range(2000):  # the first 300 within 5 days: the day cap binds there
        stamp = start + rng.randrange((5 if k < 300 else 80) * DAY_MS)
        cost = rng.choice([MICRO // 2, 2 * MICRO])
        expected = allowed(days, hours, stamp, cost, caps)
        taken = ledger.take(stamp, cost)
        assert (taken is None) == expected, (stamp, cost, taken)
        if taken is None:
            days[stamp // DAY_MS] += cost
            hours[stamp // HOUR_MS] += cost
        else:
            kinds[taken[0]] += 1
    assert set(kinds) == {"day", "hour", "30 days", "365 days"}, kinds
    assert sum(days.values()) <= 150 * MICRO


def test_what_the_outbox_booked_counts_after_a_restart(tmp_path: Path) -> None:
    """A new ledger (the agent restarted) reads the device's booked days and hours of every
    stream from the outbox: an hour already holding a reading admits no other at the
    default cap, a 30-day cap already spent admits nothing."""
    outbox = Outbox(tmp_path / "outbox.sqlite")
    day = 20_000
    for k, stream in enumerate(("a", "b")):
        ns = outbox.ensure(stream, "home")
        outbox.commit_batches(
            [
                SealedBatch(
                    ns,
                    0,
                    b"x",
                    5,
                    5 * MICRO,
                    days=((day - 10 * k, 5 * MICRO),),
                    hours=(((day - 10 * k) * 24, 5 * MICRO),),
                )
            ],
            now_ms=day * DAY_MS,
            fingerprint="f",
        )
    ledger = DeviceLedger(outbox, "home", 8.0, ["a", "b"])
    assert ledger.take(day * DAY_MS, MICRO) == ("hour", day * 24, 5 * MICRO, MICRO)
    assert ledger.take(day * DAY_MS + HOUR_MS, MICRO) is None
    assert ledger.take(day * DAY_MS + 2 * HOUR_MS, 3 * MICRO) == ("day", day, 6 * MICRO, 8 * MICRO)
    capped = DeviceLedger(outbox, "home", 8.0, ["a", "b"], rolling={30: 10.5})
    first = day + 1 - 29  # the first window holding day + 1 holds both booked days
    assert capped.take((day + 1) * DAY_MS, MICRO) == ("30 days", first, 10 * MICRO, 10_500_000)


def test_caps_told_by_the_server_lower_the_ceiling_and_never_raise_it(tmp_path: Path) -> None:
    """The agent's own caps are its ceiling: a cap its server tells it below them is
    adopted (its streams' shares follow), one above is refused (the ceiling stays), a
    horizon the agent has no cap of takes the server's; a new ledger on the same outbox
    (a restart) starts from what was adopted."""
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.ensure("a", "home")
    ledger = DeviceLedger(outbox, "home", 8.0, ["a", "b"])
    assert ledger.learn({1: 4.0, 30: 20.0, 365: None}) == []
    assert (ledger.cap_micro, ledger.rolling, ledger.share("a")) == (
        4 * MICRO,
        {30: 20 * MICRO},
        2 * MICRO,
    )
    assert ledger.learn({1: 9.0}) == [1]  # above the ceiling of 8: refused
    assert ledger.cap_micro == 8 * MICRO
    outbox.set_learned_caps("home", 3, 0, {1: 2.0, 30: None, 365: None})
    again = DeviceLedger(outbox, "home", 8.0, ["a"])
    assert (again.cap_micro, again.rolling) == (2 * MICRO, {})
