"""An existing database converts in place (revisions 0007 to 0011) on SQLite and PostgreSQL: every
figure the previous code served from it is served again to the last bit, before and after
compaction turns its rows into chunks, and `verify` passes; a database whose aggregates
disagree with its segments is refused and left as it was.

The fixture (tests/server/store/data/store_0006.json) was written by the code of d89e174, the last
commit at schema 0006, with tools/legacy_store.py: its tables' rows and its answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, func, inspect, select, text

from tools.legacy_store import QUERIES, STATS, export_digest
from zeal import encode_batch
from zeal.estimate import cut
from zeal_server import store
from zeal_server.app import create_app
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings
from zeal_server.store.db import MIGRATIONS, make_engine, migrate
from zeal_server.store.models import Segment
from zeal_server.store.segments import CHUNK

FIXTURE = json.loads((Path(__file__).parent / "data" / "store_0006.json").read_text())
#: Tables in an order their foreign keys allow.
ORDER = [
    "streams",
    "devices",
    "device_tags",
    "device_days",
    "device_hours",
    "batches",
    "aggregates",
    "bucket_totals",
    "segments",
    "rejects",
]


def load_0006(url: str, change: Any = None) -> Engine:
    """A database at revision 0006 holding the fixture's rows (`change` may alter them)."""
    engine = make_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    tables = json.loads(json.dumps(FIXTURE["tables"]))
    if change is not None:
        change(tables)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0006")
        meta = MetaData()
        meta.reflect(connection)
        for name in ORDER:
            columns, rows = tables[name]["columns"], tables[name]["rows"]
            values = [
                {
                    c: base64.b64decode(v["b64"]) if isinstance(v, dict) else v
                    for c, v in zip(columns, row, strict=True)
                }
                for row in rows
            ]
            if values:
                connection.execute(meta.tables[name].insert(), values)
        if engine.dialect.name == "postgresql":  # ids were given: move the sequences past them
            for name in ("streams", "devices", "segments"):
                sequence = f"pg_get_serial_sequence('{name}', 'id')"
                connection.execute(text(f"SELECT setval({sequence}, max(id)) FROM {name}"))
    return engine


def withdrawn(query: dict[str, Any]) -> bool:
    """Asked of the old code, but no longer served: paired time blocks (docs/comparison.md)."""
    return query.get("method") == "paired_blocks"


def answers(url: str) -> dict[str, Any]:
    """The fixture's questions, answered by this code. A comparison's `estimand`, and its
    `group_a`, `group_b` and `independent` (the new names of its `a`, `b` and `unit`), a
    device's `rejects`, `missing`, `late` and `account` (across streams, which depends on
    the day the test runs), and a series point's `quantile` were added
    after the fixture was written and are left out; a withdrawn question must answer 422
    and is left out too."""
    settings = ServerSettings.from_env({"ZEAL_DATABASE_URL": url, "ZEAL_MQTT_URL": "off"})
    out: dict[str, Any] = {}
    with TestClient(create_app(settings)) as client:
        for path, query in QUERIES:
            reply = client.get(f"/api/v1/streams/{path}", params=query)
            if withdrawn(query):
                assert reply.status_code == 422, reply.text
                continue
            assert reply.status_code == 200, reply.text
            body = reply.json()
            if path.endswith("/compare"):
                for added in ("estimand", "group_a", "group_b", "independent"):
                    body.pop(added)
            if path.endswith("/devices"):
                for device in body["devices"]:
                    device.pop("rejects")
                    device.pop("account")
                    # added by revision 0012, which starts them at 0
                    assert (device.pop("missing"), device.pop("late")) == (0, 0)
            if path.endswith("/series"):
                for point in body["points"]:
                    assert point.pop("quantile") is None  # added with quantile=, not asked
            out[json.dumps([path, query], sort_keys=True)] = body
        for name in ("temps", "wide"):
            stats = client.get(f"/api/v1/streams/{name}/stats").json()
            out[f"{name}/stats"] = {k: stats[k] for k in STATS}
            exported = client.get(f"/api/v1/streams/{name}/export", params={"times": "epoch"})
            # the columns the recorded answers have (the code came later)
            rows = [line.split(",") for line in exported.text.splitlines()]
            out[f"{name}/export"] = export_digest([",".join(r[:2] + r[3:]) for r in rows])
    return out


def numerical(answer: Any, inside_bayes: bool = False) -> Any:
    """An answer with its Bayes figures made approximate. Those are numerical (numpy's exp
    and log on a grid, and a BLAS dot product, whose kernels depend on the CPU): they
    differed in the last two bits on another machine's CI. Every other figure (AVG*, the
    intervals, the counts) is computed from exact integer sums and compared exactly."""
    if isinstance(answer, dict):
        return {k: numerical(v, inside_bayes or k == "bayes") for k, v in answer.items()}
    if isinstance(answer, list):
        return [numerical(v, inside_bayes) for v in answer]
    if inside_bayes and isinstance(answer, float):
        return pytest.approx(answer, rel=1e-12)
    return answer


#: The streams' ranges in the fixture (tools/legacy_store.py).
RANGES = {"temps": (0.0, 110.0), "wide": (-40.0, 60.0)}


def cut_as_now(key: str, answer: Any) -> Any:
    """A recorded answer with its intervals cut as this code serves them (zeal.estimate.cut:
    an average's to the stream's range, a comparison's to plus or minus its width); the
    recorded ends were not cut. Every figure stays exact."""
    if not key.startswith("["):
        return answer
    path = json.loads(key)[0]
    lower, upper = RANGES[path.split("/")[0]]

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if "estimate" in out and isinstance(out["estimate"], dict):
                e = out["estimate"]
                for band in ("ci", "guaranteed"):
                    e[band] = list(cut(*e[band], lower, upper))
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    answer = walk(answer)
    if path.endswith("/compare") and answer.get("ci") is not None:
        answer["ci"] = list(cut(*answer["ci"], lower - upper, upper - lower))
    return answer


def problems(engine: Engine) -> list[str]:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return [p for s in store.list_streams(session) for p in store.verify(session, s)]


def test_a_0006_database_converts_in_place_and_serves_the_same_figures(
    database_url: str, request: pytest.FixtureRequest
) -> None:
    """After the upgrade, and again after compaction made chunks of every row: the same
    answers as the previous code gave (averages, series, comparisons, devices, stats,
    export), verify clean, the old tables gone; then new batches are stored as usual."""
    engine = load_0006(database_url)
    # Closed even when an assertion fails: a connection left to the garbage collector
    # fails whichever test runs when it is collected (a ResourceWarning).
    request.addfinalizer(engine.dispose)
    before, after = migrate(engine)
    assert (before, after) == ("0006", "0018")
    old = {"aggregates", "bucket_totals", "device_days", "device_hours", "batches"}
    assert old.isdisjoint(inspect(engine).get_table_names())
    kept: dict[int, set[int]] = {}
    for device_id, sequence, *_ in FIXTURE["tables"]["batches"]["rows"]:
        kept.setdefault(device_id, set()).add(sequence)
    with engine.connect() as connection:  # 0012: each device's dedup rows became its state
        states = connection.execute(
            text("SELECT id, seq_floor, seq_head FROM devices WHERE seq_head IS NOT NULL")
        ).all()
    assert {d: (floor, head) for d, floor, head in states} == {
        d: (min(set(range(min(s), max(s) + 2)) - s), max(s)) for d, s in kept.items()
    }
    with engine.connect() as connection:  # 0009: the ledger's days and hours in one table
        ledger = connection.execute(text("SELECT * FROM device_periods")).all()
    assert sorted(tuple(row) for row in ledger) == sorted(
        (d, hours, p, n)
        for table, hours in (("device_days", 24), ("device_hours", 1))
        for d, p, n in FIXTURE["tables"][table]["rows"]
    )
    with engine.connect() as connection:  # 0013: every device name a principal, default cap
        principals = connection.execute(text("SELECT name, max_epsilon_per_day FROM principals"))
        names = connection.execute(text("SELECT DISTINCT name FROM devices")).scalars().all()
        assert sorted(tuple(r) for r in principals) == sorted((n, None) for n in names)
    if engine.dialect.name == "sqlite":  # 0008: SUM over the sums reads no overflow pages
        assert [c["name"] for c in inspect(engine).get_columns("segments")][-1] == "data"
    expected = {
        key: numerical(cut_as_now(key, answer))
        for key, answer in FIXTURE["answers"].items()
        if not key.startswith("[") or not withdrawn(json.loads(key)[1])
    }
    assert answers(database_url) == expected
    assert problems(engine) == []

    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        for stream in store.list_streams(session):
            store.compact(session, stream)
        encodings = dict(
            session.execute(select(Segment.encoding, func.count()).group_by(Segment.encoding)).all()
        )
    assert set(encodings) == {CHUNK}
    assert answers(database_url) == expected
    assert problems(engine) == []

    with Session(engine) as session, session.begin():
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        params = store.params_of(stream)
        late = encode_batch(
            params,
            stream="temps",
            device="dev9",
            sequence=0,
            codes=np.full(4, params.code_min, dtype=np.uint64),
            timestamps=1_767_225_600_000 + np.arange(4) * 1000,
        )
        outcome = Ingest().add(session, "zeal/v1/temps/dev9/up", late, 1_767_225_700_000)
    assert outcome.status == "stored"
    assert problems(engine) == []
    engine.dispose()


def test_a_0006_database_whose_aggregates_disagree_is_left_as_it_was(database_url: str) -> None:
    """One aggregate row off by one reading: the upgrade stops with the mismatch named, and
    the database is still at 0006 with every table as it was."""

    def tamper(tables: dict[str, Any]) -> None:
        columns = tables["aggregates"]["columns"]
        tables["aggregates"]["rows"][7][columns.index("n")] += 1

    engine = load_0006(database_url, tamper)
    with pytest.raises(Exception, match=r"aggregates .* != segments"):
        migrate(engine)
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT version_num FROM alembic_version")) == "0006"
        counts = {
            name: connection.scalar(text(f"SELECT count(*) FROM {name}"))
            for name in ("segments", "aggregates", "bucket_totals", "batches")
        }
    assert counts == {
        name: len(FIXTURE["tables"][name]["rows"])
        for name in ("segments", "aggregates", "bucket_totals", "batches")
    }
    engine.dispose()
