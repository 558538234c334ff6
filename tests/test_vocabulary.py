"""docs/api.md's vocabulary table against what the programs accept: the OpenAPI document,
every command's --help, and the server's renamed query names; and an old name at work."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from zeal_edge.cli.main import parser as edge_parser
from zeal_server.api.vocabulary import RENAMED
from zeal_server.cli import parser as server_parser

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("concept", "api", "server", "edge", "old")


def table() -> list[dict[str, list[str]]]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    body = text.split("<!-- vocabulary -->")[1].split("<!-- /vocabulary -->")[0]
    rows = [line for line in body.strip().splitlines()[2:] if line.startswith("|")]
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        out.append({k: re.findall(r"`([^`]+)`", c) for k, c in zip(COLUMNS, cells, strict=True)})
    return out


def names(tokens: list[str]) -> set[str]:
    """Parameter names among a cell's code spans (`independent=device` names independent;
    routes, commands and values are left out)."""
    found = set()
    for token in tokens:
        name = token.split("=")[0]
        if re.fullmatch(r"[a-z_]+", name):
            found.add(name)
    return found


def flags(tokens: list[str]) -> set[str]:
    return {t.split()[0] for t in tokens if t.startswith("--")}


def variables(tokens: list[str]) -> set[str]:
    return {t for t in tokens if t.startswith("ZEAL_")}


def helps(parser: argparse.ArgumentParser) -> str:
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [helps(sub) for sub in action.choices.values()]
    return "\n".join(texts)


def openapi() -> tuple[set[str], set[str]]:
    """(query parameter names, schema property names) of the committed OpenAPI document."""
    doc = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    query = {
        p["name"]
        for operations in doc["paths"].values()
        for operation in operations.values()
        for p in operation.get("parameters", [])
        if p["in"] == "query"
    }
    fields = {n for s in doc["components"]["schemas"].values() for n in s.get("properties", {})}
    return query, fields


def test_the_vocabulary_table_is_what_the_api_and_the_commands_take() -> None:
    rows = table()
    assert len(rows) >= 8
    query, fields = openapi()
    server_help, edge_help = helps(server_parser()), helps(edge_parser())
    old_query: set[str] = set()
    new_query: set[str] = set()
    for row in rows:
        for name in names(row["api"]):
            assert name in query | fields, (row["concept"], name)
        new_query |= names(row["api"]) & query
        for flag in flags(row["server"]):
            assert re.search(rf"{flag}\b", server_help), flag
        for flag in flags(row["edge"]):
            assert re.search(rf"{flag}\b", edge_help), flag
        for variable in variables(row["server"]):
            assert variable in server_help, variable
        for variable in variables(row["edge"]):
            assert variable in edge_help, variable
        # An old option is hidden from --help, and an old query name is no parameter of any
        # route: it is rewritten before routing.
        for program, text in (("server", server_help), ("edge", edge_help)):
            if flags(row[program]):
                for flag in flags(row["old"]):
                    assert not re.search(rf"{flag}(?![-\w])", text), (program, flag)
        for program, text in (("server", server_help), ("edge", edge_help)):
            current = variables(row[program])
            if current:
                for variable in variables(row["old"]) - current:
                    assert not re.search(rf"(?<![A-Z_]){variable}\b", text), (program, variable)
        old = names(row["old"])
        assert not old & query, old & query
        old_query |= old
    renamed = {old: new for names_ in RENAMED.values() for old, new in names_.items()}
    assert old_query == set(renamed), "docs/api.md and zeal_server.api.vocabulary differ"
    assert set(renamed.values()) <= new_query
