"""The server as it runs: the HTTP application of ``zeal_server.api`` wired to the
collector and the login admin of ``zeal_server.broker``. The one module that knows both
(docs/architecture.md); ``zeal-server serve`` and the tests start the server from here."""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from zeal_server.api import application
from zeal_server.api.running import Running
from zeal_server.broker.collector import Collector
from zeal_server.broker.provisioning import admin_for
from zeal_server.settings import ServerSettings

__all__ = ["create_app"]


def _start_collector(settings: ServerSettings, sessions: sessionmaker[Session]) -> Running:
    collector = Collector(settings, sessions)
    collector.start()
    return collector


def create_app(settings: ServerSettings | None = None, *, collector: bool = True) -> FastAPI:
    """The FastAPI application of a server; settings from the environment unless given.
    Without `collector` the server answers HTTP only, even with a broker configured."""
    return application.build_app(
        settings, collector=_start_collector if collector else None, logins_for=admin_for
    )
