"""One device across streams: its daily cap (ZEAL_DEVICE_MAX_EPSILON_PER_DAY) bounds what
it stores over all its streams with a policy, on SQLite and PostgreSQL; the rest is counted
as device_cap, and nothing is booked for it on any ledger."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from tests.server.ingest.homes import STREAMS, one_reading
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.models import DevicePeriod, PrincipalDay, Reject, Stream


def hourly(
    device: str, day: int, streams: tuple[str, ...] = STREAMS, policy: float | None = 8.0
) -> list[tuple[str, bytes]]:
    """One reading an hour of `day` into each stream, one batch each, in time order."""
    out = []
    for hour in range(24):
        for k, stream in enumerate(streams):
            stamp = day * DAY_MS + hour * HOUR_MS + k
            payload = one_reading(stream, device, hour, stamp, policy)
            out.append((f"zeal/v1/{stream}/{device}/up", payload))
    return out


def ledgers(sessions: Any) -> tuple[int, int, dict[str, int]]:
    with sessions() as s:
        day_rows = s.scalar(
            select(func.coalesce(func.sum(DevicePeriod.readings), 0)).where(
                DevicePeriod.hours == 24
            )
        )
        micro = s.scalar(select(func.coalesce(func.sum(PrincipalDay.micro), 0)))
        rejects: dict[str, int] = {}
        for r in s.scalars(select(Reject)):
            rejects[r.reason] = rejects.get(r.reason, 0) + r.count
    return int(day_rows), int(micro), rejects


@pytest.mark.parametrize("together", [False, True])
def test_three_streams_store_at_most_the_device_cap_in_a_day(sessions: Any, together: bool) -> None:
    """24 hours x 3 streams at epsilon 1 (72 readings, 8 a stream allowed by each policy):
    8 stored in all, whether the messages come one per transaction or all in one. One by
    one, the device hour rule (one reading an hour at the default cap of 8) stores the
    first stream's reading of hours 0 to 7 and refuses the other streams' as device_cap;
    from hour 8 the first stream is over its own policy (over_budget, which is said first)
    and the others at the day cap. In one transaction, as one by one in topic order
    (ingest's rule): the same 8, the same refusals."""
    now = store.now_ms()
    yesterday = day_of(now) - 1
    ingest = Ingest(max_age_ms=7 * DAY_MS, device_max_epsilon_per_day=8.0)
    messages = [(t, p, now) for t, p in hourly("home-1", yesterday)]
    outcomes = []
    chunks = [messages] if together else [[m] for m in messages]
    for chunk in chunks:
        with sessions() as session, session.begin():
            outcomes.extend(ingest.add_many(session, chunk))
    stored = [o for o in outcomes if o.status == "stored"]
    assert len(stored) == 8
    refused = [o.reason for o in outcomes if o.status != "stored"]
    assert [(o.stream, o.sequence) for o in stored] == [(STREAMS[0], h) for h in range(8)]
    expected = {"over_budget": 16, "device_cap": 48}
    assert {r: refused.count(r) for r in set(refused)} == expected
    readings, micro, rejects = ledgers(sessions)
    assert (readings, micro) == (8, 8_000_000)  # nothing refused is left on a ledger
    assert rejects == expected


def test_a_device_cap_and_a_tag_cap_override_the_default(sessions: Any) -> None:
    """A tag's cap applies to every device carrying it in any stream; a device's own cap
    wins over it; removing it brings the tag's back."""
    now = store.now_ms()
    yesterday = day_of(now) - 1
    with sessions() as session, session.begin():
        stream = store.stream_by_name(session, "humidity")
        assert stream is not None
        for name in ("flat-1", "flat-2"):
            row, _ = store.enroll(session, stream, name)
            store.set_tags(session, row, {"site": "north"})
        store.set_tag_cap(session, "site", "north", 3.0)
        store.set_device_cap(session, "flat-2", 5.0)
    ingest = Ingest(max_age_ms=7 * DAY_MS, device_max_epsilon_per_day=8.0)
    for device, expected in (("flat-1", 3), ("flat-2", 5), ("flat-3", 8)):
        with sessions() as session, session.begin():
            outcomes = ingest.add_many(session, [(t, p, now) for t, p in hourly(device, yesterday)])
        assert sum(o.status == "stored" for o in outcomes) == expected, device
    with sessions() as session, session.begin():
        budget = store.device_budget(session, "flat-1", 8.0, yesterday)
        assert (budget.max_epsilon_per_day, budget.source, budget.tag) == (3.0, "tag", "site:north")
        assert budget.spent_micro == 3_000_000
        store.set_device_cap(session, "flat-2", None)
        assert store.device_budget(session, "flat-2", 8.0, yesterday).source == "tag"


def test_a_stream_without_a_policy_is_outside_the_device_cap(sessions: Any) -> None:
    """A stream created without a policy (max_epsilon_per_day null) bounds nothing, and its
    readings are not counted on the device's cap either."""
    now = store.now_ms()
    with sessions() as session, session.begin():
        store.create_stream(
            session, name="open", lower=0, upper=100, epsilon=1, max_epsilon_per_day=None
        )
        session.execute(Stream.__table__.update().values(created_ms=0))
    ingest = Ingest(max_age_ms=7 * DAY_MS, device_max_epsilon_per_day=8.0)
    with sessions() as session, session.begin():
        outcomes = ingest.add_many(
            session, [(t, p, now) for t, p in hourly("home-2", day_of(now) - 1, ("open",), None)]
        )
    assert all(o.status == "stored" for o in outcomes)
    assert len(outcomes) == 24
    assert ledgers(sessions)[1] == 0
