"""Bytes on disk per reading, all in (python bench/store_footprint.py).

A fleet of devices reads once a second (each at its own phase, its clock jittering by up to
``--jitter`` ms), replaying the bundled Seattle temperatures; every reading is privatized
with the stream's mechanism and sent through the real ingest path (``Ingest.add_many``, in
transactions of the messages that arrive within 100 ms, as the collector gathers them),
into a real PostgreSQL database and a SQLite file, with the collector's housekeeping every
30 s of the simulated clock and ``ZEAL_MAX_AGE_SECONDS`` at its default (7 days). Three
fleet patterns:

* firmware: one reading per message, one reading per device and bucket (1 s buckets);
* gateway: 60 readings per message, one reading per device and bucket (1 s buckets);
* dense: 60 readings per message, 60 readings per device and bucket (60 s buckets).

Each figure is the *marginal* bytes over the empty schema (both after ``VACUUM FULL`` on
PostgreSQL, ``VACUUM`` on SQLite), per table with its indexes and TOAST, divided by the
readings stored. It is taken twice: at the end of ingest ("live": the import window has
not passed, every device's sequence state and the privacy ledger of the day are held),
and once the horizon has passed and the housekeeping has run ("settled": what a
long-lived store costs per reading); beside them the sequence states' own bytes per device
(``/stats``' ``store_bytes.sequence_state``). Beside them,
in the same database: a plain table ``(device_id int, ts timestamptz, value float8,
primary key (device_id, ts))`` holding the same readings, and the empirical entropy of the
codes; and what ``/stats`` reports as the stream's all-in bytes per reading.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Engine, text

from tools.testbed.databases import postgres_database, table_bytes, vacuum
from zeal import Zeal, encode_batch
from zeal.mqtt.topics import data_topic
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.settings import ServerSettings
from zeal_server.store import retention
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.footprint import sequence_state_bytes, stream_bytes

ROOT = Path(__file__).resolve().parents[1]


DATA = ROOT / "data" / "seattle-temps.csv"
MAX_AGE_MS = ServerSettings.max_age_seconds * 1000  # the default import window (7 days)
MAX_FUTURE_MS = 600_000
HOUSEKEEP_EVERY_MS = 30_000
STREAM = "temps"


@dataclass(frozen=True)
class Pattern:
    name: str
    per_message: int
    bucket_seconds: int
    what: str


PATTERNS = {
    p.name: p
    for p in (
        Pattern("firmware", 1, 1, "1 reading per message, 1 per device and bucket"),
        Pattern("gateway", 60, 1, "60 readings per message, 1 per device and bucket"),
        Pattern("dense", 60, 60, "60 readings per message, 60 per device and bucket"),
    )
}


@dataclass(frozen=True)
class Fleet:
    """Every device's readings: values, codes and timestamps (devices x readings)."""

    values: npt.NDArray[np.float64]
    codes: npt.NDArray[np.uint64]
    timestamps: npt.NDArray[np.int64]


def make_fleet(
    params: Zeal, devices: int, readings: int, *, t0: int, jitter: int, seed: int
) -> Fleet:
    with DATA.open(newline="") as handle:
        temps = np.array([float(r["temp"]) for r in csv.DictReader(handle)])
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, temps.size, size=devices)
    values = temps[(starts[:, None] + np.arange(readings)[None, :]) % temps.size]
    phases = rng.integers(0, 1000, size=devices)
    steps = 1000 + rng.integers(-jitter, jitter + 1, size=(devices, readings))
    steps[:, 0] = 0
    timestamps = t0 + phases[:, None] + np.cumsum(steps, axis=1)
    codes = params.perturb(values.ravel(), rng=rng).reshape(devices, readings)
    return Fleet(values, codes, timestamps.astype(np.int64))


def messages(params: Zeal, fleet: Fleet, per_message: int) -> list[tuple[int, str, bytes]]:
    """(received_ms, topic, payload) of every batch, in arrival order: a batch leaves when
    its last reading is taken and arrives 20 to 80 ms later."""
    rng = np.random.default_rng(7)
    out = []
    devices, readings = fleet.codes.shape
    for d in range(devices):
        device = f"dev{d:05d}"
        topic = data_topic(STREAM, device)
        for sequence, first in enumerate(range(0, readings, per_message)):
            stamps = fleet.timestamps[d, first : first + per_message]
            payload = encode_batch(
                params,
                stream=STREAM,
                device=device,
                sequence=sequence,
                codes=fleet.codes[d, first : first + per_message],
                timestamps=stamps,
            )
            out.append((int(stamps[-1]) + int(rng.integers(20, 81)), topic, payload))
    out.sort(key=lambda m: m[0])
    return out


def transactions(arrivals: list[tuple[int, str, bytes]]) -> Iterator[list[tuple[int, str, bytes]]]:
    """The messages that arrive within each 100 ms."""
    current: list[tuple[int, str, bytes]] = []
    window = None
    for message in arrivals:
        if current and message[0] // 100 != window:
            yield current
            current = []
        window = message[0] // 100
        current.append(message)
    if current:
        yield current


def housekeep(engine: Engine, ingest: Ingest, now_ms: int) -> None:
    """The collector's housekeeping at `now_ms` of the simulated clock."""
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        streams = store.list_streams(session)
        retention.housekeep(session, streams, now_ms, max_age_ms=ingest.max_age_ms)


@contextmanager
def database(kind: str) -> Iterator[str]:
    if kind == "postgresql":
        with postgres_database("zeal_footprint") as url:
            yield url
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/zeal.sqlite"


def plain_table_bytes(engine: Engine, fleet: Fleet) -> int:
    """Bytes of a plain table of the same readings (float8 values keyed by device and time)."""
    devices, readings = fleet.values.shape
    before = table_bytes(engine).get("plain_readings", 0)
    timestamp = "timestamptz" if engine.dialect.name == "postgresql" else "timestamp"
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE plain_readings (device_id int, ts {timestamp}, value float8, "
                "PRIMARY KEY (device_id, ts))"
            )
        )
    ids = np.repeat(np.arange(devices, dtype=np.int64), readings)
    stamps = fleet.timestamps.ravel()
    values = fleet.values.ravel()
    if engine.dialect.name == "postgresql":
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            with cursor.copy(  # type: ignore[attr-defined]
                "COPY plain_readings FROM STDIN"
            ) as copy:
                for d, t, v in zip(ids.tolist(), stamps.tolist(), values.tolist(), strict=True):
                    copy.write_row((d, _iso(t), v))
            raw.commit()
        finally:
            raw.close()
    else:
        rows = [
            {"d": d, "t": _iso(t), "v": v}
            for d, t, v in zip(ids.tolist(), stamps.tolist(), values.tolist(), strict=True)
        ]
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO plain_readings VALUES (:d, :t, :v)"), rows)
    vacuum(engine)
    size = table_bytes(engine)["plain_readings"] - before
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE plain_readings"))
    return size


def _iso(ms: int) -> str:
    seconds, milli = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{milli:03d}+00:00"


def entropy_bytes(codes: npt.NDArray[np.uint64]) -> float:
    """Bytes per code of the codes' empirical distribution."""
    _, counts = np.unique(codes, return_counts=True)
    p = counts / codes.size
    return float(-(p * np.log2(p)).sum()) / 8


def marginal(engine: Engine, empty: dict[str, int]) -> dict[str, int]:
    vacuum(engine)
    sizes = table_bytes(engine)
    return {t: sizes[t] - empty.get(t, 0) for t in sorted(sizes)}


def run(
    kind: str, pattern: Pattern, devices: int, readings: int, *, jitter: int, seed: int
) -> dict[str, Any]:
    with database(kind) as url:
        engine = make_engine(url)
        migrate(engine)
        vacuum(engine)
        empty = table_bytes(engine)
        sessions = session_factory(engine)
        with sessions() as session, session.begin():
            stream = store.create_stream(
                session,
                name=STREAM,
                lower=0,
                upper=110,
                epsilon=1,
                bucket_seconds=pattern.bucket_seconds,
                max_epsilon_per_day=86_400,
            )
            params = store.params_of(stream)
        t0 = (stream.created_ms // 60_000 + 1) * 60_000
        fleet = make_fleet(params, devices, readings, t0=t0, jitter=jitter, seed=seed)
        arrivals = messages(params, fleet, pattern.per_message)
        ingest = Ingest(max_future_ms=MAX_FUTURE_MS, max_age_ms=MAX_AGE_MS, max_buckets=1440)
        started = time.perf_counter()
        next_housekeeping = t0 + HOUSEKEEP_EVERY_MS
        stored = 0
        for group in transactions(arrivals):
            if group[0][0] >= next_housekeeping:
                housekeep(engine, ingest, group[0][0])
                next_housekeeping += HOUSEKEEP_EVERY_MS
            with sessions() as session, session.begin():
                outcomes = ingest.add_many(session, [(t, p, r) for r, t, p in group])
            stored += sum(o.readings for o in outcomes if o.status == "stored")
        ingest_seconds = time.perf_counter() - started
        if stored != devices * readings:
            raise SystemExit(f"stored {stored} of {devices * readings} readings")
        last = arrivals[-1][0]
        housekeep(engine, ingest, last + 1000)
        live = marginal(engine, empty)
        settled_at = last + MAX_AGE_MS + 2 * pattern.bucket_seconds * 1000 + 1000
        housekeep(engine, ingest, settled_at)
        settled = marginal(engine, empty)
        with sessions() as session:
            stream = store.stream_by_name(session, STREAM)
            assert stream is not None
            problems = store.verify(session, stream)
            reported = sum(stream_bytes(session, stream).values())
            state = sequence_state_bytes(session, stream)
        if problems:
            raise SystemExit(f"verify failed: {problems[:3]}")
        plain = plain_table_bytes(engine, fleet)
        engine.dispose()
    n = devices * readings
    return {
        "database": kind,
        "pattern": pattern.name,
        "devices": devices,
        "readings": n,
        "messages": len(arrivals),
        "ingest_seconds": round(ingest_seconds, 1),
        "live": {t: b / n for t, b in live.items()},
        "live_total": sum(live.values()) / n,
        "settled": {t: b / n for t, b in settled.items()},
        "settled_total": sum(settled.values()) / n,
        "live_ratio": sum(live.values()) / max(1, sum(settled.values())),
        "stats_reported": reported / n,
        "state_per_device": state / devices,
        "plain_table": plain / n,
        "code_entropy": entropy_bytes(fleet.codes.ravel()),
    }


def show(result: dict[str, Any]) -> None:
    print(
        f"\n{result['database']}, {result['pattern']} ({PATTERNS[result['pattern']].what}): "
        f"{result['devices']:,} devices, {result['readings']:,} readings in "
        f"{result['messages']:,} messages, ingested in {result['ingest_seconds']} s"
    )
    print(f"  {'table':<16} {'live B/reading':>15} {'settled B/reading':>18}")
    for table in sorted(result["settled"]):
        live, settled = result["live"][table], result["settled"][table]
        if abs(live) > 0.005 or abs(settled) > 0.005:
            print(f"  {table:<16} {live:>15.2f} {settled:>18.2f}")
    print(f"  {'all in':<16} {result['live_total']:>15.2f} {result['settled_total']:>18.2f}")
    print(
        f"  sequence state {result['state_per_device']:.1f} B/device; "
        f"/stats all-in {result['stats_reported']:.2f} B/reading; plain float8 table "
        f"{result['plain_table']:.1f} B/reading; code entropy {result['code_entropy']:.3f} B"
    )


def markdown(results: list[dict[str, Any]], jitter: int) -> str:
    """The figures as bench/STORE_FOOTPRINT.md (embedded in bench/REPORT.md)."""
    lines = [
        "# The store all in: bytes per reading on disk",
        "",
        "Written by `python bench/store_footprint.py`: devices reading once a second (clock "
        f"jitter up to {jitter} ms either way), 300 readings each, `ZEAL_MAX_AGE_SECONDS` at its"
        " default (7 days), the collector's housekeeping every 30 s of the simulated clock. "
        "Marginal bytes over the empty schema (after `VACUUM FULL` on PostgreSQL, `VACUUM` on "
        "SQLite), every table with its indexes and TOAST, per stored reading. *Settled*: once "
        "the import window has passed; *live*: at the end of ingest, within the import window "
        "(each device's sequence state, revision 0012, in place of a row per batch before). "
        "Beside them, in the same database: a plain table `(device_id int, ts timestamptz, "
        "value float8, primary key (device_id, ts))` of the same readings, the codes' empirical"
        " entropy, and what `/stats` reports as the stream's all-in figure.",
        "",
    ]
    for devices in sorted({r["devices"] for r in results}):
        chosen = [r for r in results if r["devices"] == devices]
        tables = sorted({t for r in chosen for t, v in r["settled"].items() if abs(v) > 0.005})
        heads = [f"{r['database']}, {r['pattern']}" for r in chosen]
        lines += [
            f"## {devices:,} devices, {chosen[0]['readings']:,} readings",
            "",
            "| B/reading | " + " | ".join(heads) + " |",
            "|---|" + "---|" * len(chosen),
        ]
        for table in tables:
            cells = [f"{r['settled'].get(table, 0):.2f}" for r in chosen]
            lines.append(f"| `{table}` | " + " | ".join(cells) + " |")
        rows = [
            ("**all in, settled**", "settled_total", 2),
            ("all in, live", "live_total", 2),
            ("live / settled", "live_ratio", 2),
            ("sequence state, B/device", "state_per_device", 1),
            ("`/stats` all in", "stats_reported", 2),
            ("plain float8 table", "plain_table", 1),
            ("entropy of the codes", "code_entropy", 3),
        ]
        for label, key, digits in rows:
            lines.append(
                f"| {label} | " + " | ".join(f"{r[key]:.{digits}f}" for r in chosen) + " |"
            )
        lines.append(
            "| messages; ingest s | "
            + " | ".join(f"{r['messages']:,}; {r['ingest_seconds']}" for r in chosen)
            + " |"
        )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--readings", type=int, default=300, help="per device")
    parser.add_argument("--databases", nargs="+", default=["postgresql", "sqlite"])
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    parser.add_argument("--jitter", type=int, default=2, help="clock jitter, ms either way")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write them as markdown (STORE_FOOTPRINT.md)"
    )
    args = parser.parse_args()
    results = []
    for devices in args.devices:
        for name in args.patterns:
            for kind in args.databases:
                result = run(
                    kind, PATTERNS[name], devices, args.readings, jitter=args.jitter, seed=args.seed
                )
                show(result)
                results.append(result)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(markdown(results, args.jitter))


if __name__ == "__main__":
    main()
