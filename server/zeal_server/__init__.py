"""Zeal server (issue 4): MQTT collector, compressed store, aggregator HTTP API.

Only the package exists so far; the server itself is built in a later issue.
"""

__all__: list[str] = []
