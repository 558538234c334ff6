"""Slow clients (docs/reliability.md, "Probed as an attacker would"; zeal_server.api.guard).

A real `zeal-server serve` (SQLite, the deployment's broker config) while one address,
127.0.0.1, holds SOCKETS connections open for --seconds: each sends the start of a request
and then one header line every 5 s, and is opened again as soon as the server closes it
(as an attacker would). Another client, from 127.0.0.2, asks `/livez` and a light read
(`GET /api/v1/streams`) in turn all along, and an honest device publishes 50 batches
whose time to be stored is measured; the same is measured with no attack first.

Targets: the other client's `/livez` and light read answer 200 with a median
under 100 ms during the attack, and the honest device's ingest time stays within 2x of
the quiet one. Run once with the server's defaults and once with
ZEAL_HTTP_CONNECTIONS_PER_PEER=0 (no cap per address; the request time limit alone).
Timings, so a benchmark and not a unit test. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tools.testbed.server import DeployBroker, batches, client, create, serve, stats
from tools.testbed.verdict import finish

ROOT = Path(__file__).resolve().parents[1]


class Holder:
    """SOCKETS connections from 127.0.0.1 that never finish their request."""

    def __init__(self, port: int, sockets: int) -> None:
        self.port, self.sockets = port, sockets
        self.opened = self.closed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _hold(self) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=("127.0.0.1", 0)
                )
            except OSError:
                await asyncio.sleep(0.1)
                continue
            self.opened += 1
            try:
                writer.write(b"GET /api/v1/streams HTTP/1.1\r\nHost: zeal\r\n")
                while not self.stop.is_set():
                    await writer.drain()
                    try:
                        if await asyncio.wait_for(reader.read(1), 5.0) == b"":
                            break  # the server closed it
                    except TimeoutError:
                        writer.write(b"X-Slow: 1\r\n")
            except OSError:
                pass
            finally:
                self.closed += 1
                writer.close()
            await asyncio.sleep(0.1)

    async def _main(self) -> None:
        await asyncio.gather(*(self._hold() for _ in range(self.sockets)))

    def __enter__(self) -> Holder:
        self.thread.start()
        time.sleep(2.0)  # the sockets are open (or refused)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def probe(port: int, seconds: float) -> dict[str, Any]:
    """`/livez` and `GET /api/v1/streams` in turn from 127.0.0.2 for `seconds`."""
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    times: dict[str, list[float]] = {"/livez": [], "/api/v1/streams": []}
    codes: dict[str, int] = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport) as http:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for path, found in times.items():
                began = time.monotonic()
                try:
                    code = str(http.get(path, timeout=10).status_code)
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                found.append(1000 * (time.monotonic() - began))
                codes[code] = codes.get(code, 0) + 1
            time.sleep(0.05)
    return {
        "median_ms": {p: statistics.median(t) for p, t in times.items()},
        "max_ms": {p: max(t) for p, t in times.items()},
        "requests": sum(len(t) for t in times.values()),
        "codes": codes,
    }


def ingest_seconds(server: Any, broker: DeployBroker, params: Any, first: int) -> float:
    """Publish to stored, 50 batches of an honest device one after another."""
    target = stats(server)["messages"] + 50
    honest = client(broker.port, "dev1", "dev1")
    began = time.monotonic()
    for payload in batches(params, "temps", "dev1", 50, first=first):
        honest.publish("zeal/v1/temps/dev1/up", payload, qos=1).wait_for_publish(30)
    while stats(server)["messages"] < target:
        time.sleep(0.02)
    honest.disconnect()
    return time.monotonic() - began


def trial(per_peer: str | None, sockets: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        broker = DeployBroker(directory / "broker").start()
        env = {"ZEAL_MQTT_USERNAME": "zeal-collector", "ZEAL_MQTT_PASSWORD": "pw-zeal-collector"}
        if per_peer is not None:
            env["ZEAL_HTTP_CONNECTIONS_PER_PEER"] = per_peer
        server = serve(f"sqlite:///{directory / 'zeal.sqlite'}", broker, directory, **env)
        server.start()
        try:
            params = create(server)
            quiet = probe(server.port, 10)
            quiet_ingest = ingest_seconds(server, broker, params, 0)
            with Holder(server.port, sockets) as holder:
                done: dict[str, Any] = {}
                prober = threading.Thread(
                    target=lambda: done.update(probe(server.port, seconds)), daemon=True
                )
                prober.start()
                loud_ingest = ingest_seconds(server, broker, params, 50)
                prober.join(seconds + 60)
            metrics = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
            closed = {
                line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("zeal_http_connections_closed_total{")
            }
        finally:
            server.stop()
            broker.stop()
    return {
        "per_peer": per_peer or "default (64)",
        "quiet": quiet,
        "attack": done,
        "ingest_s": {"quiet": quiet_ingest, "attack": loud_ingest},
        "attacker": {"opened": holder.opened, "closed": holder.closed},
        "closed_by_server": closed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    results, missed = [], []
    for per_peer in (None, "0"):
        found = trial(per_peer, args.sockets, args.seconds)
        results.append(found)
        attack, quiet = found["attack"], found["quiet"]
        ratio = found["ingest_s"]["attack"] / found["ingest_s"]["quiet"]
        print(
            f"per peer {found['per_peer']}: {args.sockets} slow sockets for {args.seconds:g} s; "
            f"another client's /livez {quiet['median_ms']['/livez']:.1f} -> "
            f"{attack['median_ms']['/livez']:.1f} ms median "
            f"(max {attack['max_ms']['/livez']:.0f}), "
            f"GET /streams {quiet['median_ms']['/api/v1/streams']:.1f} -> "
            f"{attack['median_ms']['/api/v1/streams']:.1f} ms median, answers {attack['codes']}; "
            f"honest ingest {found['ingest_s']['quiet']:.2f} -> "
            f"{found['ingest_s']['attack']:.2f} s ({ratio:.2f}x); attacker opened "
            f"{found['attacker']['opened']} connections; server closed {found['closed_by_server']}"
        )
        if per_peer is None:
            medians = attack["median_ms"].values()
            if any(m >= 100 for m in medians) or set(attack["codes"]) != {"200"} or ratio > 2:
                missed.append(f"per peer {found['per_peer']}")
    return finish(results, missed, args.out)


if __name__ == "__main__":
    sys.exit(main())
