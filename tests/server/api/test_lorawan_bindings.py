"""The LoRaWAN bindings through the API (no broker): made, replaced, listed, removed, and
every bad request refused with what was wrong; a stream's deletion takes its bindings; the
ChirpStack settings checked."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import create_stream
from zeal_server.settings import ServerSettings, SettingsError

APP = "5f0d8a8e-2c4b-4d6e-9a1b-0c2d3e4f5a6b"
BINDINGS = "/api/v1/lorawan/bindings"


def test_a_binding_is_made_replaced_listed_and_removed(client: TestClient) -> None:
    create_stream(client)
    create_stream(client, name="other")
    assert client.get(BINDINGS).json() == []
    made = client.put(f"{BINDINGS}/{APP}/10", json={"stream": "temps"})
    assert made.status_code == 200, made.text
    first = made.json()
    assert (first["application_id"], first["f_port"], first["stream"]) == (APP, 10, "temps")
    assert first["device_names"] == "dev_eui"
    replaced = client.put(
        f"{BINDINGS}/{APP}/10", json={"stream": "other", "device_names": "device_name"}
    ).json()
    assert (replaced["stream"], replaced["device_names"]) == ("other", "device_name")
    assert replaced["created"] == first["created"]  # the same binding, pointed elsewhere
    assert client.put(f"{BINDINGS}/{APP}/0", json={"stream": "temps"}).status_code == 200
    assert [(b["f_port"], b["stream"]) for b in client.get(BINDINGS).json()] == [
        (0, "temps"),
        (10, "other"),
    ]
    assert client.delete(f"{BINDINGS}/{APP}/10").status_code == 204
    missing = client.delete(f"{BINDINGS}/{APP}/10")
    assert missing.status_code == 404
    assert "no binding for application" in missing.json()["detail"]
    assert [b["f_port"] for b in client.get(BINDINGS).json()] == [0]


def test_bad_bindings_are_refused_with_what_was_wrong(client: TestClient) -> None:
    create_stream(client)
    cases = [
        (f"{APP}/10", {"stream": "nope"}, 404, "no stream named 'nope'"),
        (f"{APP}/224", {"stream": "temps"}, 422, "less than or equal to 223"),
        (f"{APP}/-1", {"stream": "temps"}, 422, "greater than or equal to 0"),
        (f"{APP}/10", {"stream": "temps", "device_names": "eui"}, 422, "dev_eui"),
        (f"{APP}/10", {"stream": "temps", "port": 3}, 422, "port"),
        ("not_a_uuid!/10", {"stream": "temps"}, 422, "application_id 'not_a_uuid!' is invalid"),
        (f"{'a' * 65}/10", {"stream": "temps"}, 422, "at most 64 characters"),
    ]
    for path, body, status, said in cases:
        answer = client.put(f"{BINDINGS}/{path}", json=body)
        assert answer.status_code == status, (path, body, answer.text)
        assert said in answer.text, (path, answer.text)
    assert client.get(BINDINGS).json() == []


def test_deleting_a_stream_deletes_its_bindings(client: TestClient) -> None:
    create_stream(client)
    create_stream(client, name="other")
    client.put(f"{BINDINGS}/{APP}/10", json={"stream": "temps"})
    client.put(f"{BINDINGS}/{APP}/11", json={"stream": "other"})
    assert client.delete("/api/v1/streams/temps", params={"confirm": "temps"}).status_code == 200
    assert [b["stream"] for b in client.get(BINDINGS).json()] == ["other"]


def test_the_chirpstack_settings_are_checked() -> None:
    base = {"ZEAL_MQTT_URL": "mqtt://127.0.0.1:1883"}
    settings = ServerSettings.from_env({**base, "ZEAL_CHIRPSTACK_URL": "mqtts://lns.example"})
    assert settings.chirpstack is not None
    assert (settings.chirpstack.host, settings.chirpstack.port, settings.chirpstack.tls) == (
        "lns.example",
        8883,
        True,
    )
    assert settings.chirpstack_topic == "application/+/device/+/event/up"
    assert ServerSettings.from_env(base).chirpstack is None
    for env, said in (
        ({"ZEAL_MQTT_URL": "off", "ZEAL_CHIRPSTACK_URL": "mqtt://lns"}, "needs ZEAL_MQTT_URL"),
        ({**base, "ZEAL_CHIRPSTACK_URL": "http://lns"}, "ZEAL_CHIRPSTACK_URL: broker URL"),
        ({**base, "ZEAL_CHIRPSTACK_TOPIC": "application/#/up"}, "not an MQTT topic filter"),
        ({**base, "ZEAL_CHIRPSTACK_TOPIC": "app+/x"}, "not an MQTT topic filter"),
    ):
        with pytest.raises(SettingsError, match=said):
            ServerSettings.from_env(env)
