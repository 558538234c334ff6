"""Costly reads against light reads and ingestion (docs/reliability.md, "Probed as an attacker
would"; zeal_server.api.costs).

A real `zeal-server serve` (the deployment's broker config; SQLite, then PostgreSQL) holding
6 days of minute readings of 50 devices (432,000 readings), with a read token. An honest
device publishes a batch every 0.2 s all along. For --seconds quiet, then for --seconds
under the combined read attack of hostile round 3, all with the read token alone:

- 8 clients from one address asking in a loop for the heaviest reads
  (`/average?exclude=implausible` over the 6 days, the 6 days as a minute series, a Bayes
  `constant` model over the codes, a page of 1,000 devices), each sending the token with
  other white space after `Bearer` (one token posing as 8 clients);
- 4 clients exporting the 6 days (`/export`) again and again;
- 8 clients asking for reads that are costly and were not budgeted: the 6 days' average
  and hourly series, `/stats` with its efficiency figures, a page of 100 devices sorted by
  readings, the stream's groups;
- 16 clients asking for `/preview/compare` planners.

Another address asks `GET /api/v1/streams` all along. Measured: that light read's median,
the collector's commit lag (median over the phase, from /healthz: the ingest latency), and
how the costly reads were answered. Targets: light reads and commit lag within 1.5x their
quiet medians, the excess answered 429. Timings, so a benchmark and not a unit test. Exits
1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from tools.testbed.server import DeployBroker, batches, client, serve
from tools.testbed.verdict import finish
from zeal import Zeal, encode_batch
from zeal_server import store
from zeal_server.ingest import Ingest
from zeal_server.store.db import make_engine, migrate, session_factory

ROOT = Path(__file__).resolve().parents[1]


DAY, HOUR = 86_400_000, 3_600_000
DEVICES, DAYS = 50, 6
TOKEN = "operator-token-0123456789"
READ_TOKEN = "read-token-0123456789abcdef"
PG = os.environ.get("ZEAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
#: What the targets allow: a light read's median and the commit lag under attack, against
#: their quiet medians in the same run.
LIMIT = 1.5


def fill(url: str, now: int) -> Zeal:
    """DAYS days of minute readings of DEVICES devices, up to the hour before `now`."""
    engine = make_engine(url)
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        stream = store.create_stream(
            session, name="temps", lower=0, upper=110, epsilon=1, max_epsilon_per_day=1e6
        )
        params = store.params_of(stream)
    ingest = Ingest(max_age_ms=30 * DAY)
    rng = np.random.default_rng(35)
    start = now // HOUR * HOUR - DAYS * DAY
    messages = []
    for d in range(DEVICES):
        for h in range(DAYS * 24):
            stamps = start + h * HOUR + 60_000 * np.arange(60)
            codes = params.perturb(rng.gamma(4.0, 12.0, 60).clip(0, 110), rng=rng)
            payload = encode_batch(
                params, stream="temps", device=f"d{d:03d}", sequence=h,
                timestamps=stamps, codes=codes,
            )  # fmt: skip
            messages.append((f"zeal/v1/temps/d{d:03d}/up", payload, now))
    for i in range(0, len(messages), 500):
        with sessions() as session, session.begin():
            ingest.add_many(session, messages[i : i + 500])
    with sessions() as session, session.begin():
        stream = store.stream_by_name(session, "temps")
        assert stream is not None
        store.compact(session, stream)
    if engine.dialect.name == "postgresql":  # what autovacuum does after a load (it is off here)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("ANALYZE")
    engine.dispose()
    return params


class Loop:
    """A client that asks `paths` in turn until stopped, from its own address, sending
    `authorization` as its Authorization header."""

    def __init__(self, port: int, address: str, paths: list[str], authorization: str) -> None:
        self.port, self.address, self.paths = port, address, paths
        self.headers = {"Authorization": authorization}
        self.answers: dict[str, int] = {}
        self.times: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        transport = httpx.HTTPTransport(local_address=self.address)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            transport=transport,
            timeout=120,
            headers=self.headers,
        ) as http:
            while not self.stop.is_set():
                for path in self.paths:
                    began = time.monotonic()
                    try:
                        code = str(http.get(path).status_code)
                    except httpx.HTTPError as exc:
                        code = type(exc).__name__
                    self.times.append(1000 * (time.monotonic() - began))
                    self.answers[code] = self.answers.get(code, 0) + 1
                    if code == "429":
                        time.sleep(0.05)  # a client that does not honour Retry-After
                    if self.stop.is_set():
                        break


class Device:
    """An honest device publishing a batch every 0.2 s."""

    def __init__(self, port: int, params: Zeal) -> None:
        self.port, self.params = port, params
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        honest = client(self.port, "dev1", "dev1")
        sequence = 0
        while not self.stop.is_set():
            for payload in batches(self.params, "temps", "dev1", 1, first=sequence):
                honest.publish("zeal/v1/temps/dev1/up", payload, qos=1)
            sequence += 1
            time.sleep(0.2)
        honest.disconnect()


GROUPS = ("heavy", "exports", "costly", "planners")


def attackers(port: int, start: str, end: str, groups: tuple[str, ...] = GROUPS) -> list[Loop]:
    """The combined attack (module docstring), all with the read token alone: the groups
    named in `groups`."""
    window = f"start={start}&end={end}"
    stream = "/api/v1/streams/temps"
    heavy = [
        f"{stream}/average?{window}&exclude=implausible",
        f"{stream}/series?{window}&interval_seconds=60",
        f"{stream}/average?{window}&estimator=bayes&model=constant",
        f"{stream}/devices?limit=1000",
    ]
    costly = [
        f"{stream}/average?{window}",
        f"{stream}/series?{window}&interval_seconds=3600",
        f"{stream}/stats",
        f"{stream}/devices?limit=100&sort=readings&descending=true",
        f"{stream}/groups",
    ]
    planner = [
        "/api/v1/preview/compare?lower=0&upper=110&epsilon=1&devices=200&readings=500"
        "&between_sd=10&zero_share=0.4&positive_mean=50&cv=0.8&shape=lognormal&effect=3"
    ]
    bearer = [f"Bearer{' ' * (1 + k)}{READ_TOKEN}" for k in range(8)]  # one token, 8 spellings
    plain = f"Bearer {READ_TOKEN}"
    loops = {
        "heavy": [Loop(port, "127.0.0.10", heavy, bearer[k]) for k in range(8)],
        "exports": [
            Loop(port, f"127.0.0.{20 + k}", [f"{stream}/export?{window}"], plain) for k in range(4)
        ],
        "costly": [Loop(port, f"127.0.0.{30 + k}", costly, plain) for k in range(8)],
        "planners": [Loop(port, f"127.0.0.{40 + k}", planner, plain) for k in range(16)],
    }
    return [loop for group in groups for loop in loops[group]]


def phase(
    port: int, seconds: float, start: str, end: str, groups: tuple[str, ...] = ()
) -> dict[str, Any]:
    light = Loop(port, "127.0.0.200", ["/api/v1/streams"], f"Bearer {READ_TOKEN}")
    loops = [light, *attackers(port, start, end, groups)]
    for loop in loops:
        loop.thread.start()
    time.sleep(seconds)
    health = httpx.get(
        f"http://127.0.0.1:{port}/healthz", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    for loop in loops:
        loop.stop.set()
    for loop in loops:
        loop.thread.join(180)
    costly_answers: dict[str, int] = {}
    for loop in loops[1:]:
        for code, count in loop.answers.items():
            costly_answers[code] = costly_answers.get(code, 0) + count
    lag = health["collector"]["commit_lag_ms"] or {}
    times = sorted(light.times)
    return {
        "light_median_ms": statistics.median(times),
        "light_p95_ms": times[int(0.95 * (len(times) - 1))],
        "light_answers": light.answers,
        "commit_lag_p50_ms": lag.get("p50"),
        "commit_lag_p99_ms": lag.get("p99"),
        "costly_answers": costly_answers,
    }


def trial(database: str, seconds: float, groups: tuple[str, ...]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        name = f"zeal_bench_{uuid.uuid4().hex[:10]}"
        if database == "postgresql":
            with psycopg.connect(PG, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            url = PG.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
            url = f"{url}/{name}"
        else:
            url = f"sqlite:///{directory / 'zeal.sqlite'}"
        now = int(time.time() * 1000)
        params = fill(url, now)
        broker = DeployBroker(directory / "broker").start()
        env = {
            "ZEAL_MQTT_USERNAME": "zeal-collector",
            "ZEAL_MQTT_PASSWORD": "pw-zeal-collector",
            "ZEAL_OPERATOR_TOKEN": TOKEN,
            "ZEAL_READ_TOKEN": READ_TOKEN,
            "ZEAL_MAX_AGE_SECONDS": str(30 * 86_400),
        }
        server = serve(url, broker, directory, **env)
        server.start()
        device = Device(broker.port, params)
        device.thread.start()
        iso = lambda ms: np.datetime64(ms, "ms").astype(str) + "Z"  # noqa: E731
        first = now // HOUR * HOUR - DAYS * DAY
        try:
            window = iso(first), iso(first + DAYS * DAY)
            quiet = phase(server.port, seconds, *window)
            loaded = phase(server.port, seconds, *window, groups)
        finally:
            device.stop.set()
            device.thread.join(30)
            server.stop()
            broker.stop()
            if database == "postgresql":
                with psycopg.connect(PG, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return {"database": database, "quiet": quiet, "loaded": loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--database", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument(
        "--attack",
        default=",".join(GROUPS),
        help=f"the groups of attacking clients, of {','.join(GROUPS)} (default: all)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    groups = tuple(g for g in args.attack.split(",") if g)
    if not groups or set(groups) - set(GROUPS):
        parser.error(f"--attack takes groups of {','.join(GROUPS)}")
    databases = ("sqlite", "postgresql") if args.database == "both" else (args.database,)
    results, missed = [], []
    for database in databases:
        found = trial(database, args.seconds, groups)
        quiet, loaded = found["quiet"], found["loaded"]
        light = loaded["light_median_ms"] / quiet["light_median_ms"]
        lag = (loaded["commit_lag_p50_ms"] or 0) / max(quiet["commit_lag_p50_ms"] or 1, 1)
        found.update(light_ratio=round(light, 2), ingest_ratio=round(lag, 2))
        results.append(found)
        print(
            f"{database}: the combined read attack for {args.seconds:g} s; light GET /streams "
            f"{quiet['light_median_ms']:.1f} -> {loaded['light_median_ms']:.1f} ms median "
            f"({light:.2f}x; p95 {quiet['light_p95_ms']:.1f} -> {loaded['light_p95_ms']:.1f}); "
            f"commit lag p50 {quiet['commit_lag_p50_ms']} -> {loaded['commit_lag_p50_ms']} ms "
            f"({lag:.2f}x); costly answers {loaded['costly_answers']}"
        )
        if light > LIMIT or lag > LIMIT or "429" not in loaded["costly_answers"]:
            missed.append(database)
    return finish(results, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
