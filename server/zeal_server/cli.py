"""``zeal-server``: serve the API and collector, manage streams, check and export the store.

zeal-server serve [--host H] [--port P]      API + collector (settings: ZEAL_* variables)

Asking the running server over HTTP (--server URL or ZEAL_SERVER_URL, default
http://127.0.0.1:8000; ZEAL_READ_TOKEN for reads, ZEAL_OPERATOR_TOKEN for changes):
zeal-server streams create NAME --lower L --upper U --epsilon E [--unit degF] ...
zeal-server streams list | streams show NAME | streams devices NAME
zeal-server streams delete NAME --confirm NAME   the stream and all its data
zeal-server streams retention NAME DAYS|none  keep whole buckets of the last DAYS days only
zeal-server streams release NAME             agents halted on the stream adopt it again
zeal-server streams delete-device NAME DEVICE --confirm DEVICE   one device's data
zeal-server export STREAM [--start T] [--end T]   decoded estimates as CSV
zeal-server average STREAM [--start T] [--end T] [--group K:V] [--device D]
zeal-server series STREAM [--interval-seconds S] ...  |  zeal-server tail STREAM
zeal-server enroll STREAM DEVICE  |  zeal-server policy set STREAM EPSILON_PER_DAY

On the database itself (ZEAL_DATABASE_URL or ZEAL_DATA_DIR; the line on stderr names it):
zeal-server verify [STREAM]                  every segment row's sums == its readings'
zeal-server compact [STREAM]                 merge raw parts into compressed chunks
zeal-server migrate                          bring the database schema up to date
zeal-server streams ... --local, export --local   as above, while no server runs

zeal-server devices provision NAME           a broker login for a device (password shown once)
zeal-server devices revoke NAME              remove it: the device is disconnected, for good
zeal-server devices list                     devices with a login made here
zeal-server devices harden                   deny-by-default rules on logins made before them

Errors (a bad setting, an unreachable database) are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from zeal.vocabulary import renamed
from zeal_server import devicecommands, remotecommands, store
from zeal_server.errors import ProvisioningError
from zeal_server.settings import ServerSettings, SettingsError, variables_help
from zeal_server.store.db import make_engine, migrate, session_factory
from zeal_server.store.models import Device

__all__ = ["main"]

log = logging.getLogger(__name__)
_DATABASE = ("ZEAL_DATA_DIR", "ZEAL_DATABASE_URL")
_FORMATTER = argparse.RawDescriptionHelpFormatter
#: Said by the commands that ask the running server unless given --local.
_ASKS = " (asks the running server: --server or ZEAL_SERVER_URL; --local: the database)"


def _command(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    text: str,
    variables: tuple[str, ...] | None = _DATABASE,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=text,
        description=text,
        epilog=variables_help(variables),
        formatter_class=_FORMATTER,
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeal-server",
        description=__doc__,
        epilog=variables_help(),
        formatter_class=_FORMATTER,
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="how much to log on stderr (DEBUG also shows the schema migrations' steps)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = _command(
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

    streams = _command(commands, "streams", "create, list or delete streams")
    sub = streams.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = _command(
        sub,
        "create",
        "create a stream; its parameters never change afterwards, and the server retains its "
        "configuration on the broker within seconds" + _ASKS,
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
        type=_days,
        help="delete whole buckets older than this many days [keep everything]",
    )
    create.add_argument("--description", default="", help="free text, at most 500 characters")
    create.add_argument(
        "--max-epsilon-per-day", type=float, default=8.0, help="privacy policy per device [8]"
    )
    listing = _command(sub, "list", "list the streams" + _ASKS)
    listing.add_argument("--json", action="store_true", help="names as a JSON array (for scripts)")
    delete = _command(
        sub,
        "delete",
        "delete a stream and every reading stored for it; the server retains its signed "
        "tombstone on the broker, and agents sending to it halt" + _ASKS,
    )
    delete.add_argument("name", help="the stream to delete")
    delete.add_argument(
        "--confirm", metavar="NAME", help="the stream's name again: the data cannot come back"
    )
    renamed(delete, "--yes", "--confirm NAME", "confirm", flag=True)
    keep = _command(
        sub,
        "retention",
        "set how long a stream's data is kept: the collector deletes whole buckets older "
        "than that within a minute, for good" + _ASKS,
    )
    keep.add_argument("name", help="the stream")
    keep.add_argument("days", type=_days, help="1 to 36500 days, or none to keep everything")
    forget = _command(
        sub,
        "delete-device",
        "delete everything stored of one device of a stream; the other devices' data is "
        "untouched (revoke the device's broker login first)" + _ASKS,
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
        p = _command(commands, name, text)
        p.add_argument("stream", nargs="?", help="one stream [all]")
    export = _command(commands, "export", "decoded per-reading estimates as CSV on stdout" + _ASKS)
    export.add_argument("stream", help="the stream to export")
    export.add_argument(
        "--start", type=datetime.fromisoformat, help="ISO 8601 time; whole buckets from it"
    )
    export.add_argument("--end", type=datetime.fromisoformat, help="ISO 8601 time, exclusive")
    for p in (create, listing, delete, keep, forget, export):
        remotecommands.add_server_argument(p)
        p.add_argument(
            "--local",
            action="store_true",
            help="open the database (ZEAL_DATABASE_URL, or ZEAL_DATA_DIR) instead of asking "
            "the running server: for maintenance while no server runs",
        )
    _command(commands, "migrate", "bring the database schema to the latest revision")
    devicecommands.add_parsers(commands, _command)
    _remote_parsers(commands, sub)
    return parser


def _remote_parsers(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    streams: argparse._SubParsersAction,  # type: ignore[type-arg]
) -> None:
    """The commands that ask the running server over HTTP (zeal_server.remotecommands)."""
    over_http = " (asks the running server: --server or ZEAL_SERVER_URL, the read token)"
    show = _command(streams, "show", "a stream's parameters" + over_http, variables=())
    show.add_argument("name", help="the stream")
    released = _command(
        streams,
        "release",
        "release the agents halted on a stream (deleted or created anew under them, a policy "
        "above their ceiling) that wait for their server: its signed configuration says so, "
        "and they adopt it (asks the running server: --server or ZEAL_SERVER_URL, the "
        "operator token)",
        variables=(),
    )
    released.add_argument("name", help="the stream")
    listed = _command(streams, "devices", "a stream's devices" + over_http, variables=())
    listed.add_argument("name", help="the stream")
    listed.add_argument("--limit", type=int, default=100, help="devices shown [100]")
    for name, text in (
        ("average", "the debiased average over a window, with its interval"),
        ("series", "the average per interval, on the clock"),
        ("tail", "the readings stored and the average, again every few seconds (Ctrl-C ends)"),
    ):
        p = _command(commands, name, text + over_http, variables=())
        p.add_argument("stream", help="the stream")
        if name == "tail":
            p.add_argument("--every", type=float, default=5.0, help="seconds between lines [5]")
            p.add_argument("--count", type=int, help="stop after this many lines [never]")
            remotecommands.add_server_argument(p)
            continue
        p.add_argument("--start", help="window start, ISO 8601 (UTC if no zone)")
        p.add_argument("--end", help="window end, exclusive")
        p.add_argument("--group", help="devices with this tag, key:value")
        p.add_argument("--device", help="one device")
        if name == "series":
            p.add_argument(
                "--interval-seconds",
                dest="interval",
                type=int,
                help="seconds per point [the bucket]",
            )
            renamed(p, "--interval", "--interval-seconds", "interval")
        remotecommands.add_server_argument(p)
    enroll = _command(
        commands, "enroll", "let a device send to an enrolled-only stream" + over_http, ()
    )
    enroll.add_argument("stream", help="the stream")
    enroll.add_argument("device", help="the device")
    policy = _command(commands, "policy", "a stream's privacy policy" + over_http, ())
    setting = _command(
        policy.add_subparsers(dest="action", required=True, metavar="ACTION"),
        "set",
        "set the epsilon one device may spend per UTC day (a new fingerprint: agents take the "
        "new configuration by themselves)" + over_http,
        (),
    )
    setting.add_argument("stream", help="the stream")
    setting.add_argument("epsilon", type=float, help="epsilon per device per UTC day")
    for p in (show, released, listed, enroll, setting):
        remotecommands.add_server_argument(p)
    _lorawan_parsers(commands, over_http)


def _lorawan_parsers(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    over_http: str,
) -> None:
    """``zeal-server lorawan bind|list|unbind``: which stream a ChirpStack application's
    uplinks go to (docs/lorawan.md)."""
    lorawan = _command(commands, "lorawan", "LoRaWAN uplinks through ChirpStack" + over_http, ())
    actions = lorawan.add_subparsers(dest="action", required=True, metavar="ACTION")
    bind = _command(
        actions,
        "bind",
        "send a ChirpStack application's uplinks on an FPort to a stream" + over_http,
        (),
    )
    unbind = _command(actions, "unbind", "remove a binding (what was stored stays)" + over_http, ())
    for p in (bind, unbind):
        p.add_argument("application", help="ChirpStack's application id (a UUID)")
        p.add_argument(
            "--port",
            type=int,
            default=0,
            help="the FPort, 1 to 223 [0: the application's ports not bound on their own]",
        )
    bind.add_argument("--stream", required=True, help="the stream their readings go to")
    bind.add_argument(
        "--device-names",
        choices=("dev_eui", "device_name"),
        default="dev_eui",
        help="name devices by DevEUI or by ChirpStack device name [dev_eui]",
    )
    listed = _command(actions, "list", "every binding" + over_http, ())
    for p in (bind, unbind, listed):
        remotecommands.add_server_argument(p)


def _days(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"whole days or none, got {text!r}") from None


def _fail(message: str) -> int:
    print(f"zeal-server: error: {message}", file=sys.stderr)
    return 2


def _database_error(engine: Engine, exc: SQLAlchemyError) -> str:
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    where = engine.url.render_as_string(hide_password=True)
    return f"cannot use the database at {where}: {cause[0] if cause else type(exc).__name__}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asked = (args.command, getattr(args, "action", None))
    if asked in remotecommands.COMMANDS or (
        asked in remotecommands.UNLESS_LOCAL and not args.local
    ):
        return remotecommands.run(args)
    try:
        settings = ServerSettings.from_env(os.environ)
        _nats_names(settings, args)
    except SettingsError as exc:
        return _fail(str(exc))
    return _devices(settings, args) if args.command == "devices" else _local(settings, args)


def _local(settings: ServerSettings, args: argparse.Namespace) -> int:
    """The commands on the database itself (and serve)."""
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
        return _fail(_database_error(engine, exc))
    except store.StoreError as exc:
        return _fail(str(exc))
    finally:
        engine.dispose()


def _nats_names(settings: ServerSettings, args: argparse.Namespace) -> None:
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
                    "Uvicorn running on http://%s (Press CTRL+C to quit)", where
                )

    from zeal_server.api.guard import guarded
    from zeal_server.app import create_app

    # The port first: a busy one is one line and exit 2, before a collector id is claimed
    # on the broker (its persistent session would outlive this process).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((args.host, args.port))
    except OSError as exc:
        listening.close()
        return _fail(
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
    )
    server = _Uvicorn(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down cleanly
        server.run(sockets=[listening])
    return 0 if server.started else 3  # 3: uvicorn's start-up failure, said in its log


def _devices(settings: ServerSettings, args: argparse.Namespace) -> int:
    try:
        devicecommands.run(settings, args)
    except ProvisioningError as exc:
        return _fail(str(exc))
    return 0


def _run(engine: Engine, args: argparse.Namespace) -> int:
    sessions = session_factory(engine)
    with sessions() as session:
        if args.command == "migrate":
            print("schema is up to date")
            return 0
        if args.command == "streams":
            return _streams(session, args)
        streams = store.list_streams(session)
        if getattr(args, "stream", None):
            streams = [s for s in streams if s.name == args.stream]
            if not streams:
                return _fail(f"no stream named {args.stream!r}")
        if args.command == "compact":
            for stream in streams:
                print(f"{stream.name}: {store.compact(session, stream)} periods compacted")
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
        print(f"zeal-server: {store.estimates_note(stream)}", file=sys.stderr)
        for line in store.export_lines(session, stream, first, stop):
            print(line, end="")
        return 0


def _streams(session: Session, args: argparse.Namespace) -> int:
    if args.action == "list":
        streams = store.list_streams(session)
        if args.json:
            print(json.dumps([s.name for s in streams]))
        shown = ("name", "lower", "upper", "unit", "epsilon", "payload_bits", "fingerprint")
        for s in [] if args.json else streams:
            print(remotecommands.stream_line({k: getattr(s, k) for k in shown}))
        if not streams and not args.json:
            print("no streams yet (zeal-server streams create --help)")
        return 0
    if args.action in ("retention", "delete-device"):
        return _stream_data(session, args)
    if args.action == "delete":
        found = store.stream_by_name(session, args.name)
        if found is None:
            return _fail(f"no stream named {args.name!r}")
        if (refused := remotecommands.unconfirmed(args.confirm, args.name)) is not None:
            return _fail(
                f"deleting stream {args.name!r} removes every reading stored for it; {refused}"
            )
        readings = store.delete_stream(session, found)
        session.commit()
        print(
            f"deleted stream {args.name} and its {readings} readings (a running server "
            "retains its signed tombstone on the broker within seconds: its agents halt)"
        )
        return 0
    stream = store.create_stream(
        session, **{k: getattr(args, k) for k in remotecommands.CREATE_FIELDS}
    )
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
        return _fail(f"no stream named {args.name!r}")
    if args.action == "retention":
        store.set_retention(session, stream, args.days)
        session.commit()
        kept = "everything" if args.days is None else f"the last {args.days} days"
        print(f"stream {args.name} keeps {kept} (a running collector applies it within a minute)")
        return 0
    device = session.scalar(
        select(Device).where(Device.stream_id == stream.id, Device.name == args.device)
    )
    if device is None:
        return _fail(f"no device {args.device!r} in stream {args.name!r}")
    if (refused := remotecommands.unconfirmed(args.confirm, args.device)) is not None:
        return _fail(
            f"deleting device {args.device!r} removes every reading it sent to "
            f"{args.name!r}; {refused}"
        )
    readings = store.delete_device_data(session, stream, device)
    session.commit()
    print(f"deleted device {args.device} of stream {args.name} and its {readings} readings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
