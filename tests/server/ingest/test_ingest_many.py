"""Ingest stores a transaction's messages side by side with the outcome of storing them one at
a time in topic order: message for message, row for row.

The same seeded mix (fresh batches of 1 to 700 readings across buckets, hours and days,
redeliveries, outbox resets, a sequence sent twice in one transaction, devices running past
a tight privacy policy, corrupt payloads, foreign fingerprints, bad topics, unknown streams,
implausible times, a closed stream's strangers) goes into one database in transactions of
up to 300 messages, and into another one message per transaction. Outcomes and every table
(by names, not ids) must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from tests.server.helpers import postgres_database
from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import (
    Device,
    DevicePeriod,
    Principal,
    PrincipalDay,
    Reject,
    Segment,
    Stream,
)
from zeal_server.store.segments import decode
from zeal_server.store.sums import VALUE_COLUMNS

HOUR, DAY = 3_600_000, 86_400_000
DEVICES = ["a", "a-b", "b", "c1", "c10", "c2", "d", "e"]


@pytest.fixture(params=["sqlite", "postgresql"])
def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'many.sqlite'}", f"sqlite:///{tmp_path / 'one.sqlite'}"
        return
    first, second = postgres_database(), postgres_database()
    yield next(first), next(second)
    for database in (first, second):
        next(database, None)


def streams(url: str, now: int) -> Any:
    """A migrated database with the streams `tight` (a policy of 40 readings a day, so 4
    an hour), `loose` and `closed` (enrolled devices only: `a`), and its session maker."""
    engine = make_engine(url)
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        store.create_stream(
            session, name="tight", lower=0, upper=110, epsilon=1, max_epsilon_per_day=40
        )
        store.create_stream(
            session, name="loose", lower=-5, upper=5, epsilon=2, max_epsilon_per_day=1e6
        )
        store.create_stream(
            session, name="closed", lower=0, upper=1, epsilon=1, enrolled_only=True,
            max_epsilon_per_day=1e6,
        )  # fmt: skip
        closed = store.stream_by_name(session, "closed")
        assert closed is not None
        store.enroll(session, closed, "a")
        session.execute(Stream.__table__.update().values(created_ms=now - 3 * DAY))
        session.execute(Device.__table__.update().values(first_seen_ms=now, last_seen_ms=now))
    return engine, sessions


def mix(seed: int, now: int, count: int) -> list[tuple[str, bytes, int]]:
    """`count` messages of every kind, in arrival order, each with its arrival time."""
    rng = np.random.default_rng(seed)
    params = {
        "tight": Zeal(lower=0, upper=110, epsilon=1, max_epsilon_per_day=40),
        "loose": Zeal(lower=-5, upper=5, epsilon=2, max_epsilon_per_day=1e6),
        "closed": Zeal(lower=0, upper=1, epsilon=1, max_epsilon_per_day=1e6),
    }
    sent: list[tuple[str, str, bytes]] = []
    sequences: dict[tuple[str, str], int] = {}
    out = []
    for _ in range(count):
        stream = ["tight", "tight", "loose", "loose", "closed"][int(rng.integers(0, 5))]
        device = DEVICES[int(rng.integers(0, len(DEVICES)))]
        topic = f"zeal/v1/{stream}/{device}/up"
        received = now + int(rng.integers(0, 1000))
        roll = rng.random()
        if sent and roll < 0.12:  # a redelivery, or another copy within the transaction
            topic, payload = sent[int(rng.integers(max(0, len(sent) - 30), len(sent)))][::2]
            out.append((topic, payload, received))
            continue
        p = params[stream]
        size = [1, 1, 1, 3, 10, 60, 700][int(rng.integers(0, 7))]
        # Within the two whole UTC days before today's: how many readings fall on one day
        # (the device cap's) must not depend on the time of day the suite runs at.
        start = now - now % DAY - int(rng.integers(1, 2 * DAY))
        if rng.random() < 0.5:
            stamps = start + int(rng.integers(0, 100_000)) * np.arange(size)
        else:
            stamps = start + np.concatenate([[0], np.cumsum(rng.integers(0, 60_000, size - 1))])
        stamps = np.minimum(stamps, now + 1000)
        key = (stream, device)
        sequence = sequences.get(key, 0)
        if roll < 0.17 and sequence:  # an outbox that started again: old number, new content
            sequence = int(rng.integers(0, sequence))
        elif 0.24 <= roll < 0.27:  # a jump far beyond its numbering; sometimes it goes on
            sequence = [2**63 - 1, 2**64 - 1, sequence + 70_000][int(rng.integers(0, 3))]
            if sequence < 2**63 - 1 and rng.random() < 0.5:  # from there (it renumbered)
                sequences[key] = sequence + 1
        else:
            sequences[key] = sequence + 1
        if roll > 0.97:  # too far in the future, or before the stream
            stamps = stamps + [2 * HOUR, -10 * DAY][int(rng.integers(0, 2))]
        codes = p.perturb(rng.uniform(p.lower, p.upper, size), rng=rng)
        payload = encode_batch(
            p, stream=stream, device=device, sequence=sequence, timestamps=stamps, codes=codes
        )
        if 0.17 <= roll < 0.2:  # damaged on the way
            data = bytearray(payload)
            data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
            payload = bytes(data[: int(rng.integers(1, len(data) + 1))])
        elif 0.2 <= roll < 0.22:  # another device's payload on this topic
            topic = f"zeal/v1/{stream}/{DEVICES[int(rng.integers(0, len(DEVICES)))]}/up"
        elif 0.22 <= roll < 0.23:
            topic = f"zeal/v1/nowhere/{device}/up"
        elif 0.23 <= roll < 0.24:
            topic = f"zeal/v1/{stream}/bad name/up"
        sent.append((topic, stream, payload))
        out.append((topic, payload, received))
    return out


def contents(sessions: Any) -> dict[str, Any]:
    """Every table, by names: what a one-message-at-a-time ingest must also have written."""
    with sessions() as s:
        names = {d.id: (d.stream_id, d.name) for d in s.scalars(select(Device))}
        streams_ = {x.id: x.name for x in s.scalars(select(Stream))}
        dev = {i: (streams_[sid], name) for i, (sid, name) in names.items()}
        bits = {x.id: store.params_of(x).payload_bits for x in s.scalars(select(Stream))}
        buckets = {x.id: x.bucket_seconds * 1000 for x in s.scalars(select(Stream))}

        readings: dict[Any, list[Any]] = {}
        limbs: dict[str, list[int]] = {}
        for seg in s.scalars(select(Segment)):
            columns = decode(seg.data, seg.encoding, bits[seg.stream_id])
            name = streams_[seg.stream_id]
            acc = limbs.setdefault(name, [0] * len(VALUE_COLUMNS))
            for i, c in enumerate(VALUE_COLUMNS):
                acc[i] += getattr(seg, c)
            for device, stamp, code in zip(
                columns.devices.tolist(),
                columns.timestamps.tolist(),
                columns.codes.tolist(),
                strict=True,
            ):
                key = (name, stamp // buckets[seg.stream_id])
                readings.setdefault(key, []).append((dev[device], stamp, code))
        return {
            "devices": sorted(
                (
                    dev[d.id],
                    d.first_seen_ms,
                    d.last_seen_ms,
                    d.readings,
                    d.batches,
                    d.bytes,
                    d.duplicates,
                    d.sequence_resets,
                )
                for d in s.scalars(select(Device))
            ),
            "sequences": sorted(
                (
                    dev[d.id],
                    d.seq_floor,
                    d.seq_head,
                    d.seq_bits,
                    d.seq_recent,
                    d.seq_newest_ms,
                    d.missing,
                    d.late,
                )
                for d in s.scalars(select(Device))
            ),
            "ledger": sorted(
                (dev[r.device_id], r.hours, r.period, r.readings)
                for r in s.scalars(select(DevicePeriod))
                if r.readings
            ),
            "device caps": sorted(
                (p.name, d.period, d.micro)
                for p, d in s.execute(
                    select(Principal, PrincipalDay).join(
                        PrincipalDay, PrincipalDay.principal_id == Principal.id
                    )
                )
                if d.micro
            ),
            "sums": limbs,
            "readings": {k: sorted(v) for k, v in readings.items()},
            "rejects": sorted(
                (r.stream, r.device, r.reason, r.count, r.last_ms)
                for r in s.scalars(select(Reject))
            ),
        }


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "device_cap"), [(1, None), (2, None), (3, 3000.0)])
def test_a_transaction_of_many_messages_stores_what_one_at_a_time_stores(
    two_databases: tuple[str, str], seed: int, device_cap: float | None
) -> None:
    """1,200 messages of every kind (sequence jumps, and devices that renumber, too):
    transactions of up to 300 give the outcomes and rows of
    one transaction per message in topic order; with a device cap across streams too (a
    device's batches in three streams then meet both its streams' policies and its cap)."""
    now = store.now_ms()
    messages = mix(seed, now, 1200)
    limits: dict[str, Any] = {"max_future_ms": 600_000, "max_age_ms": 7 * DAY, "backfill_ms": DAY}
    limits["device_max_epsilon_per_day"] = device_cap
    rng = np.random.default_rng(seed)
    (engine_many, many), (engine_one, one) = (streams(url, now) for url in two_databases)
    together, alone = (
        Ingest(max_buckets=300, **limits),
        Ingest(max_buckets=300, **limits),
    )
    got, expected = [], []
    first = 0
    while first < len(messages):
        chunk = messages[first : first + int(rng.integers(1, 301))]
        first += len(chunk)
        with many() as session, session.begin():
            got.extend(together.add_many(session, chunk))
        order = sorted(range(len(chunk)), key=lambda i: chunk[i][0])
        outcomes: dict[int, Any] = {}
        for i in order:
            with one() as session, session.begin():
                outcomes[i] = alone.add(session, *chunk[i])
        expected.extend(outcomes[i] for i in range(len(chunk)))
    assert got == expected
    statuses = {o.status for o in got} | {o.reason for o in got}
    kinds = ["stored", "duplicate", "over_budget", "fingerprint_mismatch", "bad_topic"]
    kinds += ["sequence_jump"]
    for kind in kinds + ["device_cap"] * (device_cap is not None):
        assert kind in statuses, kind  # the mix reached every path
    assert ("device_cap" in statuses) == (device_cap is not None)
    assert any(o.reset for o in got)
    try:
        assert contents(many) == contents(one)
    finally:
        engine_many.dispose()
        engine_one.dispose()
