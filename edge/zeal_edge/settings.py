"""Agent settings from the command line, environment variables and a TOML config file.

Precedence: command line, then environment (``ZEAL_*``), then the config file (``--config`` or
``ZEAL_CONFIG``, keys as in the table below), then defaults. Every setting is listed once in
:data:`SETTINGS` with its type, default, variable and help text; ``--help`` shows them.
"""

from __future__ import annotations

import argparse
import math
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeal.mqtt.brokerurl import parse_protocol
from zeal.mqtt.topics import PREFIX
from zeal.policy import (
    DEFAULT_DEVICE_MAX_EPSILON_PER_DAY,
    DEFAULT_MAX_EPSILON_PER_DAY,
    check_device_cap,
)
from zeal.protocol import EPSILON_CEILING, check_name
from zeal.vocabulary import renamed, renamed_env, said
from zeal_edge.errors import SettingsError

__all__ = ["SETTINGS", "Setting", "SettingsError", "add_arguments", "resolve"]


@dataclass(frozen=True)
class Setting:
    name: str
    convert: Callable[[str], Any]
    default: Any
    env: str
    help: str
    secret: bool = False
    #: (name, variable) it had before docs/api.md's vocabulary: still read, with a warning
    old: tuple[str, str] | None = None
    #: A yes/no setting whose flag alone means yes (``--trust-first-use``)
    switch: bool = False
    #: Shorter flags for the same setting (``--ca`` for ``--ca-file``)
    aliases: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number >= 0")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number > 0")
    return value


def _streams(text: str) -> str:
    names = [check_name("stream", part.strip()) for part in text.split(",")]
    if len(set(names)) != len(names):
        raise ValueError("a stream is named twice")
    return ",".join(names)


def _shares(text: str) -> list[float]:
    values = [float(part) for part in text.split(",")]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError("shares must be finite numbers > 0")
    return values


def _cap_or_none(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    return check_device_cap(float(text), what="the device cap")


def _on_halt(text: str) -> str:
    value = text.strip().lower()
    if value not in ("exit", "wait"):
        raise ValueError("must be exit or wait")
    return value


def _yes_no(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off", ""):
        return False
    raise ValueError("must be yes or no")


def _server_key(text: str) -> str:
    from zeal_edge.trust import check_key  # cryptography is loaded only by those who need it

    return check_key(text)


def _fingerprint(text: str) -> str:
    value = text.strip().lower()
    if len(value) != 16 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError("must be 16 hex digits (a stream's fingerprint)")
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "stream",
        _streams,
        None,
        "ZEAL_STREAM",
        "stream name (a single MQTT topic level); several, comma-separated, run one device's "
        "sensors together, sharing its privacy cap across streams (docs/edge-agent.md)",
    ),
    Setting(
        "device",
        lambda s: check_name("device", s),
        None,
        "ZEAL_DEVICE",
        "this device's id (a single MQTT topic level)",
    ),
    Setting(
        "source",
        str,
        None,
        "ZEAL_SOURCE",
        "where readings come from: csv:PATH, stdin, or cmd:COMMAND",
    ),
    Setting(
        "column",
        str,
        "temp",
        "ZEAL_COLUMN",
        "CSV column holding the readings (several streams: one per stream, comma-separated; "
        "unless given so, each stream reads the column named like it)",
    ),
    Setting(
        "speedup",
        _non_negative,
        0.0,
        "ZEAL_SPEEDUP",
        "CSV replay speed-up over the recorded pace (0: as fast as possible)",
    ),
    Setting(
        "broker",
        str,
        "mqtt://127.0.0.1:1883",
        "ZEAL_MQTT_URL",
        "broker URL, mqtt://host:port or mqtts://host:port (TLS)",
    ),
    Setting(
        "protocol",
        parse_protocol,
        "5",
        "ZEAL_MQTT_PROTOCOL",
        "MQTT version, 5 or 3.1.1 (3.1.1 cannot report a publish the broker refused: "
        "docs/edge-agent.md)",
    ),
    Setting("username", str, None, "ZEAL_MQTT_USERNAME", "broker username"),
    Setting(
        "password",
        str,
        None,
        "ZEAL_MQTT_PASSWORD",
        "broker password (prefer the environment variable to the command line)",
        secret=True,
    ),
    Setting(
        "ca_file",
        str,
        None,
        "ZEAL_MQTT_CA",
        "CA certificate file the broker's certificate is checked with (mqtts://; default: "
        "the system's CAs)",
        aliases=("--ca",),
    ),
    Setting(
        "cert_file",
        str,
        None,
        "ZEAL_MQTT_CERT",
        "client certificate file (mqtts://): the device logs in with it, no password "
        "(zeal-server devices provision --certificate)",
        aliases=("--cert",),
    ),
    Setting(
        "key_file",
        str,
        None,
        "ZEAL_MQTT_KEY",
        "the client certificate's private key file",
        aliases=("--key",),
    ),
    Setting("batch", _positive_int, 60, "ZEAL_BATCH", "readings per batch"),
    Setting(
        "batch_seconds",
        _positive,
        60.0,
        "ZEAL_BATCH_SECONDS",
        "seconds a partial batch may wait before it is sent anyway",
        old=("interval", "ZEAL_INTERVAL"),
    ),
    Setting(
        "params",
        str,
        None,
        "ZEAL_PARAMS",
        f"local stream configuration JSON instead of the one retained on {PREFIX}/STREAM/config",
    ),
    Setting(
        "data_dir",
        str,
        "zeal-edge-data",
        "ZEAL_EDGE_DATA_DIR",
        "directory for the outbox database (encoded batches, never raw readings)",
        old=("data_dir", "ZEAL_DATA_DIR"),
    ),
    Setting(
        "budget_cap",
        _positive,
        None,
        "ZEAL_BUDGET_CAP",
        "privacy budget cap in epsilon per window (default: no cap)",
    ),
    Setting(
        "budget_window_seconds",
        _positive_int,
        86400,
        "ZEAL_BUDGET_WINDOW_SECONDS",
        "rolling window of the budget cap, in seconds",
        old=("budget_window", "ZEAL_BUDGET_WINDOW"),
    ),
    Setting(
        "window_mean_seconds",
        _positive_int,
        None,
        "ZEAL_WINDOW_MEAN_SECONDS",
        "report one privatized mean per window of this many seconds (UTC-aligned) instead "
        "of every reading: one reading's privacy loss per window (docs/privacy.md)",
        old=("window_mean", "ZEAL_WINDOW_MEAN"),
    ),
    Setting(
        "max_epsilon",
        _positive,
        EPSILON_CEILING,
        "ZEAL_MAX_EPSILON",
        "refuse a stream configuration whose epsilon per reading exceeds this",
    ),
    Setting(
        "max_epsilon_per_day",
        _positive,
        DEFAULT_MAX_EPSILON_PER_DAY,
        "ZEAL_MAX_EPSILON_PER_DAY",
        "refuse a stream configuration whose privacy policy (epsilon per device per UTC "
        "day) exceeds this",
    ),
    Setting(
        "device_max_epsilon_per_day",
        _cap_or_none,
        DEFAULT_DEVICE_MAX_EPSILON_PER_DAY,
        "ZEAL_DEVICE_MAX_EPSILON_PER_DAY",
        "the device's daily cap across all its streams, as its server holds it "
        "(zeal-server policy show DEVICE; none: no cap): the agent keeps within it, and "
        "within the device hour rule it sets",
    ),
    Setting(
        "device_max_epsilon_per_30_days",
        _cap_or_none,
        None,
        "ZEAL_DEVICE_MAX_EPSILON_PER_30_DAYS",
        "the device's cap over any 30 consecutive UTC days across its streams, as its server "
        "holds it (none: no such cap, the default)",
    ),
    Setting(
        "device_max_epsilon_per_365_days",
        _cap_or_none,
        None,
        "ZEAL_DEVICE_MAX_EPSILON_PER_365_DAYS",
        "the same over any 365 consecutive UTC days",
    ),
    Setting(
        "shares",
        _shares,
        None,
        "ZEAL_SHARES",
        "how the device cap is split between the streams, comma-separated numbers, one per "
        "stream (default: evenly)",
    ),
    Setting(
        "pin",
        _fingerprint,
        None,
        "ZEAL_PIN",
        "adopt only the configuration with this fingerprint (16 hex digits; "
        "zeal-server streams list shows it)",
    ),
    Setting(
        "server_key",
        _server_key,
        None,
        "ZEAL_SERVER_KEY",
        "the server's public key, handed over with the device's login (zeal-server devices "
        "provision prints it; zeal-server key shows it): its configurations and notices "
        "must be signed with it, or with a key it endorsed (a rotation)",
    ),
    Setting(
        "trust_first_use",
        _yes_no,
        False,
        "ZEAL_TRUST_FIRST_USE",
        "with no --server-key, trust the key of the first signed configuration seen on the "
        "broker (whoever retains one there first would be this agent's server: only on a "
        "broker no one else can write to)",
        switch=True,
    ),
    Setting(
        "on_halt",
        _on_halt,
        "exit",
        "ZEAL_ON_HALT",
        "when the server halts the stream (deleted, created anew, a policy above the "
        "ceiling): exit (status 3; zeal-edge resume clears it) or wait until the server "
        "releases it (zeal-server streams release; the systemd unit waits)",
    ),
    Setting("log_level", str.upper, "INFO", "ZEAL_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
)


def add_arguments(parser: argparse.ArgumentParser, names: set[str]) -> None:
    """Add --options for the named settings (defaults stay None so sources can be merged)."""
    parser.add_argument("--config", help="TOML file with settings (env ZEAL_CONFIG)")
    for s in SETTINGS:
        if s.name in names:
            default = "none" if s.default is None else s.default
            text = f"{s.help} [env {s.env}; default {default}]"
            if s.switch:  # the flag alone says yes
                parser.add_argument(
                    s.flag, dest=s.name, default=None, nargs="?", const="yes", help=text
                )
            else:
                parser.add_argument(s.flag, *s.aliases, dest=s.name, default=None, help=text)
            if s.old is not None and s.old[0] != s.name:
                renamed(parser, f"--{s.old[0].replace('_', '-')}", s.flag, s.name)


def _environment(s: Setting, env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    if s.old is None or s.env in env or s.old[1] not in env:
        return [(s.env, env.get(s.env))]
    return [(s.old[1], renamed_env(env, s.old[1], s.env, "zeal-edge"))]


def _old_key(
    s: Setting, file_values: Mapping[str, Any], config_path: str | None
) -> list[tuple[str, Any]]:
    if s.old is None or s.old[0] == s.name or s.old[0] not in file_values:
        return []
    print(f"zeal-edge: {config_path}: {said(s.old[0], s.name)}", file=sys.stderr)
    return [(f"{config_path}: {s.old[0]}", file_values[s.old[0]])]


def resolve(
    args: argparse.Namespace, env: Mapping[str, str], names: set[str], required: set[str]
) -> dict[str, Any]:
    """Merge the sources of each setting and convert it; raise SettingsError if invalid."""
    config_path = getattr(args, "config", None) or env.get("ZEAL_CONFIG")
    file_values: dict[str, Any] = {}
    if config_path:
        try:
            file_values = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"config file {config_path}: {exc}") from exc
        known = {s.name for s in SETTINGS} | {s.old[0] for s in SETTINGS if s.old is not None}
        unknown = set(file_values) - known
        if unknown:
            raise SettingsError(f"config file {config_path}: unknown settings {sorted(unknown)}")
    result: dict[str, Any] = {}
    for s in SETTINGS:
        if s.name not in names:
            continue
        for origin, raw in (
            (s.flag, getattr(args, s.name, None)),
            *_environment(s, env),
            (f"{config_path}: {s.name}", file_values.get(s.name)),
            *_old_key(s, file_values, config_path),
        ):
            if raw is not None:
                try:
                    result[s.name] = s.convert(str(raw))
                except ValueError as exc:
                    shown = "***" if s.secret else repr(raw)
                    raise SettingsError(f"{origin}={shown} is invalid: {exc}") from exc
                break
        else:
            if s.name in required:
                raise SettingsError(f"{s.flag} (or {s.env}) is required")
            result[s.name] = s.default
    return result
