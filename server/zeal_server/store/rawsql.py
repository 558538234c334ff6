"""The write path's statements on the session's own DBAPI cursor (``Raw``): compiled once
to SQL text with its parameter order, run without SQLAlchemy's execution pipeline, errors
raised as SQLAlchemy's."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from zeal_server.store.writes import build_rows, build_statement, unnest_rows

__all__ = ["MAX_ROWS", "Raw"]

#: Rows per multi-row statement, at most: powers of two up to 128 keep the compiled
#: variants at eight per statement (compiling 128 rows takes SQLAlchemy some 10 ms), and 128
#: rows of 7 values stay far below SQLite's 32,766 parameters.
MAX_ROWS = 128
#: Multi-row statements compiled in this process, by dialect, statement, rows, columns and
#: other parameters: every Ingest (a restarted collector, each app in a test) reuses them.
_PLANS: dict[tuple[str, str, int, tuple[str, ...], tuple[str, ...]], tuple[str, Any]] = {}


class Raw:
    """The per-message statements of the write path (``seen``, the policy's ``charge_*``
    and ``uncharge_*``, and their multi-row forms) run on the session's own DBAPI cursor,
    in its transaction: compiled once per dialect to SQL text with its parameter order.
    SQLAlchemy's execution pipeline costs about 100 microseconds a statement, several times
    the database's own work for a one-reading message. ``open`` gives a cursor for one
    batch of messages."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str, tuple[str, ...]], tuple[str, list[str] | None]] = {}
        self._session: Session | None = None
        self._cursor: Any = None

    def open(self, session: Session) -> None:
        self.close()
        self._session, self._cursor = session, session.connection().connection.cursor()

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
        self._session = self._cursor = None

    def first(self, session: Session, name: str, params: dict[str, Any]) -> Any:
        """The statement's first row (None if it returns none)."""
        dialect = session.get_bind().dialect
        key = (dialect.name, name, tuple(params))
        found = self._compiled.get(key)
        if found is None:
            compiled = build_statement(session, name).compile(
                dialect=dialect, column_keys=list(params)
            )
            order = list(compiled.positiontup or []) if dialect.positional else None
            found = self._compiled[key] = (str(compiled), order)
        sql, order = found
        values = [params[k] for k in order] if order is not None else params
        rows = self._run(session, sql, values)
        return rows[0] if rows else None

    def many(
        self,
        session: Session,
        name: str,
        columns: tuple[str, ...],
        rows: npt.NDArray[np.int64],
        extra: dict[str, int] | None = None,
    ) -> list[Any]:
        """The multi-row form of `name` (``build_rows``) over `rows` (one value per name of
        `columns` each; `extra`: the statement's other parameters), in chunks of a power of
        two up to MAX_ROWS (on PostgreSQL one statement over arrays, ``unnest_rows``):
        every row RETURNING gives."""
        extra = extra or {}
        dialect = session.get_bind().dialect
        if dialect.name == "postgresql":  # one statement, its rows as arrays
            if not len(rows):
                return []
            arrays = dict(zip(columns, rows.T.tolist(), strict=True))
            return self._run(session, unnest_rows(name, columns), arrays | extra)
        out: list[Any] = []
        at = 0
        while at < len(rows):
            size = min(MAX_ROWS, 1 << ((len(rows) - at).bit_length() - 1))
            key = (dialect.name, name, size, columns, tuple(extra))
            plan = _PLANS.get(key)
            if plan is None:
                plan = _PLANS[key] = self._plan(session, name, size, columns, tuple(extra))
            sql, order = plan
            flat = np.concatenate(
                [rows[at : at + size].ravel(), np.array(list(extra.values()), dtype=np.int64)]
            )
            values: Any = (
                flat[order].tolist()
                if dialect.positional
                else dict(zip(order, flat.tolist(), strict=True))
            )
            out.extend(self._run(session, sql, values))
            at += size
        return out

    def _plan(
        self,
        session: Session,
        name: str,
        size: int,
        columns: tuple[str, ...],
        extra: tuple[str, ...],
    ) -> tuple[str, Any]:
        """SQL text of `name` for `size` rows, with where each parameter comes from: an
        index into (the rows' values row by row, then `extra`) for positional drivers, the
        names in that order for named ones."""
        dialect = session.get_bind().dialect
        compiled = build_rows(session, name, size).compile(dialect=dialect)
        names = [f"r{r}_{c}" for r in range(size) for c in columns] + list(extra)
        if not dialect.positional:
            return str(compiled), names
        where = {n: i for i, n in enumerate(names)}
        return str(compiled), np.array([where[n] for n in compiled.positiontup or []])

    def _run(self, session: Session, sql: str, values: Any) -> list[Any]:
        if self._session is not session:
            self.open(session)
        dialect = session.get_bind().dialect
        cursor = self._cursor
        try:
            cursor.execute(sql, values)
            return cursor.fetchall() if cursor.description is not None else []
        except dialect.loaded_dbapi.Error as exc:
            # As SQLAlchemy would raise it (IntegrityError, OperationalError, ...): the
            # collector's retry and rollback paths catch those, not the driver's own.
            raise DBAPIError.instance(
                sql, values, exc, dialect.loaded_dbapi.Error, dialect=dialect
            ) from exc
