"""What every family of ``zeal-server`` commands shares: the parser maker, one-line errors,
the ``--server`` and ``--local`` options, and what local and remote stream commands both
print."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from zeal_server.settings import variables_help

__all__ = [
    "ASKS_READ",
    "ASKS_WRITE",
    "CREATE_FIELDS",
    "DATABASE",
    "DEFAULT_SERVER",
    "READS",
    "WRITES",
    "Commands",
    "add_local_argument",
    "add_server_argument",
    "command",
    "database_error",
    "days",
    "fail",
    "stream_line",
    "unconfirmed",
    "write_export",
]

#: argparse's sub-command action (its class is private to argparse).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # noqa: SLF001
DATABASE = ("ZEAL_DATA_DIR", "ZEAL_DATABASE_URL")
DEFAULT_SERVER = "http://127.0.0.1:8000"
FORMATTER = argparse.RawDescriptionHelpFormatter
#: The token a command sends, by what it does at the running server (asking.open_server).
TOKENS = {
    "read": "ZEAL_READ_TOKEN (else ZEAL_OPERATOR_TOKEN)",
    "write": "ZEAL_OPERATOR_TOKEN",
}
#: Said by the commands that only read from the running server.
READS = f" (asks the running server: --server or ZEAL_SERVER_URL; token {TOKENS['read']})"
#: Said by the commands that change something at the running server.
WRITES = f" (asks the running server: --server or ZEAL_SERVER_URL; token {TOKENS['write']})"
#: Said by the commands that ask the running server unless given --local: to read, to write.
ASKS_READ = (
    f" (asks the running server: --server or ZEAL_SERVER_URL, token {TOKENS['read']}; "
    "--local: the database)"
)
ASKS_WRITE = (
    f" (asks the running server: --server or ZEAL_SERVER_URL, token {TOKENS['write']}; "
    "--local: the database)"
)
#: What a command that asks the running server reads from the environment, by what it
#: does there.
_CLIENT = {
    "ZEAL_SERVER_URL": f"the running server's URL [default: {DEFAULT_SERVER}]",
    "ZEAL_SERVER_CA": "CA certificate of an https:// server [default: the system's CAs]",
}
_TOKEN_HELP = {
    "read": (
        ("ZEAL_READ_TOKEN", "the server's read token, where it has one [default: none]"),
        ("ZEAL_OPERATOR_TOKEN", "sent instead when ZEAL_READ_TOKEN is not set: it opens reads"),
    ),
    "write": (
        (
            "ZEAL_OPERATOR_TOKEN",
            "the server's operator token: this command writes [default: none]",
        ),
    ),
}


def command(
    commands: Commands,
    name: str,
    text: str,
    variables: tuple[str, ...] | None = DATABASE,
    asks: str | None = None,
) -> argparse.ArgumentParser:
    """A (sub)command's parser, its help and the settings it reads in its epilog (`asks`:
    "read" or "write" for a command that asks the running server, whose variables and
    token it lists too)."""
    epilog = variables_help(variables) if variables != () else ""
    if asks is not None:
        lines = [f"  {k:<24} {v}" for k, v in (*_CLIENT.items(), *_TOKEN_HELP[asks])]
        client = "\n".join(["environment variables (asking the server):", *lines])
        epilog = f"{epilog}\n\n{client}" if epilog else client
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=text,
        description=text,
        epilog=epilog or None,
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


def write_export(chunks: Iterable[bytes], out: str | None) -> int:
    """Write an export's bytes to the file `out` (None: stdout); on a terminal, how much
    so far on stderr, twice a second, and the total at the end. Bytes written."""
    shown = sys.stderr.isatty()
    done, last = 0, time.monotonic()
    sink = open(out, "wb") if out else sys.stdout.buffer  # noqa: SIM115 (closed below)
    try:
        for chunk in chunks:
            sink.write(chunk)
            done += len(chunk)
            if shown and time.monotonic() - last >= 0.5:
                last = time.monotonic()
                print(f"\rzeal-server: exported {done / 1e6:,.1f} MB", end="", file=sys.stderr)
        sink.flush()
    finally:
        if out:
            sink.close()
    if shown:
        where = f" to {out}" if out else ""
        print(f"\rzeal-server: exported {done / 1e6:,.1f} MB{where}", file=sys.stderr)
    return done


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
    "grid_points",
)


def stream_line(s: Mapping[str, Any]) -> str:
    """One stream in `streams list`, from the API's answer or the store's row alike."""
    unit = f" {s['unit']}" if s["unit"] else ""
    return (
        f"{s['name']}  [{s['lower']:g}, {s['upper']:g}]{unit}  epsilon {s['epsilon']:g}  "
        f"{s['payload_bits']} bits  fingerprint {s['fingerprint']}"
    )
