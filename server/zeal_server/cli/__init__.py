"""The ``zeal-server`` command: ``zeal_server.cli.main`` makes its parser of each family's
(``local``, ``remote``, ``lorawan``, ``devices``) and says what runs where."""

from __future__ import annotations

from zeal_server.cli.main import main, parser

__all__ = ["main", "parser"]
