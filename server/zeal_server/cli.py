"""``zeal-server``: serve the API and collector, manage streams, check and export the store.

zeal-server serve [--host H] [--port P]      API + collector (settings: ZEAL_* variables)
zeal-server streams create NAME --lower L --upper U --epsilon E [--payload-bits K]
zeal-server streams list
zeal-server verify [STREAM]                  segment sums == aggregates, per device/bucket
zeal-server compact [STREAM]                 merge closed buckets' parts into segments
zeal-server export STREAM [--start T] [--end T]   decoded estimates as CSV
zeal-server migrate                          bring the database schema up to date
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import datetime

from zeal_server import store
from zeal_server.db import make_engine, migrate, session_factory
from zeal_server.settings import ServerSettings, SettingsError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeal-server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP API and the MQTT collector")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--no-collector", action="store_true", help="API only")
    streams = commands.add_parser("streams", help="create or list streams")
    sub = streams.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="create a stream (parameters are then fixed)")
    create.add_argument("name")
    create.add_argument("--lower", type=float, required=True)
    create.add_argument("--upper", type=float, required=True)
    create.add_argument("--epsilon", type=float, required=True)
    create.add_argument("--payload-bits", type=int)
    create.add_argument("--exponent", type=int)
    create.add_argument("--bucket-seconds", type=int, default=60)
    create.add_argument("--description", default="")
    sub.add_parser("list", help="list streams as JSON")
    for name, text in (
        ("verify", "check segment sums against aggregates"),
        ("compact", "merge closed buckets into compressed segments"),
    ):
        p = commands.add_parser(name, help=text)
        p.add_argument("stream", nargs="?", help="one stream (default: all)")
    export = commands.add_parser("export", help="decoded per-reading estimates as CSV")
    export.add_argument("stream")
    export.add_argument("--start", type=datetime.fromisoformat)
    export.add_argument("--end", type=datetime.fromisoformat)
    commands.add_parser("migrate", help="bring the schema to the latest revision")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    args = _parser().parse_args(argv)
    try:
        settings = ServerSettings.from_env(os.environ)
    except SettingsError as exc:
        print(f"zeal-server: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        import uvicorn

        from zeal_server.api import create_app

        app = create_app(settings, collector=not args.no_collector)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
        return 0
    engine = make_engine(settings.database_url)
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as session:
        if args.command == "migrate":
            print("schema is up to date")
            return 0
        if args.command == "streams":
            if args.action == "list":
                print(json.dumps([s.name for s in store.list_streams(session)]))
                return 0
            try:
                stream = store.create_stream(
                    session,
                    name=args.name,
                    lower=args.lower,
                    upper=args.upper,
                    epsilon=args.epsilon,
                    payload_bits=args.payload_bits,
                    exponent=args.exponent,
                    bucket_seconds=args.bucket_seconds,
                    description=args.description,
                )
            except store.StoreError as exc:
                print(f"zeal-server: error: {exc}", file=sys.stderr)
                return 2
            session.commit()
            print(
                f"created stream {stream.name}: {stream.payload_bits} payload bits, "
                f"fingerprint {stream.fingerprint} (the server retains its configuration "
                "on the broker when it runs)"
            )
            return 0
        streams = store.list_streams(session)
        if getattr(args, "stream", None):
            streams = [s for s in streams if s.name == args.stream]
            if not streams:
                print(f"zeal-server: error: no stream named {args.stream!r}", file=sys.stderr)
                return 2
        if args.command == "compact":
            for stream in streams:
                print(f"{stream.name}: {store.compact(session, stream)} buckets compacted")
            session.commit()
            return 0
        if args.command == "verify":
            problems = [p for stream in streams for p in store.verify(session, stream)]
            for p in problems:
                print(p)
            print("verify: OK" if not problems else f"verify: {len(problems)} mismatches")
            return 0 if not problems else 1
        stream = streams[0]
        first, stop = store.bucket_bounds(
            stream,
            None if args.start is None else int(args.start.timestamp() * 1000),
            None if args.end is None else int(args.end.timestamp() * 1000),
        )
        for line in store.export_lines(session, stream, first, stop):
            print(line, end="")
        return 0


if __name__ == "__main__":
    sys.exit(main())
