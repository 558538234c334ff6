"""Zeal edge agent: reads a sensor, privatizes each reading with :mod:`zeal`, publishes the
codes over MQTT from a durable outbox (``zeal-edge``; docs/edge-agent.md)."""

__all__: list[str] = []
