"""Engine and schema: Alembic migrations run at start-up (``zeal-server migrate`` too)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from zeal_server.errors import StoreError

__all__ = ["database_state", "error_text", "make_engine", "migrate", "session_factory"]

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: PostgreSQL advisory lock key of schema migrations ("zeal" in ASCII): replicas that start
#: together migrate one after the other, and the later ones find the schema up to date.
MIGRATION_LOCK = 0x7A65616C


def make_engine(url: str, *, pool_size: int = 5, pool_timeout: float = 30.0) -> Engine:
    """An engine with its own connection pool: `pool_size` connections and as many again
    under load; a checkout waits at most `pool_timeout` seconds (then the caller gets an
    error instead of hanging). The API and the collector each get one, so HTTP load can
    never take the connections the collector stores with."""
    pool: dict[str, float] = {
        "pool_size": pool_size,
        "max_overflow": pool_size,
        "pool_timeout": pool_timeout,
    }
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:"):
            pool = {}  # one connection per thread (SingletonThreadPool): no pool to size
        elif url.startswith("sqlite:///"):  # its folder made where it is opened
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **pool
        )

        @event.listens_for(engine, "connect")
        def _pragmas(connection, _record):  # type: ignore[no-untyped-def]
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


def migrate(engine: Engine) -> tuple[str | None, str | None]:
    """Bring the schema to the latest revision; returns the revisions before and after.

    Alembic's own INFO lines are shown only when this module's logger is at DEBUG
    (``--log-level DEBUG``); an upgrade that changed something is logged in one line. On
    PostgreSQL the whole upgrade runs in one transaction holding MIGRATION_LOCK, so two
    processes starting on one database never race (SQLite serializes writers itself).
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    if not log.isEnabledFor(logging.DEBUG):
        alembic_log.setLevel(logging.WARNING)
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:  # batch mode copies tables other tables point to (revision 0014):
                # SQLite checks foreign keys on the copy's DROP, so they are off meanwhile
                # (a pragma outside a transaction), and checked once at the end
                connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
                connection.commit()
            try:
                with connection.begin():
                    if not sqlite:
                        connection.execute(
                            text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
                        )
                    before = MigrationContext.configure(connection).get_current_revision()
                    config.attributes["connection"] = connection
                    command.upgrade(config, "head")
                    after = MigrationContext.configure(connection).get_current_revision()
                    if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
                        raise StoreError("the upgrade left rows that point nowhere; rolled back")
            finally:
                if sqlite:
                    connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                    connection.commit()
    finally:
        alembic_log.setLevel(level)
    if before != after:
        log.info("database schema upgraded from %s to revision %s", before or "empty", after)
    return before, after


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def database_state(engine: Engine) -> str:
    """ "ok" when the database answers a trivial query, "busy" when every connection of the
    pool is taken (it answers, slowly), else "down: <error type>"."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        return f"down: {type(exc).__name__}"
    except TimeoutError:
        return "busy"
    return "ok"


def error_text(exc: BaseException) -> str:
    """A database error in one line, without the SQL statement or its parameters."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first}"[:300]
