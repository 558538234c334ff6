"""A production server refuses deploy/env.example's placeholders and short secrets, naming
the variable, before it touches anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zeal_server.settings import ServerSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def env_example() -> dict[str, str]:
    text = (ROOT / "deploy" / "env.example").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(.*)$", text, re.M))


def made(env: dict[str, str]) -> dict[str, str]:
    """env.example with every placeholder replaced, as deploy/README.md's first step does."""
    secrets = {
        p: f"{i:02d}" * 24
        for i, p in enumerate(sorted(set(re.findall(r"change-me[a-z-]*", "\n".join(env.values())))))
    }
    out = {}
    for key, value in env.items():
        for placeholder, secret in secrets.items():
            value = value.replace(placeholder, secret)
        out[key] = value
    return out


def test_the_made_settings_are_accepted() -> None:
    settings = ServerSettings.from_env(made(env_example()))
    assert settings.mode == "production"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("ZEAL_OPERATOR_TOKEN", "ZEAL_OPERATOR_TOKEN"),
        ("ZEAL_READ_TOKEN", "ZEAL_READ_TOKEN"),
        ("ZEAL_MQTT_PASSWORD", "ZEAL_MQTT_PASSWORD"),
        ("ZEAL_MQTT_ADMIN_PASSWORD", "ZEAL_MQTT_ADMIN_PASSWORD"),
        ("ZEAL_DATABASE_URL", "ZEAL_DATABASE_URL's password"),
    ],
)
def test_a_placeholder_left_is_refused_by_name(name: str, shown: str) -> None:
    """Before: ZEAL_MODE=production accepted the env.example's placeholder token."""
    example = env_example()
    env = {**made(example), name: example[name]}
    with pytest.raises(SettingsError, match=re.escape(f"{shown} is still the placeholder")):
        ServerSettings.from_env(env)


def test_a_short_secret_is_refused_by_name() -> None:
    env = {**made(env_example()), "ZEAL_MQTT_PASSWORD": "short"}
    with pytest.raises(SettingsError, match="ZEAL_MQTT_PASSWORD must be at least 16"):
        ServerSettings.from_env(env)
    development = {**env, "ZEAL_MODE": "development"}
    assert ServerSettings.from_env(development).broker is not None  # only production refuses
