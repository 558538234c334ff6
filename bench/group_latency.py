"""Group queries over a month of a large fleet, against the code before a change
(python bench/group_latency.py --baseline REV).

10,000 devices, each reading once an hour at its own minute and second, for 30 days of
minute buckets (7,200,000 readings), half of them tagged site:north and half site:south,
sent as one message a device a day (24 readings) through the tree's own ingest, then
compacted. Timed through the application (FastAPI's TestClient), median of --runs after
one warm-up: /average?group= and /compare over the whole month and over a window whose
ends fall inside days, and, for reference, the ungrouped /average and an hourly /series.

With --baseline REV, the same figures are taken on a git worktree of REV (its own code,
imported from there in a subprocess: the same data, ingested the way REV stores it) in the
same run, and the ratios printed: the target is at most 2x the old store's time for the
grouped queries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

DEVICES, DAYS = 10_000, 30
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
QUERIES = {
    "average?group (month)": ("/average", {"group": "site:north"}),
    "compare (month)": ("/compare", {"group_a": "site:north", "group_b": "site:south"}),
    "average?group (inside days)": ("/average", {"group": "site:north", "_window": True}),
    "compare (inside days)": (
        "/compare",
        {"group_a": "site:north", "group_b": "site:south", "_window": True},
    ),
    "average (month, all devices)": ("/average", {}),
    "series hourly (month, all devices)": ("/series", {"interval_seconds": 3600}),
}


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def fill(url: str, devices: int, days: int) -> dict[str, float]:
    """Create, ingest and compact the month with the tree on sys.path; seconds taken."""
    import numpy as np

    from zeal import encode_batch
    from zeal_server import store
    from zeal_server.ingest import Ingest  # a module before the subpackages, a package since

    try:
        from zeal_server.store.db import make_engine, migrate, session_factory
    except ImportError:  # a baseline from before the server's subpackages
        from zeal_server.db import make_engine, migrate, session_factory  # type: ignore[no-redef]

    engine = make_engine(url)
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        stream = store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=24
        )
        params = store.params_of(stream)
    rng = np.random.default_rng(3)
    phase = rng.integers(0, 3_600, size=devices) * 1000  # minute and second in the hour
    hours = np.arange(24, dtype=np.int64) * 3_600_000
    started = time.perf_counter()
    ingest = Ingest()  # no time limits: the month lies in the past
    messages: list[tuple[str, bytes, int]] = []

    def flush() -> None:
        with sessions() as session, session.begin():
            ingest.add_many(session, messages)
        messages.clear()

    for day in range(days):
        codes = rng.integers(params.code_min, params.code_max + 1, size=(devices, 24))
        for d in range(devices):
            stamps = T0 + day * 86_400_000 + phase[d] + hours
            payload = encode_batch(
                params,
                stream="temps",
                device=f"dev{d:05d}",
                sequence=day,
                codes=codes[d].astype(np.uint64),
                timestamps=stamps,
            )
            messages.append((f"zeal/v1/temps/dev{d:05d}/up", payload, int(stamps[-1]) + 50))
            if len(messages) == 2_000:
                flush()
    if messages:
        flush()
    ingested = time.perf_counter() - started
    with sessions() as session, session.begin():
        for d in store.devices_of(session, stream):
            site = "north" if int(d.name[3:]) % 2 == 0 else "south"
            store.set_tags(session, d, {"site": site})
    started = time.perf_counter()
    with sessions() as session, session.begin():
        store.compact(session, stream)
    compacted = time.perf_counter() - started
    if engine.dialect.name == "postgresql":  # what autovacuum does after a load (it is off here)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()
    return {"ingest_s": ingested, "compact_s": compacted}


def time_queries(url: str, runs: int) -> dict[str, float]:
    """Median milliseconds of each query through the application."""
    import warnings

    warnings.filterwarnings("ignore")
    from fastapi.testclient import TestClient

    from zeal_server.settings import ServerSettings

    try:
        from zeal_server.app import create_app
    except ImportError:  # a baseline from before the server's subpackages
        from zeal_server.api import create_app  # type: ignore[no-redef]

    settings = ServerSettings.from_env({"ZEAL_DATABASE_URL": url, "ZEAL_MQTT_URL": "off"})
    inside = {"start": _iso(T0 + 86_400_000 + 7 * 3_600_000 + 13 * 60_000)}
    inside["end"] = _iso(T0 + (DAYS - 1) * 86_400_000 + 3 * 3_600_000)
    figures = {}
    with TestClient(create_app(settings)) as api:
        for name, (path, query) in QUERIES.items():
            params = {k: v for k, v in query.items() if k != "_window"}
            if query.get("_window"):
                params |= inside
            seconds = []
            for _ in range(runs + 1):
                started = time.perf_counter()
                answer = api.get(f"/api/v1/streams/temps{path}", params=params)
                seconds.append(time.perf_counter() - started)
                if answer.status_code != 200:
                    raise SystemExit(f"{path} {params}: {answer.status_code} {answer.text[:200]}")
            figures[name] = 1000 * statistics.median(seconds[1:])
    return figures


@contextmanager
def database(kind: str) -> Iterator[str]:
    if kind == "postgresql":
        sys.path.insert(0, str(ROOT))
        from tools.testbed.databases import postgres_database

        with postgres_database("zeal_latency") as url:
            yield url
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/zeal.sqlite"


def measure(kind: str, runs: int, devices: int, days: int) -> dict[str, Any]:
    with database(kind) as url:
        times = fill(url, devices, days)
        return {"database": kind, **times, "queries_ms": time_queries(url, runs)}


def in_tree(tree: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """This script's figures with the code of `tree` (a subprocess importing from it)."""
    paths = [str(tree / p) for p in ("shared", "server", "edge")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, __file__, "--child", "--runs", str(args.runs)]
    command += ["--devices", str(args.devices), "--days", str(args.days)]
    command += ["--databases", *args.databases]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    result: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision],
            check=True,
            capture_output=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                check=False,
                capture_output=True,
            )


def show(label: str, results: list[dict[str, Any]]) -> None:
    for r in results:
        print(
            f"{label}, {r['database']}: ingest {r['ingest_s']:.0f} s, compaction "
            f"{r['compact_s']:.1f} s; "
            + ", ".join(f"{k} {v:.0f} ms" for k, v in r["queries_ms"].items())
        )


def markdown(out: dict[str, Any]) -> str:
    """The figures as bench/GROUP_LATENCY.md (embedded in bench/REPORT.md)."""
    runs = out["this_tree"]
    base = out.get("baseline")
    lines = [
        "# Group queries over a month of a large fleet",
        "",
        f"Written by `python bench/group_latency.py`: {out['devices']:,} devices x "
        f"{out['days']} days of minute buckets, a reading an hour each "
        f"({out['devices'] * out['days'] * 24:,} readings), half tagged site:north and half "
        "site:south, one message a device a day; median milliseconds through the application"
        + (
            f", this tree beside the code of `{base['revision']}` (the same data, stored the "
            "way that code stores it), measured in the same run."
            if base
            else "."
        ),
        "",
    ]
    for i, mine in enumerate(runs):
        theirs = base["results"][i] if base else None
        lines += [
            f"## {mine['database']}",
            "",
            "| query | this tree (ms) |" + (" baseline (ms) | ratio |" if theirs else ""),
            "|---|---|" + ("---|---|" if theirs else ""),
        ]
        for name, ms in mine["queries_ms"].items():
            row = f"| {name} | {ms:.0f} |"
            if theirs:
                old = theirs["queries_ms"][name]
                row += f" {old:.0f} | {ms / old:.2f}x |"
            lines.append(row)
        row = f"| ingest; compaction (s) | {mine['ingest_s']:.0f}; {mine['compact_s']:.1f} |"
        if theirs:
            row += f" {theirs['ingest_s']:.0f}; {theirs['compact_s']:.1f} | |"
        lines += [row, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a git revision to compare with (its worktree)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--days", type=int, default=DAYS)
    parser.add_argument("--databases", nargs="+", default=["postgresql", "sqlite"])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write them as markdown (GROUP_LATENCY.md)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        results = [measure(k, args.runs, args.devices, args.days) for k in args.databases]
        print(json.dumps(results))
        return
    print(
        f"{args.devices:,} devices x {args.days} days of minute buckets, a reading an hour "
        f"each ({args.devices * args.days * 24:,} readings); median of {args.runs} runs"
    )
    now = in_tree(ROOT, args)
    show("this tree", now)
    out: dict[str, Any] = {"devices": args.devices, "days": args.days, "this_tree": now}
    if args.baseline:
        with worktree(args.baseline) as tree:
            before = in_tree(tree, args)
        show(f"baseline {args.baseline}", before)
        out["baseline"] = {"revision": args.baseline, "results": before}
        for mine, theirs in zip(now, before, strict=True):
            ratios = {
                k: mine["queries_ms"][k] / theirs["queries_ms"][k] for k in mine["queries_ms"]
            }
            out.setdefault("ratios", {})[mine["database"]] = ratios
            print(
                f"this tree / baseline, {mine['database']}: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            )
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(markdown(out))


if __name__ == "__main__":
    main()
