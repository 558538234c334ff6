"""Zeal edge agent: reads a sensor, privatizes each reading with :mod:`zeal`, publishes the
codes over MQTT from a durable outbox (``zeal-edge``; docs/edge-agent.md).

The agent runs from the command line; its errors (``zeal_edge.errors``) are re-exported
here.
"""

from zeal_edge.errors import AgentError, EdgeError, OutboxError, PublishError, SettingsError

__all__ = ["AgentError", "EdgeError", "OutboxError", "PublishError", "SettingsError"]
