"""``zeal-edge``, the agent's command (``main``): a module per family of commands."""

from zeal_edge.cli.main import main

__all__ = ["main"]
