"""The ``zeal-server`` command: one parser made of each family's (zeal_server.cli.local,
.remote, .lorawan, .devices), and one table of what runs where."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from zeal_server.cli.asking import Handler
from zeal_server.cli.asking import run as ask_the_server
from zeal_server.cli.common import FORMATTER, fail
from zeal_server.cli.devices import add_parsers as add_device_parsers
from zeal_server.cli.devices import run as run_devices
from zeal_server.cli.local import add_parsers as add_local_parsers
from zeal_server.cli.local import nats_names
from zeal_server.cli.local import run as run_locally
from zeal_server.cli.lorawan import HANDLERS as LORAWAN
from zeal_server.cli.lorawan import add_parsers as add_lorawan_parsers
from zeal_server.cli.remote import HANDLERS as OVER_HTTP
from zeal_server.cli.remote import add_parsers as add_remote_parsers
from zeal_server.settings import ServerSettings, SettingsError, variables_help

__all__ = ["REMOTE", "USAGE", "main", "parser"]

USAGE = """``zeal-server``: serve the API and collector, manage streams, check and export the store.

zeal-server serve [--host H] [--port P]      API + collector (settings: ZEAL_* variables)

Asking the running server over HTTP (--server URL or ZEAL_SERVER_URL, default
http://127.0.0.1:8000; ZEAL_READ_TOKEN (or ZEAL_OPERATOR_TOKEN) for reads,
ZEAL_OPERATOR_TOKEN for changes):
zeal-server streams create NAME --lower L --upper U --epsilon E [--unit degF] ...
zeal-server streams list | streams show NAME | streams devices NAME
zeal-server streams delete NAME --confirm NAME   the stream and all its data
zeal-server streams retention NAME DAYS|none  keep whole buckets of the last DAYS days only
zeal-server streams release NAME             agents halted on the stream adopt it again
zeal-server streams delete-device NAME DEVICE --confirm DEVICE   one device's data
zeal-server export STREAM [--start T] [--end T]   decoded estimates as CSV
zeal-server average STREAM [--start T] [--end T] [--group K:V] [--device D]
zeal-server series STREAM [--interval-seconds S] [--quantile Q] ...  |  zeal-server tail STREAM
zeal-server distribution STREAM [--bins B] [--quantiles 0.5,0.9] [--above X] ...  histogram
zeal-server enroll STREAM DEVICE  |  zeal-server policy set STREAM EPSILON_PER_DAY
zeal-server policy device DEVICE EPSILON|none [--days 30|365]  |  policy tag KEY:VALUE ...
zeal-server policy show DEVICE               a device's cap across streams, its spend (1-365 days)
zeal-server rejects STREAM [--limit N]       who sent its rejected messages, and why

On the database itself (ZEAL_DATABASE_URL or ZEAL_DATA_DIR; the line on stderr names it):
zeal-server verify [STREAM]                  every segment row's sums == its readings'
zeal-server compact [STREAM]                 merge raw parts into compressed chunks
zeal-server migrate                          bring the database schema up to date
zeal-server key [rotate]                     the public key agents are given (rotate: a new
                                             one, endorsed by the old)
zeal-server streams ... --local, export --local   as above, while no server runs

zeal-server devices provision NAME           a broker login for a device (password shown once,
                                             with the server's key)
zeal-server devices revoke NAME              remove it: the device is disconnected, for good
zeal-server devices list                     devices with a login made here
zeal-server devices harden                   deny-by-default rules on logins made before them

Errors (a bad setting, an unreachable database) are one line on stderr and exit status 2.
"""

#: Every command the running server carries out, by (command, action): those given
#: --local run on the database instead; every other command runs here (devices at the
#: broker, the rest on the database).
REMOTE: dict[tuple[str, str | None], Handler] = {**OVER_HTTP, **LORAWAN}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="zeal-server",
        description=USAGE,
        epilog=variables_help(),
        formatter_class=FORMATTER,
    )
    root.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="how much to log on stderr (DEBUG also shows the schema migrations' steps)",
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    streams = add_local_parsers(commands)
    add_device_parsers(commands)
    add_remote_parsers(commands, streams)
    add_lorawan_parsers(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = REMOTE.get((args.command, getattr(args, "action", None)))
    if handler is not None and not getattr(args, "local", False):
        return ask_the_server(handler, args)
    try:
        settings = ServerSettings.from_env(os.environ)
        nats_names(settings, args)
    except SettingsError as exc:
        return fail(str(exc))
    if args.command == "devices":
        return run_devices(settings, args)
    return run_locally(settings, args)
