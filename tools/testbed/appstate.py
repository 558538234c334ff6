"""A running server application's state, typed, for tests that look inside it.

``app.state`` is Starlette's untyped ``State``, and ``TestClient.app`` is any ASGI app: a
test reading ``client.app.state.sessions`` had to silence the type checker at every use.
``state(client)`` checks once that the client serves Zeal's FastAPI application and gives
what its lifespan put there (``zeal_server.api.application.build_app``) with its type.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from zeal_server.api.costs import ReadBudget
from zeal_server.broker.collector import Collector

__all__ = ["AppState", "state"]


class AppState:
    """What the application's lifespan keeps (the attributes tests read)."""

    def __init__(self, app: FastAPI) -> None:
        self._state = app.state

    @property
    def sessions(self) -> sessionmaker[Session]:
        """The API's sessions on the database."""
        found: sessionmaker[Session] = self._state.sessions
        return found

    @property
    def engine(self) -> Engine:
        found: Engine = self._state.engine
        return found

    @property
    def reads(self) -> ReadBudget:
        """The budget of heavy reads running at once."""
        found: ReadBudget = self._state.reads
        return found

    @property
    def collector(self) -> Collector:
        """The running collector (a server started without one has None: an error here)."""
        found = self._state.collector
        assert isinstance(found, Collector), "this server runs no collector"
        return found

    @collector.setter
    def collector(self, value: Collector | None) -> None:
        self._state.collector = value


def state(client: TestClient) -> AppState:
    """The state of the application `client` serves."""
    app = client.app
    assert isinstance(app, FastAPI), f"not a FastAPI application: {app!r}"
    return AppState(app)
