"""Zeal server: the MQTT collector, the compressed store, the aggregating HTTP API and the
operator dashboard (``zeal-server``; docs/server.md)."""

__all__: list[str] = []
