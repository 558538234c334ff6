"""Server settings from environment variables (``zeal-server --help`` lists them).

:data:`VARIABLES` names every variable the server reads with its default and meaning;
the command-line help and docs/server.md are written from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from zeal.mqtt.brokerurl import BrokerSettings, parse_broker_url, parse_protocol
from zeal.policy import DEFAULT_DEVICE_MAX_EPSILON_PER_DAY, ROLLING, check_device_cap
from zeal_server.errors import SettingsError

__all__ = [
    "CHIRPSTACK_TOPIC",
    "VARIABLES",
    "DeviceCASettings",
    "ServerSettings",
    "SettingsError",
    "variables_help",
]

#: ChirpStack v4's uplink event topic (its default event topic template,
#: ``application/{{application_id}}/device/{{dev_eui}}/event/{{event}}``).
CHIRPSTACK_TOPIC = "application/+/device/+/event/up"


@dataclass(frozen=True)
class Variable:
    """One environment variable: what it means, the value a server takes when it is unset
    (None: none), and how ``--help`` shows that default when it is not the value itself."""

    meaning: str
    value: Any = None
    shown: str | None = None

    @property
    def default(self) -> str:
        """The default as ``--help`` and docs/server.md say it."""
        if self.shown is not None:
            return self.shown
        return "none" if self.value is None else str(self.value)


def half_the_cpus() -> int:
    """ZEAL_HEAVY_READS' default: half the CPUs, at least 1."""
    return max(1, (os.cpu_count() or 2) // 2)


#: Every environment variable the server reads, with its default and meaning: the one place
#: a default is written (``ServerSettings``' fields and ``from_env`` take them from here;
#: the command-line help is written from it, and tests/server/test_cli.py holds
#: docs/server.md's table to it).
VARIABLES: dict[str, Variable] = {
    "ZEAL_MODE": Variable(
        "production refuses to start without ZEAL_OPERATOR_TOKEN",
        value="development",
    ),
    "ZEAL_DATA_DIR": Variable(
        "the default SQLite database and the collector's id",
        value="zeal-data",
    ),
    "ZEAL_DATABASE_URL": Variable(
        "SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db",
        shown="sqlite:///ZEAL_DATA_DIR/zeal.sqlite",
    ),
    "ZEAL_MQTT_URL": Variable(
        "broker (mqtts:// for TLS); off runs the API without a collector",
        value="mqtt://127.0.0.1:1883",
    ),
    "ZEAL_MQTT_PROTOCOL": Variable(
        "MQTT version: 5 or 3.1.1 (for brokers that speak nothing newer)",
        value="5",
    ),
    "ZEAL_MQTT_KEEPALIVE": Variable(
        "seconds between keepalive pings to the broker (5 to 3600)",
        value=30,
    ),
    "ZEAL_MQTT_USERNAME": Variable(
        "broker username",
    ),
    "ZEAL_MQTT_PASSWORD": Variable(
        "broker password",
    ),
    "ZEAL_MQTT_ADMIN_USERNAME": Variable(
        "broker login of the dynamic security admin, for zeal-server devices provision/revoke",
    ),
    "ZEAL_MQTT_ADMIN_PASSWORD": Variable(
        "its password",
    ),
    "ZEAL_MQTT_ADMIN_URL": Variable(
        "where the admin logs in, with its password and no client certificate (needed when "
        "ZEAL_MQTT_URL is a listener that takes certificates only; deploy: mqtts://"
        "mosquitto:8883)",
        shown="ZEAL_MQTT_URL",
    ),
    "ZEAL_MQTT_CA": Variable(
        "CA certificate file for mqtts://",
    ),
    "ZEAL_MQTT_CERT": Variable(
        "client certificate file for mqtts://",
    ),
    "ZEAL_MQTT_KEY": Variable(
        "client key file for mqtts://",
    ),
    "ZEAL_DEVICE_CA": Variable(
        "certificate of the CA that signs device certificates (zeal-server devices provision "
        "--certificate); the broker trusts it for client certificates",
    ),
    "ZEAL_DEVICE_CA_KEY": Variable(
        "that CA's private key",
    ),
    "ZEAL_DEVICE_CRL": Variable(
        "the revocation list of device certificates: written here at every revocation, read "
        "by the broker (its crlfile, reloaded on change); needed with ZEAL_DEVICE_CA",
    ),
    "ZEAL_DEVICE_CERT_DAYS": Variable(
        "how long a device certificate is valid (1 to 36500)",
        value=3650,
    ),
    "ZEAL_COLLECTOR_INFLIGHT": Variable(
        "messages received but not yet committed, at most (the MQTT v5 Receive Maximum; "
        "the broker holds the rest)",
        value=20_000,
    ),
    "ZEAL_NATS_URL": Variable(
        "NATS servers, comma-separated nats://host:port: the collector pulls data from "
        "JetStream instead of subscribing over MQTT (deploy/SCALING.md)",
    ),
    "ZEAL_NATS_CONSUMER": Variable(
        "the durable consumer all collectors share, on NATS's MQTT message stream",
        value="zeal-collectors",
    ),
    "ZEAL_NATS_ACK_WAIT": Variable(
        "seconds before JetStream redelivers a message no collector acknowledged (5 to 3600)",
        value=60,
    ),
    "ZEAL_CHIRPSTACK_URL": Variable(
        "the broker ChirpStack's MQTT integration publishes to (mqtt:// or mqtts://): the "
        "collector stores LoRaWAN uplinks from there too (docs/lorawan.md)",
    ),
    "ZEAL_CHIRPSTACK_USERNAME": Variable(
        "the collector's login on that broker",
    ),
    "ZEAL_CHIRPSTACK_PASSWORD": Variable(
        "its password",
    ),
    "ZEAL_CHIRPSTACK_CA": Variable(
        "CA certificate file for an mqtts:// ZEAL_CHIRPSTACK_URL",
    ),
    "ZEAL_CHIRPSTACK_TOPIC": Variable(
        "the uplink events' topic filter (ChirpStack's default event topic)",
        value=CHIRPSTACK_TOPIC,
    ),
    "ZEAL_SHARE_GROUP": Variable(
        "shared-subscription group, for several collectors",
    ),
    "ZEAL_MQTT_LOGIN_PROPERTY": Variable(
        "the MQTT v5 user property in which the broker names the login that published each "
        "data message (zeal-login with deploy/mosquitto's zeal_retain plugin, which the "
        "Compose stack sets): a device's cap is then spent only by its own login",
    ),
    "ZEAL_COLLECTOR_ID": Variable(
        "MQTT client id of the collector's persistent session; by default unique per "
        "server process and kept across its restarts",
        shown="claimed in ZEAL_DATA_DIR",
    ),
    "ZEAL_TLS_CERT": Variable(
        "certificate file (the full chain, PEM) the API and dashboard serve HTTPS with; "
        "none: plain HTTP (a local server, or behind a TLS proxy)",
    ),
    "ZEAL_TLS_KEY": Variable(
        "its private key file",
    ),
    "ZEAL_OPERATOR_TOKEN": Variable(
        "bearer token for writes (at least 16 characters)",
    ),
    "ZEAL_READ_TOKEN": Variable(
        "bearer token for reads (reads are open without it)",
    ),
    "ZEAL_MAX_FUTURE_SECONDS": Variable(
        "reject readings stamped later than arrival + this",
        value=600,
    ),
    "ZEAL_MAX_AGE_SECONDS": Variable(
        "reject readings stamped earlier than arrival - this (raise it to import history)",
        value=7 * 86_400,
    ),
    "ZEAL_BACKFILL_SECONDS": Variable(
        "reject readings stamped before stream creation - this",
        value=300,
    ),
    "ZEAL_MAX_BUCKETS_PER_BATCH": Variable(
        "reject a batch spanning more time buckets",
        value=1440,
    ),
    "ZEAL_DEVICE_MAX_EPSILON_PER_DAY": Variable(
        "privacy loss one device may spend per UTC day over all its streams with a policy, "
        "unless a device or tag cap is set (none: no device cap; docs/privacy.md)",
        value=DEFAULT_DEVICE_MAX_EPSILON_PER_DAY,
        shown="8",
    ),
    "ZEAL_DEVICE_MAX_EPSILON_PER_30_DAYS": Variable(
        "privacy loss one device may spend over any 30 consecutive UTC days, unless a device "
        "or tag cap over 30 days is set (none: no such cap)",
    ),
    "ZEAL_DEVICE_MAX_EPSILON_PER_365_DAYS": Variable(
        "the same over any 365 consecutive UTC days",
    ),
    "ZEAL_HEAVY_READS": Variable(
        "costly reads (of a stream's data: averages, series, exports, devices, ...) at once; "
        "more wait up to 2 s, then get 429",
        shown="half the CPUs, at least 1",
    ),
    "ZEAL_HTTP_CONNECTIONS_PER_PEER": Variable(
        "HTTP connections at once from one address (0: no limit, behind a proxy)",
        value=64,
    ),
}


def default_of(name: str) -> Any:
    """The value a server takes when variable `name` is unset (``VARIABLES``)."""
    return VARIABLES[name].value


def variables_help(names: tuple[str, ...] | None = None) -> str:
    """The environment variables as lines for ``--help`` (all, or the named ones)."""
    lines = ["environment variables:"]
    for name, variable in VARIABLES.items():
        if names is None or name in names:
            lines.append(f"  {name:<24} {variable.meaning} [default: {variable.default}]")
    return "\n".join(lines)


@dataclass(frozen=True)
class DeviceCASettings:
    """The files of the CA that signs device certificates (zeal_server.broker.certificates)."""

    cert: Path
    key: Path
    crl: Path
    days: int = 3650


@dataclass(frozen=True)
class ServerSettings:
    database_url: str
    broker: BrokerSettings | None
    share_group: str = ""
    #: Where the broker names a data message's publisher (ZEAL_MQTT_LOGIN_PROPERTY).
    mqtt_login_property: str | None = None
    #: None: claim one in data_dir (zeal_server.broker.identity).
    collector_id: str | None = None
    data_dir: Path = Path(default_of("ZEAL_DATA_DIR"))
    operator_token: str | None = None
    read_token: str | None = None
    mode: str = default_of("ZEAL_MODE")
    max_future_seconds: int = default_of("ZEAL_MAX_FUTURE_SECONDS")
    max_age_seconds: int = default_of("ZEAL_MAX_AGE_SECONDS")
    backfill_seconds: int = default_of("ZEAL_BACKFILL_SECONDS")
    max_buckets_per_batch: int = default_of("ZEAL_MAX_BUCKETS_PER_BATCH")
    #: A device's default daily cap across streams (ZEAL_DEVICE_MAX_EPSILON_PER_DAY).
    device_max_epsilon_per_day: float | None = default_of("ZEAL_DEVICE_MAX_EPSILON_PER_DAY")
    #: A device's default caps over any 30 and any 365 UTC days (horizon -> epsilon;
    #: ZEAL_DEVICE_MAX_EPSILON_PER_30_DAYS, _365_DAYS; none by default).
    device_rolling_caps: dict[int, float | None] = field(default_factory=dict)
    #: Messages received and not yet committed, at most (ZEAL_COLLECTOR_INFLIGHT).
    collector_inflight: int = default_of("ZEAL_COLLECTOR_INFLIGHT")
    #: NATS servers to pull data from (JetStream); empty: data arrive over MQTT.
    nats_servers: tuple[str, ...] = ()
    nats_consumer: str = default_of("ZEAL_NATS_CONSUMER")
    nats_ack_wait: int = default_of("ZEAL_NATS_ACK_WAIT")
    #: The broker's dynamic security admin login (device provisioning); None: off.
    admin_username: str | None = None
    admin_password: str | None = None
    #: Where the admin logs in (ZEAL_MQTT_ADMIN_URL; None: the broker's listener).
    admin_broker: BrokerSettings | None = None
    #: The API's certificate and key (ZEAL_TLS_CERT, ZEAL_TLS_KEY); None: plain HTTP.
    https: tuple[Path, Path] | None = None
    #: The CA of device certificates (ZEAL_DEVICE_CA*); None: passwords only.
    device_ca: DeviceCASettings | None = None
    #: The broker ChirpStack publishes uplink events to; None: no LoRaWAN source.
    chirpstack: BrokerSettings | None = None
    chirpstack_topic: str = default_of("ZEAL_CHIRPSTACK_TOPIC")
    #: HTTP connections at once from one address; 0: no limit (zeal_server.api.guard).
    http_per_peer: int = default_of("ZEAL_HTTP_CONNECTIONS_PER_PEER")
    #: Heavy reads at once (zeal_server.api.costs).
    heavy_reads: int = field(default_factory=half_the_cpus)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerSettings:
        mode = env.get("ZEAL_MODE") or default_of("ZEAL_MODE")
        if mode not in ("development", "production"):
            raise SettingsError(f"ZEAL_MODE must be development or production, got {mode!r}")
        data_dir = Path(env.get("ZEAL_DATA_DIR") or default_of("ZEAL_DATA_DIR"))
        url = env.get("ZEAL_DATABASE_URL") or f"sqlite:///{data_dir / 'zeal.sqlite'}"
        broker_url = env.get("ZEAL_MQTT_URL", default_of("ZEAL_MQTT_URL"))
        try:
            broker = (
                None
                if broker_url == "off"
                else parse_broker_url(
                    broker_url,
                    username=env.get("ZEAL_MQTT_USERNAME"),
                    password=env.get("ZEAL_MQTT_PASSWORD"),
                    ca_file=env.get("ZEAL_MQTT_CA"),
                    cert_file=env.get("ZEAL_MQTT_CERT"),
                    key_file=env.get("ZEAL_MQTT_KEY"),
                    keepalive=_whole(env, "ZEAL_MQTT_KEEPALIVE", (5, 3600), "seconds"),
                    protocol=_protocol(env.get("ZEAL_MQTT_PROTOCOL")),
                )
            )
        except ValueError as exc:
            if isinstance(exc, SettingsError):
                raise
            raise SettingsError(f"ZEAL_MQTT_URL: {exc}") from exc
        operator = env.get("ZEAL_OPERATOR_TOKEN") or None
        if mode == "production" and operator is None:
            raise SettingsError("production mode needs ZEAL_OPERATOR_TOKEN (writes need a token)")
        for name, token in (
            ("ZEAL_OPERATOR_TOKEN", operator),
            ("ZEAL_READ_TOKEN", env.get("ZEAL_READ_TOKEN")),
        ):
            if token is not None and len(token) < MIN_SECRET:
                raise SettingsError(f"{name} must be at least {MIN_SECRET} characters")
        if mode == "production":
            _no_placeholder_secrets(env)
        limits = {
            name: _seconds(env, name)
            for name in ("ZEAL_MAX_FUTURE_SECONDS", "ZEAL_MAX_AGE_SECONDS", "ZEAL_BACKFILL_SECONDS")
        }
        buckets = _whole(env, "ZEAL_MAX_BUCKETS_PER_BATCH", (1, 65_535), "buckets")
        inflight = _whole(env, "ZEAL_COLLECTOR_INFLIGHT", (10, 65_535), "messages")
        per_peer = _whole(env, "ZEAL_HTTP_CONNECTIONS_PER_PEER", (0, 65_535), "connections")
        heavy = _whole(env, "ZEAL_HEAVY_READS", (1, 1024), "reads", default=half_the_cpus())
        nats = _nats(env)
        if nats["nats_servers"] and broker is None:
            raise SettingsError(
                "ZEAL_NATS_URL needs ZEAL_MQTT_URL too: the stream configurations reach the "
                "devices over MQTT (a NATS node's MQTT listener)"
            )
        chirpstack = _chirpstack(env, broker)
        return cls(
            admin_broker=_admin_broker(env, broker),
            https=_https(env),
            device_ca=_device_ca(env),
            chirpstack=chirpstack,
            chirpstack_topic=_topic_filter(
                env.get("ZEAL_CHIRPSTACK_TOPIC") or default_of("ZEAL_CHIRPSTACK_TOPIC")
            ),
            max_future_seconds=limits["ZEAL_MAX_FUTURE_SECONDS"],
            max_age_seconds=limits["ZEAL_MAX_AGE_SECONDS"],
            backfill_seconds=limits["ZEAL_BACKFILL_SECONDS"],
            max_buckets_per_batch=buckets,
            device_max_epsilon_per_day=_device_cap(env.get("ZEAL_DEVICE_MAX_EPSILON_PER_DAY")),
            device_rolling_caps={
                days: _device_cap(env.get(f"ZEAL_DEVICE_MAX_EPSILON_PER_{days}_DAYS"), days)
                for days in ROLLING
            },
            collector_inflight=inflight,
            http_per_peer=per_peer,
            heavy_reads=heavy,
            **nats,
            database_url=url,
            broker=broker,
            share_group=_share_group(env.get("ZEAL_SHARE_GROUP", "")),
            mqtt_login_property=_login_property(env.get("ZEAL_MQTT_LOGIN_PROPERTY", "")),
            collector_id=_collector_id(env.get("ZEAL_COLLECTOR_ID") or None),
            data_dir=data_dir,
            operator_token=operator,
            read_token=env.get("ZEAL_READ_TOKEN") or None,
            mode=mode,
            admin_username=env.get("ZEAL_MQTT_ADMIN_USERNAME") or None,
            admin_password=env.get("ZEAL_MQTT_ADMIN_PASSWORD") or None,
        )


def _admin_broker(env: Mapping[str, str], broker: BrokerSettings | None) -> BrokerSettings | None:
    """ZEAL_MQTT_ADMIN_URL: the admin's listener, with the broker's CA and no client
    certificate (on a listener that takes the certificate's name as the login, the admin
    would log in as the collector)."""
    url = env.get("ZEAL_MQTT_ADMIN_URL") or ""
    if not url or broker is None:
        return None
    try:
        return parse_broker_url(
            url, ca_file=broker.ca_file, keepalive=broker.keepalive, protocol=broker.protocol
        )
    except ValueError as exc:
        raise SettingsError(f"ZEAL_MQTT_ADMIN_URL: {exc}") from exc


def _https(env: Mapping[str, str]) -> tuple[Path, Path] | None:
    """ZEAL_TLS_CERT and ZEAL_TLS_KEY: both or neither (`serve` reads them)."""
    cert, key = env.get("ZEAL_TLS_CERT") or "", env.get("ZEAL_TLS_KEY") or ""
    if not cert and not key:
        return None
    if not cert or not key:
        raise SettingsError("ZEAL_TLS_CERT and ZEAL_TLS_KEY go together (HTTPS needs both)")
    return Path(cert), Path(key)


def _device_ca(env: Mapping[str, str]) -> DeviceCASettings | None:
    """ZEAL_DEVICE_CA, its key and the revocation list: all three or none."""
    names = ("ZEAL_DEVICE_CA", "ZEAL_DEVICE_CA_KEY", "ZEAL_DEVICE_CRL")
    given = {name: env.get(name) or "" for name in names}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise SettingsError(
            f"device certificates need {', '.join(names)} together; missing: {', '.join(missing)}"
        )
    days = _whole(env, "ZEAL_DEVICE_CERT_DAYS", (1, 36_500), "days")
    return DeviceCASettings(
        cert=Path(given["ZEAL_DEVICE_CA"]),
        key=Path(given["ZEAL_DEVICE_CA_KEY"]),
        crl=Path(given["ZEAL_DEVICE_CRL"]),
        days=days,
    )


def _device_cap(text: str | None, days: int = 1) -> float | None:
    """A device cap setting over `days` (1: ZEAL_DEVICE_MAX_EPSILON_PER_DAY, default 8;
    30 and 365: ..._PER_{days}_DAYS, default none)."""
    name = "ZEAL_DEVICE_MAX_EPSILON_PER_" + ("DAY" if days == 1 else f"{days}_DAYS")
    if text is None or not text.strip():
        unset: float | None = default_of(name)
        return unset
    if text.strip().lower() == "none":
        return None
    try:
        return check_device_cap(float(text), what=name)
    except ValueError as exc:
        raise SettingsError(f"{name} must be a number in (0, 1e8] or none, got {text!r}") from exc


def _chirpstack(env: Mapping[str, str], broker: BrokerSettings | None) -> BrokerSettings | None:
    url = env.get("ZEAL_CHIRPSTACK_URL") or "none"
    if url == "none":
        return None
    if broker is None:
        raise SettingsError(
            "ZEAL_CHIRPSTACK_URL needs ZEAL_MQTT_URL too: the collector runs with Zeal's "
            "broker (it may be the same broker)"
        )
    try:
        return parse_broker_url(
            url,
            username=env.get("ZEAL_CHIRPSTACK_USERNAME") or None,
            password=env.get("ZEAL_CHIRPSTACK_PASSWORD") or None,
            ca_file=env.get("ZEAL_CHIRPSTACK_CA") or None,
            keepalive=broker.keepalive,
        )
    except ValueError as exc:
        raise SettingsError(f"ZEAL_CHIRPSTACK_URL: {exc}") from exc


def _topic_filter(text: str) -> str:
    """An MQTT topic filter: '+' a whole level, '#' only the whole last one."""
    levels = text.split("/")
    last = len(levels) - 1
    bad = [
        level
        for k, level in enumerate(levels)
        if ("+" in level and level != "+") or ("#" in level and (level != "#" or k < last))
    ]
    if not text or bad or "\x00" in text or text.startswith("$"):
        raise SettingsError(f"ZEAL_CHIRPSTACK_TOPIC: {text!r} is not an MQTT topic filter")
    return text


def _seconds(env: Mapping[str, str], name: str) -> int:
    return _whole(env, name, (0, 100 * 365 * 86_400), "seconds (at most 100 years)")


#: The least length of a token or password a production server accepts.
MIN_SECRET = 16
#: What every secret of deploy/env.example starts with until the operator makes it.
PLACEHOLDER = "change-me"
#: The secrets a production server refuses as placeholders or too short (when set).
SECRETS = (
    "ZEAL_OPERATOR_TOKEN",
    "ZEAL_READ_TOKEN",
    "ZEAL_MQTT_PASSWORD",
    "ZEAL_MQTT_ADMIN_PASSWORD",
)


def _no_placeholder_secrets(env: Mapping[str, str]) -> None:
    """Production mode: no secret is still deploy/env.example's placeholder, or shorter
    than MIN_SECRET; the database URL's password included."""
    given = {name: env.get(name) or "" for name in SECRETS}
    url = env.get("ZEAL_DATABASE_URL") or ""
    given["ZEAL_DATABASE_URL's password"] = urlsplit(url).password or "" if "://" in url else ""
    for name, secret in given.items():
        if not secret:
            continue
        if PLACEHOLDER in secret:
            raise SettingsError(
                f"{name} is still the placeholder of deploy/env.example: make every secret "
                "(deploy/README.md, step 1)"
            )
        if len(secret) < MIN_SECRET:
            raise SettingsError(f"{name} must be at least {MIN_SECRET} characters")


def _whole(
    env: Mapping[str, str],
    name: str,
    bounds: tuple[int, int],
    what: str,
    *,
    default: int | None = None,
) -> int:
    """A whole number within `bounds`; unset, `default` or the table's (``VARIABLES``)."""
    lo, hi = bounds
    text = env.get(name)
    if text is None or text == "":
        return default if default is not None else int(default_of(name))
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number of {what}, got {text!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be {lo} to {hi} {what}, got {value}")
    return value


def _nats(env: Mapping[str, str]) -> dict[str, Any]:
    """The ZEAL_NATS_* settings, checked."""
    servers = tuple(u.strip() for u in (env.get("ZEAL_NATS_URL") or "").split(",") if u.strip())
    for url in servers:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise SettingsError(f"ZEAL_NATS_URL: {url!r} must look like nats://host:port")
    consumer = env.get("ZEAL_NATS_CONSUMER") or default_of("ZEAL_NATS_CONSUMER")
    if not (len(consumer) <= 64 and all(c.isalnum() or c in "-_" for c in consumer)):
        raise SettingsError(
            f"ZEAL_NATS_CONSUMER must be 1-64 letters, digits, '-' or '_', got {consumer!r}"
        )
    return {
        "nats_servers": servers,
        "nats_consumer": consumer,
        "nats_ack_wait": _whole(env, "ZEAL_NATS_ACK_WAIT", (5, 3600), "seconds"),
    }


def _protocol(text: str | None) -> str:
    try:
        return parse_protocol(text)
    except ValueError as exc:
        raise SettingsError(f"ZEAL_MQTT_PROTOCOL: {exc}") from exc


def _collector_id(text: str | None) -> str | None:
    if text is not None and not (len(text) <= 128 and all(c.isalnum() or c in "-_." for c in text)):
        raise SettingsError(
            f"ZEAL_COLLECTOR_ID must be at most 128 letters, digits, '-', '_' or '.', got {text!r}"
        )
    return text


def _login_property(text: str) -> str | None:
    value = text.strip()
    if value.lower() in ("", "none"):
        return None
    if len(value) > 64 or not all(c.isalnum() or c in "-_." for c in value):
        raise SettingsError(
            "ZEAL_MQTT_LOGIN_PROPERTY must be a property name of letters, digits, '-', '_' or "
            f"'.' (zeal-login for deploy/mosquitto's plugin), or none; got {text!r}"
        )
    return value


def _share_group(text: str) -> str:
    if text and not all(c.isalnum() or c in "-_." for c in text):
        raise SettingsError(
            f"ZEAL_SHARE_GROUP must be letters, digits, '-', '_' or '.', got {text!r}"
        )
    return text
