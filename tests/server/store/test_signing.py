"""The installation's signing key (zeal_server.store.signing): made once per database, kept by
a backup and its restore, and what it signs verifies on the agent's side (zeal_edge.trust)
and nowhere else."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.server.helpers import postgres_database
from zeal.signed import CONFIG_PURPOSE, NOTICE_PURPOSE
from zeal_edge.errors import UnverifiedError
from zeal_edge.trust import verified
from zeal_server import store
from zeal_server.store.db import make_engine, migrate, session_factory


def signed_config(url: str, *, create: bool) -> dict[str, Any]:
    """Stream temps's configuration on the database at `url` (created first if asked)."""
    engine = make_engine(url)
    try:
        migrate(engine)
        with session_factory(engine)() as session, session.begin():
            if create:
                store.create_stream(session, name="temps", lower=0, upper=110, epsilon=1)
            stream = store.stream_by_name(session, "temps")
            assert stream is not None
            return store.config_of(session, stream)
    finally:
        engine.dispose()


def test_what_the_server_signs_verifies_under_its_key_and_nothing_else_does(tmp_path: Path) -> None:
    """A configuration verifies under its key, as bytes on the wire; changed in any field,
    signed for another purpose, or checked against another database's key, it does not."""
    config = signed_config(f"sqlite:///{tmp_path / 'a.sqlite'}", create=True)
    other = signed_config(f"sqlite:///{tmp_path / 'b.sqlite'}", create=True)
    wire = json.dumps(config).encode()
    assert verified(wire, CONFIG_PURPOSE, config["key"]) == config
    assert config["key"] != other["key"]
    for changed in ({**config, "epsilon": 2.0}, {**config, "created_ms": 1}, {**config, "x": 1}):
        with pytest.raises(UnverifiedError, match="does not verify"):
            verified(json.dumps(changed).encode(), CONFIG_PURPOSE, config["key"])
    with pytest.raises(UnverifiedError, match="does not verify"):
        verified(wire, NOTICE_PURPOSE, config["key"])
    with pytest.raises(UnverifiedError, match="another key"):
        verified(wire, CONFIG_PURPOSE, other["key"])


@pytest.mark.integration
def test_a_restored_database_keeps_its_key(tmp_path: Path) -> None:
    """SQLite copied with its online backup API, PostgreSQL with pg_dump into a new
    database: the restored server signs with the same key, so its agents go on trusting it."""
    source, copy = tmp_path / "zeal.sqlite", tmp_path / "restored.sqlite"
    before = signed_config(f"sqlite:///{source}", create=True)
    with sqlite3.connect(source) as live, sqlite3.connect(copy) as backup:
        live.backup(backup)
    after = signed_config(f"sqlite:///{copy}", create=False)
    assert after["key"] == before["key"]
    verified(json.dumps(after).encode(), CONFIG_PURPOSE, before["key"])

    databases = postgres_database(), postgres_database()
    original, restored = (next(d) for d in databases)
    try:
        before = signed_config(original, create=True)
        plain = [u.replace("postgresql+psycopg://", "postgresql://") for u in (original, restored)]
        dump = subprocess.run(["pg_dump", plain[0]], capture_output=True, check=True).stdout
        subprocess.run(["psql", "-q", plain[1]], input=dump, capture_output=True, check=True)
        after = signed_config(restored, create=False)
        assert after["key"] == before["key"]
        verified(json.dumps(after).encode(), CONFIG_PURPOSE, before["key"])
    finally:
        for database in databases:
            next(database, None)
