"""Does a flooding device slow the others? (`make reliability`; docs/reliability.md)

One device floods garbage and 256 KB messages on its own topic (all the broker's ACL lets it
reach) while 400 other devices send 600,000 readings as fast as they are acknowledged. The
figure is the median ingest time with the flood over the median without it, from --pairs
alternated runs on one server (SQLite, a private Mosquitto with deploy/'s max_packet_size).
Exits 1 if the flood slows the others by 20 % or more, or if anything is lost or stored for
the flooder.

A timing, so it is a benchmark and not a unit test: on the shared 2-core CI machine two
quiet runs alone have differed by 28 %. `make test` checks the mechanism instead (the flood
is shed within its reject budget, counted, and stores nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from tools.testbed.broker import Mosquitto
from tools.testbed.flood import flood_trial, limit_packet_size
from tools.testbed.server import Server

ROOT = Path(__file__).resolve().parents[1]

LIMIT = 0.20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="quiet and flooded runs each")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        broker = Mosquitto(Path(tmp) / "broker").start()
        limit_packet_size(broker)
        server = Server(f"sqlite:///{tmp}/z.sqlite", broker, Path(tmp) / "server.log").start()
        try:
            trial = flood_trial(server, broker, Path(tmp), args.pairs)
        finally:
            server.stop()
            broker.stop()
    print(trial.summary())
    figures = {"pairs": args.pairs, **dataclasses.asdict(trial), "slowdown": trial.slowdown}
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    ok = trial.slowdown < LIMIT and trial.readings == trial.sent
    print(f"flood slowdown {trial.slowdown:+.1%} (limit {LIMIT:+.0%}): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
