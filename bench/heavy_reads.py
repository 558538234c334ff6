"""Heavy reads against light reads and ingestion (docs/reliability.md, "Probed as an attacker
would"; zeal_server.api.costs).

A real `zeal-server serve` (SQLite, the deployment's broker config) holding 6 days of
minute readings of 50 devices (432,000 readings). An honest device publishes a batch every
0.2 s all along. For --seconds quiet, then for --seconds under load: 8 clients ask in a
loop for the heaviest reads (`/average?exclude=implausible` over the 6 days, the 6 days as
a minute series, a Bayes `constant` model over the codes, a page of 1,000 devices) and 32
ask for `/preview/compare` planners; each client has an address of its own (127.0.0.x).
Another client (127.0.0.200) asks `GET /api/v1/streams` all along.

Measured: the light read's median, the collector's commit lag (median over the phase, from
/healthz), and how the heavy reads were answered. Targets: light reads and
commit lag within 2x their quiet medians, the excess answered 429. Run with the server's
defaults (ZEAL_HEAVY_READS: half the CPUs) and, for comparison, with ZEAL_HEAVY_READS=1024
(no budget to speak of). Timings, so a benchmark and not a unit test. Exits 1 when a
target is missed with the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from tools.testbed.server import DeployBroker, batches, client, serve  # noqa: E402
from tools.testbed.verdict import finish  # noqa: E402
from zeal import Zeal, encode_batch  # noqa: E402
from zeal_server import store  # noqa: E402
from zeal_server.ingest import Ingest  # noqa: E402
from zeal_server.store.db import make_engine, migrate, session_factory  # noqa: E402

DAY, HOUR = 86_400_000, 3_600_000
DEVICES, DAYS = 50, 6
TOKEN = "operator-token-0123456789"


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
    engine.dispose()
    return params


class Loop:
    """A client that asks `paths` in turn until stopped, from its own address."""

    def __init__(self, port: int, address: str, paths: list[str]) -> None:
        self.port, self.address, self.paths = port, address, paths
        self.answers: dict[str, int] = {}
        self.times: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        transport = httpx.HTTPTransport(local_address=self.address)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", transport=transport, timeout=120
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


def phase(port: int, seconds: float, loaded: bool, start: str, end: str) -> dict[str, Any]:
    window = f"start={start}&end={end}"
    heavy = [
        f"/api/v1/streams/temps/average?{window}&exclude=implausible",
        f"/api/v1/streams/temps/series?{window}&interval_seconds=60",
        f"/api/v1/streams/temps/average?{window}&estimator=bayes&model=constant",
        "/api/v1/streams/temps/devices?limit=1000",
    ]
    planner = [
        "/api/v1/preview/compare?lower=0&upper=110&epsilon=1&devices=200&readings=500"
        "&between_sd=10&zero_share=0.4&positive_mean=50&cv=0.8&shape=lognormal&effect=3"
    ]
    light = Loop(port, "127.0.0.200", ["/api/v1/streams"])
    loops = [light]
    if loaded:
        loops += [Loop(port, f"127.0.0.{10 + i}", heavy) for i in range(8)]
        loops += [Loop(port, f"127.0.0.{20 + i}", planner) for i in range(32)]
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
    heavy_answers: dict[str, int] = {}
    for loop in loops[1:]:
        for code, count in loop.answers.items():
            heavy_answers[code] = heavy_answers.get(code, 0) + count
    lag = health["collector"]["commit_lag_ms"] or {}
    return {
        "light_median_ms": statistics.median(light.times),
        "light_max_ms": max(light.times),
        "light_answers": light.answers,
        "commit_lag_p50_ms": lag.get("p50"),
        "commit_lag_p99_ms": lag.get("p99"),
        "heavy_answers": heavy_answers,
    }


def trial(heavy_reads: str | None, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        now = int(time.time() * 1000)
        params = fill(f"sqlite:///{directory / 'zeal.sqlite'}", now)
        broker = DeployBroker(directory / "broker").start()
        env = {
            "ZEAL_MQTT_USERNAME": "zeal-collector",
            "ZEAL_MQTT_PASSWORD": "pw-zeal-collector",
            "ZEAL_OPERATOR_TOKEN": TOKEN,
            "ZEAL_MAX_AGE_SECONDS": str(30 * 86_400),
        }
        if heavy_reads is not None:
            env["ZEAL_HEAVY_READS"] = heavy_reads
        server = serve(f"sqlite:///{directory / 'zeal.sqlite'}", broker, directory, **env)
        server.start()
        device = Device(broker.port, params)
        device.thread.start()
        iso = lambda ms: np.datetime64(ms, "ms").astype(str) + "Z"  # noqa: E731
        first = now // HOUR * HOUR - DAYS * DAY
        try:
            quiet = phase(server.port, seconds, False, iso(first), iso(first + DAYS * DAY))
            loaded = phase(server.port, seconds, True, iso(first), iso(first + DAYS * DAY))
        finally:
            device.stop.set()
            device.thread.join(30)
            server.stop()
            broker.stop()
    return {"heavy_reads": heavy_reads or "default", "quiet": quiet, "loaded": loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    results, missed = [], []
    for heavy_reads in (None, "1024"):
        found = trial(heavy_reads, args.seconds)
        results.append(found)
        quiet, loaded = found["quiet"], found["loaded"]
        light = loaded["light_median_ms"] / quiet["light_median_ms"]
        lag = (loaded["commit_lag_p50_ms"] or 0) / max(quiet["commit_lag_p50_ms"] or 1, 1)
        print(
            f"ZEAL_HEAVY_READS {found['heavy_reads']}: 8 heavy-read clients and 32 planners "
            f"for {args.seconds:g} s; light GET /streams {quiet['light_median_ms']:.1f} -> "
            f"{loaded['light_median_ms']:.1f} ms median ({light:.2f}x, max "
            f"{loaded['light_max_ms']:.0f} ms); commit lag p50 {quiet['commit_lag_p50_ms']} -> "
            f"{loaded['commit_lag_p50_ms']} ms ({lag:.2f}x); heavy answers "
            f"{loaded['heavy_answers']}"
        )
        if heavy_reads is None and (light > 2 or lag > 2 or "429" not in loaded["heavy_answers"]):
            missed.append(found["heavy_reads"])
    return finish(results, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
