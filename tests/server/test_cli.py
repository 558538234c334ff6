"""`zeal-server` as a newcomer meets it: documented options, one-line errors, quiet start."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.helpers import zeal_server
from tools.testbed.broker import free_port
from zeal_server.cli import parser as _parser
from zeal_server.settings import VARIABLES

UNREACHABLE = "postgresql+psycopg://zeal:hunter2-secret@127.0.0.1:{port}/zeal"

ROOT = Path(__file__).resolve().parents[2]


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= commands(sub, (*path, name))
    return found


def test_every_command_documents_its_options_and_the_environment() -> None:
    """Every option and argument of every command has a help text, and every command's help
    lists the environment variables it reads (serve and the top level: all of them)."""
    found = commands(_parser())
    assert ("streams", "delete") in found
    assert ("serve",) in found
    for path, parser in found.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if (not path and action.dest == "log_level") or path:
                assert action.help, (path, action.dest)
    for path in [("serve",), ()]:
        text = zeal_server(*path, "--help").stdout
        for variable in VARIABLES:
            assert variable in text, (path, variable)
    text = zeal_server("streams", "create", "--help").stdout
    assert "ZEAL_DATABASE_URL" in text
    assert "--unit UNIT" in text


@pytest.mark.parametrize(
    "command", [["streams", "list", "--local"], ["serve", "--port", "0"], ["migrate"]]
)
def test_an_unreachable_database_is_one_line_without_the_password(command: list[str]) -> None:
    """No traceback: one line that names the database (password masked) and the cause."""
    url = UNREACHABLE.format(port=free_port())
    result = zeal_server(*command, env={"ZEAL_DATABASE_URL": url})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("zeal-server: error: cannot use the database at postgresql")
    assert "Connection refused" in lines[0] or "connection refused" in lines[0].lower()
    assert "hunter2" not in result.stderr


def test_migrations_are_quiet_unless_asked(tmp_path: Path) -> None:
    """A new database: one line says the schema was created, one names the database; the
    next run only names the database; --log-level DEBUG shows Alembic's own steps."""
    url = f"sqlite:///{tmp_path / 'z.sqlite'}"
    env = {"ZEAL_DATABASE_URL": url}
    first = zeal_server("streams", "list", "--local", env=env)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 2, first.stderr
    assert "schema upgraded" in lines[0], first.stderr
    assert lines[1] == f"zeal-server: the database {url}", first.stderr
    assert "no streams yet" in first.stdout
    again = zeal_server("streams", "list", "--local", env=env)
    assert again.stderr == f"zeal-server: the database {url}\n"
    verbose = zeal_server("--log-level", "DEBUG", "streams", "list", "--local", env=env)
    assert "alembic" in verbose.stderr


def test_an_unreachable_broker_is_one_line_that_names_it(tmp_path: Path) -> None:
    """`serve` with no broker at ZEAL_MQTT_URL keeps serving the API and says, in one line
    without a traceback, which broker it cannot reach and why; it says where it listens."""
    port, http_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "zeal_server", "serve", "--port", str(http_port)],
        env={
            **os.environ,
            "ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'z.sqlite'}",
            "ZEAL_MQTT_URL": f"mqtt://127.0.0.1:{port}",
            "ZEAL_DATA_DIR": str(tmp_path / "data"),
        },
        stderr=subprocess.PIPE,
        text=True,
    )
    wanted = f"cannot connect to the broker mqtt://127.0.0.1:{port}: [Errno 111] Connection refused"
    listening = f"Uvicorn running on http://127.0.0.1:{http_port} (Press CTRL+C to quit)"
    lines: list[str] = []
    try:  # the lines are the state this waits for: a busy machine imports slowly
        assert server.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            any(text in line for line in lines) for text in (wanted, listening)
        ):
            line = server.stderr.readline()
            if not line:
                break
            lines.append(line)
    finally:
        server.send_signal(signal.SIGINT)
        _, rest = server.communicate(timeout=60)
    err = "".join(lines) + rest
    assert wanted in err, err
    assert listening in err, err
    assert sum("cannot connect" in line for line in err.splitlines()) == 1  # once a minute
    assert "Traceback" not in err


def test_deleting_a_stream_asks_for_confirmation(tmp_path: Path) -> None:
    """Without --confirm NAME (as the API's confirm=NAME) nothing is deleted and the message
    says what to add; another name is refused; the old --yes works for one release, saying
    so."""
    env = {"ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'z.sqlite'}"}
    local = ("--local",)  # the same over HTTP: tests/server/test_remote_commands.py
    create = zeal_server(
        "streams", "create", "t", "--lower", "0", "--upper", "1", "--epsilon", "1", *local, env=env
    )
    assert create.returncode == 0, create.stderr
    refused = zeal_server("streams", "delete", "t", *local, env=env)
    assert refused.returncode == 2
    assert "add --confirm t to confirm" in refused.stderr
    wrong = zeal_server("streams", "delete", "t", "--confirm", "u", *local, env=env)
    assert wrong.returncode == 2
    assert "--confirm names 'u', not 't'" in wrong.stderr
    assert zeal_server("streams", "list", "--json", *local, env=env).stdout.strip() == '["t"]'
    assert zeal_server("streams", "delete", "t", "--confirm", "t", *local, env=env).returncode == 0
    assert zeal_server("streams", "list", "--json", *local, env=env).stdout.strip() == "[]"
    again = zeal_server(
        "streams", "create", "t", "--lower", "0", "--upper", "1", "--epsilon", "1", *local, env=env
    )
    assert again.returncode == 0, again.stderr
    old = zeal_server("streams", "delete", "t", "--yes", *local, env=env)
    assert old.returncode == 0
    assert "--yes is now --confirm NAME; the old name goes in the next release" in old.stderr
    assert zeal_server("streams", "list", "--json", *local, env=env).stdout.strip() == "[]"
    missing = zeal_server("streams", "delete", "t", "--confirm", "t", *local, env=env)
    assert (missing.returncode, missing.stderr.strip().splitlines()[-1]) == (
        2,
        "zeal-server: error: no stream named 't'",
    )


def test_a_busy_port_is_one_line_and_claims_nothing(tmp_path: Path) -> None:
    """A second serve on a port in use: one line naming it, exit 2, and no collector id
    claimed on the broker (ZEAL_MQTT_URL points at an address where nothing listens: the
    serve never gets as far as trying). Before: uvicorn's multi-line error and exit 3,
    after the collector had claimed an id whose persistent session lingered on the broker."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = zeal_server(
            "serve",
            "--port",
            str(port),
            env={
                "ZEAL_DATABASE_URL": f"sqlite:///{tmp_path / 'z.sqlite'}",
                "ZEAL_MQTT_URL": f"mqtt://127.0.0.1:{free_port()}",
            },
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        f"zeal-server: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another server on that port? choose one with --port)"
    ), result.stderr
    assert lines[:-1] == [line for line in lines if "schema upgraded" in line]  # a new database
    assert "collector" not in result.stderr.lower()


def test_the_docs_settings_table_gives_each_variable_its_default() -> None:
    """docs/server.md's settings table names every variable the server reads, each with the
    default the server takes (``settings.VARIABLES``, where every default is written once;
    an explanation may follow it in parentheses)."""
    text = (ROOT / "docs" / "server.md").read_text()
    section = text.split("## Settings (environment)", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for row in section.splitlines():
        if not row.startswith("| `ZEAL_"):
            continue
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        default = cells[1].replace("`", "").replace(",", "")
        for name in re.findall(r"`(ZEAL_[A-Z0-9_/]+)`", cells[0]):
            head, *more = name.split("/")
            stem = head.rsplit("_", 1)[0]
            for each in (head, *(f"{stem}_{tail}" for tail in more)):
                documented[each] = default
    assert sorted(documented) == sorted(VARIABLES)
    wrong = {
        name: (VARIABLES[name].default, said)
        for name, said in documented.items()
        if said != VARIABLES[name].default.replace(",", "")
        and not said.startswith(VARIABLES[name].default + " (")
    }
    assert wrong == {}
