"""Broker URLs shared by the agent and the server: ``mqtt://host:port`` or ``mqtts://``.

Standard library only; clients are made by :mod:`zeal.mqtt.client` (which needs paho).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "PROTOCOLS",
    "BrokerSettings",
    "Flapping",
    "parse_broker_url",
    "parse_protocol",
    "why_unreachable",
]

#: The MQTT versions Zeal speaks: 5 (the default) and 3.1.1, for brokers and bridges
#: that speak nothing newer (NATS, RabbitMQ, Azure IoT Hub, older AWS IoT endpoints).
PROTOCOLS = ("5", "3.1.1")


@dataclass(frozen=True)
class BrokerSettings:
    """Where and how to connect."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    keepalive: int = 30
    #: "5" or "3.1.1" (:data:`PROTOCOLS`).
    protocol: str = "5"

    @property
    def url(self) -> str:
        """The broker's address as a URL (never with credentials), for messages."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str, **extra: Any) -> BrokerSettings:
    """``mqtt://host[:port]`` (1883) or ``mqtts://host[:port]`` (TLS, 8883)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise ValueError(f"broker URL {url!r} must look like mqtt://host:port or mqtts://host:port")
    if parts.username or parts.password:
        raise ValueError("put credentials in --username and ZEAL_MQTT_PASSWORD, not in the URL")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise ValueError(f"broker URL {url!r} has an invalid port") from exc
    return BrokerSettings(host=parts.hostname, port=port, tls=tls, **extra)


def parse_protocol(text: str | None) -> str:
    """``ZEAL_MQTT_PROTOCOL``: "5" (also "v5", "5.0"; the default when empty) or "3.1.1"
    (also "v3.1.1", "311")."""
    value = (text or "5").strip().lower().removeprefix("v")
    value = {"5.0": "5", "311": "3.1.1"}.get(value, value)
    if value not in PROTOCOLS:
        raise ValueError(f"the MQTT protocol must be 5 or 3.1.1, got {text!r}")
    return value


def why_unreachable(settings: BrokerSettings, timeout: float = 2.0) -> str:
    """One line on why a connection to the broker fails, for a log message.

    paho reports a failed connection attempt without its cause; a plain TCP connect to the
    same address says it (refused, unknown host, timeout). When TCP gets through, the
    trouble is above it (TLS, or the broker closing the connection).
    """
    try:
        with socket.create_connection((settings.host, settings.port), timeout=timeout):
            pass
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return "TCP connects, but the MQTT connection failed (TLS settings or the broker refusing)"


class Flapping:
    """Tells a connection the broker keeps closing right after it is made.

    An MQTT v5 broker that hands a session to another client with the same client id says
    so (DISCONNECT, reason 0x8E); Mosquitto 2.0.11 just closes the socket. Either way the
    symptom is a connection lost soon after it was made, again and again: ``lost()``
    returns True once that happened ``times`` times within ``window`` seconds.
    """

    def __init__(self, *, times: int = 3, short: float = 10.0, window: float = 60.0) -> None:
        self.times, self.short, self.window = times, short, window
        self._since: float | None = None
        self._drops: list[float] = []

    def connected(self, now: float) -> None:
        self._since = now

    def lost(self, now: float) -> bool:
        since, self._since = self._since, None
        if since is None or now - since > self.short:
            return False
        self._drops = [t for t in self._drops if now - t <= self.window] + [now]
        if len(self._drops) >= self.times:
            self._drops = []
            return True
        return False
