"""What every family of ``zeal-server`` commands shares: the parser maker, one-line errors,
the ``--server`` and ``--local`` options, and what local and remote stream commands both
print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, TypeAlias

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from zeal_server.settings import variables_help

__all__ = [
    "ASKS",
    "CREATE_FIELDS",
    "DATABASE",
    "DEFAULT_SERVER",
    "OVER_HTTP",
    "Commands",
    "add_local_argument",
    "add_server_argument",
    "command",
    "database_error",
    "days",
    "fail",
    "stream_line",
    "unconfirmed",
]

#: argparse's sub-command action (its class is private to argparse).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # noqa: SLF001
DATABASE = ("ZEAL_DATA_DIR", "ZEAL_DATABASE_URL")
DEFAULT_SERVER = "http://127.0.0.1:8000"
FORMATTER = argparse.RawDescriptionHelpFormatter
#: Said by the commands that ask the running server unless given --local.
ASKS = " (asks the running server: --server or ZEAL_SERVER_URL; --local: the database)"
#: Said by the commands that only ask the running server.
OVER_HTTP = " (asks the running server: --server or ZEAL_SERVER_URL, the read token)"


def command(
    commands: Commands,
    name: str,
    text: str,
    variables: tuple[str, ...] | None = DATABASE,
) -> argparse.ArgumentParser:
    """A (sub)command's parser, its help and the settings it reads in its epilog."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=text,
        description=text,
        epilog=variables_help(variables),
        formatter_class=FORMATTER,
    )
    return parser


def add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        help=f"the running server's URL [env ZEAL_SERVER_URL; default {DEFAULT_SERVER}]",
    )
    parser.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help="CA certificate its https:// certificate is checked with (the stack's "
        "deploy/tls/ca.crt) [env ZEAL_SERVER_CA; default: the system's CAs]",
    )


def add_local_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--local",
        action="store_true",
        help="open the database (ZEAL_DATABASE_URL, or ZEAL_DATA_DIR) instead of asking "
        "the running server: for maintenance while no server runs",
    )


def days(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"whole days or none, got {text!r}") from None


def fail(message: str) -> int:
    print(f"zeal-server: error: {message}", file=sys.stderr)
    return 2


def database_error(engine: Engine, exc: SQLAlchemyError) -> str:
    cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    where = engine.url.render_as_string(hide_password=True)
    return f"cannot use the database at {where}: {cause[0] if cause else type(exc).__name__}"


def unconfirmed(confirm: str | bool | None, name: str) -> str | None:
    """Why a deletion is not confirmed (None: it is). True is the old --yes."""
    if confirm is True or confirm == name:
        return None
    if confirm is None:
        return f"add --confirm {name} to confirm"
    return f"--confirm names {confirm!r}, not {name!r}"


#: The options of `streams create`, named as the fields of POST /streams.
CREATE_FIELDS = (
    *("name", "lower", "upper", "epsilon", "payload_bits", "exponent", "bucket_seconds"),
    *("description", "unit", "enrolled_only", "retention_days", "max_epsilon_per_day"),
)


def stream_line(s: Mapping[str, Any]) -> str:
    """One stream in `streams list`, from the API's answer or the store's row alike."""
    unit = f" {s['unit']}" if s["unit"] else ""
    return (
        f"{s['name']}  [{s['lower']:g}, {s['upper']:g}]{unit}  epsilon {s['epsilon']:g}  "
        f"{s['payload_bits']} bits  fingerprint {s['fingerprint']}"
    )
