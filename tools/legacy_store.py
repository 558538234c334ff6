"""A database as schema revision 0006 stored it, and the figures that code served from it:
the fixture of tests/server/store/test_store_upgrade.py (written once, committed).

Run it with the code of a revision at schema 0006 first on the path, e.g. from a git
worktree of d89e174 (the last commit with the aggregates table):

    git worktree add --detach /tmp/zeal-0006 d89e174
    PYTHONPATH=/tmp/zeal-0006/shared:/tmp/zeal-0006/server .venv/bin/python \\
        tools/legacy_store.py tests/server/store/data/store_0006.json

It fills a SQLite database through that code's own ingest (two streams of different code
widths and buckets; tagged devices; compacted buckets, raw parts, a late batch into a
compacted bucket, a redelivery and an outbox reset), asks that code's API for averages,
series, comparisons, devices, stats and the CSV export, and writes every table's rows
(bytes as base64) with those answers as one JSON document.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import inspect, select, text

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
#: The API calls whose answers must not change (path under /api/v1/streams, query).
QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("temps/average", {}),
    ("temps/average", {"group": "site:north"}),
    ("temps/average", {"start": "2026-01-01T00:37:00Z", "end": "2026-01-01T02:11:00Z"}),
    ("temps/average", {"device": "dev3"}),
    ("temps/average", {"exclude": "implausible"}),
    ("temps/average", {"estimator": "bayes"}),
    ("temps/series", {"interval": 600}),
    ("temps/series", {"interval": 1800, "group": "site:south"}),
    ("temps/compare", {"a": "site:north", "b": "site:south"}),
    ("temps/compare", {"a": "site:north", "b": "site:south", "method": "device_means"}),
    ("temps/compare", {"a": "site:north", "b": "site:south", "unit": "reading"}),
    (  # withdrawn since (docs/comparison.md): the upgrade test expects a 422 for it
        "temps/compare",
        {"a": "site:north", "b": "site:south", "block_seconds": 1800, "method": "paired_blocks"},
    ),
    ("temps/devices", {"sort": "name"}),
    ("wide/average", {}),
    ("wide/series", {"interval": 3600}),
    ("wide/devices", {"sort": "name"}),
]
#: What /stats must still say after the upgrade (the store figures change by design).
STATS = ["readings", "messages", "devices", "bytes_received", "duplicates", "sequence_resets"]


def fill(sessions: Any) -> None:
    from zeal import encode_batch
    from zeal_server import store

    rng = np.random.default_rng(6)
    ingest = store.Ingest()
    with sessions() as session, session.begin():
        temps = store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6
        )
        wide = store.create_stream(
            session,
            name="wide",
            lower=-40,
            upper=60,
            epsilon=2,
            payload_bits=12,
            bucket_seconds=3600,
            max_epsilon_per_day=1e6,
        )
        streams = {"temps": (temps, store.params_of(temps)), "wide": (wide, store.params_of(wide))}

    def send(name: str, device: str, sequence: int, *, start: int, n: int, level: float) -> bytes:
        params = streams[name][1]
        codes = params.perturb(np.full(n, level) + rng.normal(0, 5, n), rng=rng)
        stamps = start + np.sort(rng.integers(0, 30_000 * n, n))
        payload = encode_batch(
            params, stream=name, device=device, sequence=sequence, codes=codes, timestamps=stamps
        )
        with sessions() as session, session.begin():
            outcome = ingest.add(session, f"zeal/v1/{name}/{device}/up", payload, int(stamps[-1]))
        assert outcome.status == "stored", outcome
        return payload

    for d in range(6):
        for s in range(8):
            send(
                "temps", f"dev{d}", s, start=T0 + s * 1_200_000 + d * 7_000, n=40, level=40 + 4 * d
            )
        for s in range(6):
            send("wide", f"w{d}", s, start=T0 + s * 4 * 3_600_000, n=30, level=5 * d - 10)
    with sessions() as session, session.begin():
        for name in ("temps", "wide"):
            store.compact(session, streams[name][0], before_bucket=T0 // 60_000 + 90)
    payload = send("temps", "dev1", 8, start=T0 + 600_000, n=12, level=70)  # late, compacted
    with sessions() as session, session.begin():  # a redelivery: a duplicate
        assert ingest.add(session, "zeal/v1/temps/dev1/up", payload, T0 + 10**7).status == (
            "duplicate"
        )
    send("temps", "dev2", 3, start=T0 + 170 * 60_000, n=10, level=90)  # a reset: 3 again
    with sessions() as session, session.begin():
        temps = store.stream_by_name(session, "temps")
        for device in store.devices_of(session, temps):
            number = int(device.name[3:])
            store.set_tags(session, device, {"site": "north" if number % 2 else "south"})


def dump(engine: Any) -> dict[str, dict[str, list[Any]]]:
    """Every table's columns and rows (bytes as {"b64": ...})."""
    tables: dict[str, dict[str, list[Any]]] = {}
    with engine.connect() as connection:
        for name in inspect(engine).get_table_names():
            if name in ("alembic_version", "installation"):
                continue
            result = connection.execute(text(f"SELECT * FROM {name}"))
            tables[name] = {
                "columns": list(result.keys()),
                "rows": [
                    [
                        {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v
                        for v in row
                    ]
                    for row in result
                ],
            }
    return tables


def answers(app: Any) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    out: dict[str, Any] = {}
    with TestClient(app) as client:
        for path, query in QUERIES:
            reply = client.get(f"/api/v1/streams/{path}", params=query)
            assert reply.status_code == 200, reply.text
            out[json.dumps([path, query], sort_keys=True)] = reply.json()
        for name in ("temps", "wide"):
            stats = client.get(f"/api/v1/streams/{name}/stats").json()
            out[f"{name}/stats"] = {k: stats[k] for k in STATS}
            lines = client.get(f"/api/v1/streams/{name}/export").text.splitlines()
            out[f"{name}/export"] = export_digest(lines)
    return out


def export_digest(lines: list[str]) -> list[Any]:
    """The CSV export as its header, its line count and the SHA-256 of its lines sorted
    (the order of rows within a bucket is not a figure)."""
    body = "\n".join(sorted(lines[1:])).encode()
    return [lines[0], len(lines) - 1, hashlib.sha256(body).hexdigest()]


def main() -> None:
    warnings.filterwarnings("ignore")
    from zeal_server.api import create_app
    from zeal_server.db import make_engine, migrate, session_factory
    from zeal_server.settings import ServerSettings

    target = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/legacy.sqlite"
        engine = make_engine(url)
        _, revision = migrate(engine)
        if revision != "0006":
            raise SystemExit(f"this code is at schema {revision}, not 0006")
        fill(session_factory(engine))
        with session_factory(engine)() as session:
            assert not [p for s in _streams(session) for p in _verify(session, s)]
        settings = ServerSettings.from_env({"ZEAL_DATABASE_URL": url, "ZEAL_MQTT_URL": "off"})
        document = {
            "revision": revision,
            "tables": dump(engine),
            "answers": answers(create_app(settings)),
        }
        engine.dispose()
    target.write_text(json.dumps(document, separators=(",", ":"), sort_keys=True) + "\n")


def _streams(session: Any) -> list[Any]:
    from zeal_server.models import Stream

    return list(session.scalars(select(Stream)))


def _verify(session: Any, stream: Any) -> list[str]:
    from zeal_server import store

    problems: list[str] = store.verify(session, stream)
    return problems


if __name__ == "__main__":
    main()
