"""``zeal-server`` commands on the database itself, and ``serve``: ``serve``, ``migrate``,
``key``, ``verify``, ``compact``, and ``streams create|list|delete|retention|delete-device`` and
``export`` given ``--local`` (without it those ask the running server: zeal_server.cli.remote).
The database is ZEAL_DATABASE_URL or ZEAL_DATA_DIR's; a line on stderr names it."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from zeal.vocabulary import renamed
from zeal_server import store
from zeal_server.cli.common import (
    ASKS_READ,
    ASKS_WRITE,
    CREATE_FIELDS,
    Commands,
    add_local_argument,
    add_server_argument,
    command,
    database_error,
    days,
    fail,
    stream_line,
    unconfirmed,
    write_export,
)
from zeal_server.settings import ServerSettings, SettingsError
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Stream

__all__ = ["add_parsers", "nats_names", "run"]


def add_parsers(commands: Commands) -> Commands:
    """serve, streams (its actions on the database), verify, compact, export, migrate; the
    streams command's actions are returned, for the remote family to add its own."""
    serve = command(
        commands,
        "serve",
        "run the HTTP API, the operator dashboard and the MQTT collector",
        variables=None,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on [127.0.0.1]")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port [8000]")
    serve.add_argument(
        "--no-collector", action="store_true", help="serve the API only (no MQTT collector)"
    )

    streams = command(commands, "streams", "create, list or delete streams")
    sub = streams.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = command(
        sub,
        "create",
        "create a stream; its parameters never change afterwards, and the server retains its "
        "configuration on the broker within seconds" + ASKS_WRITE,
        asks="write",
    )
    create.add_argument("name", help="1-64 letters, digits, '_', '.' or '-'")
    create.add_argument("--lower", type=float, required=True, help="lower end of the range")
    create.add_argument("--upper", type=float, required=True, help="upper end of the range")
    create.add_argument("--epsilon", type=float, required=True, help="privacy budget per reading")
    create.add_argument("--payload-bits", type=int, help="code width [chosen by the library]")
    create.add_argument("--exponent", type=int, help="binade exponent E_U* [from the width]")
    create.add_argument(
        "--bucket-seconds", type=int, default=60, help="time aggregation bucket [60]"
    )
    create.add_argument("--unit", default="", help="what the readings measure in, e.g. degF")
    create.add_argument(
        "--enrolled-only",
        action="store_true",
        help="accept data only from devices enrolled beforehand "
        "(PUT /api/v1/streams/NAME/devices/DEVICE)",
    )
    create.add_argument(
        "--retention-days",
        type=days,
        help="delete whole buckets older than this many days [keep everything]",
    )
    create.add_argument("--description", default="", help="free text, at most 500 characters")
    create.add_argument(
        "--max-epsilon-per-day", type=float, default=8.0, help="privacy policy per device [8]"
    )
    create.add_argument(
        "--grid-points",
        type=int,
        help="make the stream longitudinal: readings rounded to this many grid values, one "
        "memoized code per value and device (docs/privacy.md; GET /preview/grid helps "
        "choose) [plain]",
    )
    listing = command(sub, "list", "list the streams" + ASKS_READ, asks="read")
    listing.add_argument("--json", action="store_true", help="names as a JSON array (for scripts)")
    delete = command(
        sub,
        "delete",
        "delete a stream and every reading stored for it; the server retains its signed "
        "tombstone on the broker, and agents sending to it halt" + ASKS_WRITE,
        asks="write",
    )
    delete.add_argument("name", help="the stream to delete")
    delete.add_argument(
        "--confirm", metavar="NAME", help="the stream's name again: the data cannot come back"
    )
    renamed(delete, "--yes", "--confirm NAME", "confirm", flag=True)
    keep = command(
        sub,
        "retention",
        "set how long a stream's data is kept: the collector deletes whole buckets older "
        "than that within a minute, for good" + ASKS_WRITE,
        asks="write",
    )
    keep.add_argument("name", help="the stream")
    keep.add_argument("days", type=days, help="1 to 36500 days, or none to keep everything")
    forget = command(
        sub,
        "delete-device",
        "delete everything stored of one device of a stream; the other devices' data is "
        "untouched (revoke the device's broker login first)" + ASKS_WRITE,
        asks="write",
    )
    forget.add_argument("name", help="the stream")
    forget.add_argument("device", help="the device")
    forget.add_argument(
        "--confirm", metavar="DEVICE", help="the device's name again: the data cannot come back"
    )
    renamed(forget, "--yes", "--confirm DEVICE", "confirm", flag=True)
    for name, text in (
        ("verify", "check that every segment row's sums and buckets are those of its readings"),
        ("compact", "merge every raw part (and rows from before 0007) into compressed chunks"),
    ):
        p = command(commands, name, text)
        p.add_argument("stream", nargs="?", help="one stream [all]")
    export = command(
        commands,
        "export",
        "every stored reading (time, device, code, its decoded estimate) as CSV or Parquet, "
        "to stdout or --out" + ASKS_READ,
        asks="read",
    )
    export.add_argument("stream", help="the stream to export")
    export.add_argument(
        "--start", type=datetime.fromisoformat, help="ISO 8601 time; whole buckets from it"
    )
    export.add_argument("--end", type=datetime.fromisoformat, help="ISO 8601 time, exclusive")
    export.add_argument(
        "--format",
        dest="kind",
        choices=store.FORMATS,
        default="csv",
        help="csv, or parquet (pandas, DuckDB, Spark; the stream's configuration in the file; "
        "needs pyarrow: pip install 'zeal-server[parquet]') [csv]",
    )
    export.add_argument(
        "--times",
        choices=store.TIMES,
        default="iso",
        help="CSV times: ISO 8601 in UTC (column time), or epoch milliseconds (timestamp_ms) [iso]",
    )
    export.add_argument(
        "--out",
        metavar="FILE",
        help="write to FILE instead of stdout (progress shown on a terminal)",
    )
    for p in (create, listing, delete, keep, forget, export):
        add_server_argument(p)
        add_local_argument(p)
    command(commands, "migrate", "bring the database schema to the latest revision")
    key = command(
        commands,
        "key",
        "print the server's public key, which agents check what it signs with (give it to "
        "each device with its login: zeal-edge --server-key); or rotate it",
    )
    key.add_argument(
        "action",
        nargs="?",
        choices=["show", "rotate"],
        default="show",
        help="show (the default): the key alone on stdout; rotate: a new key, endorsed by "
        "the old one, so agents that trust the old one follow (a running server signs "
        "with it within seconds)",
    )
    return sub


def run(settings: ServerSettings, args: argparse.Namespace) -> int:
    """Carry out a command on the database itself (or serve): exit status 0, or 2 with
    the reason in one line."""
    engine = make_engine(settings.database_url)
    try:
        migrate(engine)
        if args.command != "serve":
            where = engine.url.render_as_string(hide_password=True)
            print(f"zeal-server: the database {where}", file=sys.stderr)
        if args.command == "serve":
            engine.dispose()
            return _serve(settings, args)
        return _run(engine, args)
    except SQLAlchemyError as exc:
        return fail(database_error(engine, exc))
    except store.StoreError as exc:
        return fail(str(exc))
    finally:
        engine.dispose()


def nats_names(settings: ServerSettings, args: argparse.Namespace) -> None:
    """With ZEAL_NATS_URL, a stream name NATS cannot carry is refused, as the API does."""
    creating = args.command == "streams" and args.action == "create"
    if settings.nats_servers and creating and (problem := store.name_problem("stream", args.name)):
        raise SettingsError(problem)


def _serve(settings: ServerSettings, args: argparse.Namespace) -> int:
    import uvicorn

    class _Uvicorn(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does: uvicorn leaves that line
        out when it is handed its socket, as it is here."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and sockets:
                host, port = sockets[0].getsockname()[:2]
                where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on %s://%s (Press CTRL+C to quit)",
                    "https" if settings.https else "http",
                    where,
                )

    from zeal_server.api.guard import guarded
    from zeal_server.app import create_app

    if settings.https is not None:  # unreadable files: one line, before anything starts
        for name, path in zip(("ZEAL_TLS_CERT", "ZEAL_TLS_KEY"), settings.https, strict=True):
            if not os.access(path, os.R_OK):
                return fail(f"{name}: cannot read {path} (HTTPS needs the certificate and key)")
    # The port first: a busy one is one line and exit 2, before a collector id is claimed
    # on the broker (its persistent session would outlive this process).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((args.host, args.port))
    except OSError as exc:
        listening.close()
        return fail(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (another server "
            "on that port? choose one with --port)"
        )
    app = create_app(settings, collector=not args.no_collector)
    # Idle keep-alive connections close after 5 s. No limit_concurrency: it answers 503 to
    # every route, /livez too, once that many sockets are open; zeal_server.api.guard limits
    # connections per address and in all, and the time to send a request, instead.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        timeout_keep_alive=5,
        http=guarded(settings.http_per_peer),
        # HTTPS only when set: a plain HTTP request then fails its TLS handshake and never
        # reaches the application. Read once: a renewed certificate takes a restart.
        ssl_certfile=str(settings.https[0]) if settings.https else None,
        ssl_keyfile=str(settings.https[1]) if settings.https else None,
    )
    server = _Uvicorn(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down cleanly
        server.run(sockets=[listening])
    return 0 if server.started else 3  # 3: uvicorn's start-up failure, said in its log


def _run(engine: Engine, args: argparse.Namespace) -> int:
    sessions = session_factory(engine)
    with sessions() as session:
        if args.command == "migrate":
            print("schema is up to date")
            return 0
        if args.command in ("streams", "key"):
            return (_streams if args.command == "streams" else _key)(session, args)
        streams = store.list_streams(session)
        if getattr(args, "stream", None):
            streams = [s for s in streams if s.name == args.stream]
            if not streams:
                return fail(f"no stream named {args.stream!r}")
        if args.command == "compact":
            for stream in streams:
                print(f"{stream.name}: compacting ...", flush=True)
                done = store.compact(session, stream)
                print(f"{stream.name}: {done} {'period' if done == 1 else 'periods'} compacted")
            session.commit()
            return 0
        if args.command == "verify":
            problems = [p for stream in streams for p in store.verify(session, stream)]
            for p in problems:
                print(p)
            print("verify: OK" if not problems else f"verify: {len(problems)} mismatches")
            return 0 if not problems else 1
        return _export(session, streams[0], args)


def _export(session: Session, stream: Stream, args: argparse.Namespace) -> int:
    """``export --local``: the stream's readings as CSV or Parquet, to stdout or --out."""
    first, stop = store.bucket_bounds(
        stream,
        None if args.start is None else int(args.start.timestamp() * 1000),
        None if args.end is None else int(args.end.timestamp() * 1000),
    )
    note = store.estimates_note(stream)
    print(f"zeal-server: {note}", file=sys.stderr)
    rows = store.export_rows(session, stream, first, stop)
    if args.kind == "parquet":
        if problem := store.parquet_problem():
            return fail(problem)
        chunks: Iterator[bytes] = store.parquet_chunks(rows, store.config_of(session, stream), note)
    else:
        chunks = (c.encode() for c in store.csv_chunks(rows, args.times))
    write_export(chunks, args.out)
    return 0


def _key(session: Session, args: argparse.Namespace) -> int:
    """Print the installation's public key (rotated first with the action "rotate")."""
    if args.action == "rotate":
        old = store.signer(session).public
        new = store.rotate(session, store.now_ms())
        session.commit()
        print(
            f"zeal-server: key {old} replaced by {new.public}, which it endorses: agents that "
            "trust the old key follow (a running server signs with the new one within "
            "seconds). Give new devices the new key.",
            file=sys.stderr,
        )
    print(store.signer(session).public)
    return 0


def _streams(session: Session, args: argparse.Namespace) -> int:
    if args.action == "list":
        streams = store.list_streams(session)
        if args.json:
            print(json.dumps([s.name for s in streams]))
        shown = ("name", "lower", "upper", "unit", "epsilon", "payload_bits", "fingerprint")
        for s in [] if args.json else streams:
            print(stream_line({k: getattr(s, k) for k in shown}))
        if not streams and not args.json:
            print("no streams yet (zeal-server streams create --help)")
        return 0
    if args.action in ("retention", "delete-device"):
        return _stream_data(session, args)
    if args.action == "delete":
        found = store.stream_by_name(session, args.name)
        if found is None:
            return fail(f"no stream named {args.name!r}")
        if (refused := unconfirmed(args.confirm, args.name)) is not None:
            return fail(
                f"deleting stream {args.name!r} removes every reading stored for it; {refused}"
            )
        readings = store.delete_stream(session, found)
        session.commit()
        print(
            f"deleted stream {args.name} and its {readings} readings (a running server "
            "retains its signed tombstone on the broker within seconds: its agents halt)"
        )
        return 0
    stream = store.create_stream(session, **{k: getattr(args, k) for k in CREATE_FIELDS})
    session.commit()
    print(
        f"created stream {stream.name}: {stream.payload_bits} payload bits, at most "
        f"{stream.max_epsilon_per_day:g} epsilon per device per day, fingerprint "
        f"{stream.fingerprint} (a running server on this database retains its configuration "
        "on the broker within seconds)"
    )
    return 0


def _stream_data(session: Session, args: argparse.Namespace) -> int:
    stream = store.stream_by_name(session, args.name)
    if stream is None:
        return fail(f"no stream named {args.name!r}")
    if args.action == "retention":
        store.set_retention(session, stream, args.days)
        session.commit()
        kept = "everything" if args.days is None else f"the last {args.days} days"
        print(f"stream {args.name} keeps {kept} (a running collector applies it within a minute)")
        return 0
    device = store.device_by_name(session, stream, args.device)
    if device is None:
        return fail(f"no device {args.device!r} in stream {args.name!r}")
    if (refused := unconfirmed(args.confirm, args.device)) is not None:
        return fail(
            f"deleting device {args.device!r} removes every reading it sent to "
            f"{args.name!r}; {refused}"
        )
    readings = store.delete_device_data(session, stream, device)
    session.commit()
    print(f"deleted device {args.device} of stream {args.name} and its {readings} readings")
    return 0
