"""Caps an agent learns from its server (zeal_server.broker.devicecaps, zeal_edge.devicecaps),
end to end: a real Mosquitto, the real server under its default settings, the real agent
never given a device cap (so it holds the default 8 as its ceiling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import publish_all, wait_until
from tests.server.ingest.homes import totals
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, agent_status
from zeal.mqtt.topics import DeviceCapsNotice, notice_topic
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal.signed import CAPS_PURPOSE
from zeal_server import store

pytestmark = pytest.mark.integration


def status(data: Path) -> dict[str, Any]:
    """`zeal-edge status --json` of the agent's one stream."""
    found: list[dict[str, Any]] = agent_status(data)  # type: ignore[assignment]
    return found[0] if found else {}


def told(data: Path) -> float | None:
    """The day cap the agent adopted from its server (None: none told yet)."""
    caps = status(data).get("device_caps_told") or {}
    return caps.get("max_epsilon_per_day")


def test_an_agent_adopts_a_lowered_cap_within_a_minute_and_sends_nothing_refused(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """The agent sends 3 readings of yesterday (3 hours apart) and
    is told its caps (the default 8) with its first batch; the operator lowers the device's
    cap to 4; the agent adopts 4 within a minute while it runs. A caps document of another
    device, and an older one of its own, both signed by the server, change nothing (each
    ignored and counted). Then 7 more readings of yesterday: it sends 1 (4 in the day) and
    skips 6, and the collector refuses nothing. Without the learned cap (its own ceiling
    of 8) it would have sent 5, and the collector refused 4 as device_cap."""
    data = tmp_path / "agent"
    day = day_of(int(time.time() * 1000)) - 1
    lines = [f"{day * DAY_MS + 2 * h * HOUR_MS},{40 + h}\n" for h in range(10)]
    log = tmp_path / "agent.log"
    with (
        log.open("w") as err,
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zeal_edge",
                "run",
                *("--stream", "humidity", "--device", "home", "--source", "stdin"),
                *("--broker", broker.url, "--data-dir", str(data)),
                *("--batch", "1", "--batch-seconds", "1"),
            ],
            stdin=subprocess.PIPE,
            stderr=err,
            text=True,
            env={k: v for k, v in os.environ.items() if "DEVICE_MAX" not in k},  # the default 8
        ) as agent,
    ):
        assert agent.stdin is not None
        agent.stdin.writelines(lines[:3])
        agent.stdin.flush()
        wait_until(lambda: totals(client, "home")[0] == 3, timeout=60, what="3 stored")
        wait_until(lambda: told(data) == 8.0, timeout=60, what="the default cap told")
        lowered = time.monotonic()
        answer = client.put("/api/v1/budgets/devices/home", json={"max_epsilon_per_day": 4})
        assert answer.status_code == 200, answer.text
        wait_until(lambda: told(data) == 4.0, timeout=60, what="the lowered cap adopted")
        adopted_s = time.monotonic() - lowered
        assert adopted_s < 60
        revision = status(data)["device_caps_told"]["revision"]

        with state(client).sessions() as session:
            signer, server = store.signer(session), store.installation_id(session)
        for device, rev, cap in (("other", revision + 1, 1.0), ("home", revision - 1, 2.0)):
            document = DeviceCapsNotice(server, device, rev, int(time.time() * 1000), {1: cap})
            signed = signer.sign(document.to_document(), CAPS_PURPOSE)
            publish_all(
                broker.port, [(notice_topic("humidity", "home"), json.dumps(signed).encode())]
            )
        wait_until(
            lambda: status(data)["ignored_signed"] == {"caps_not_ours": 1, "caps_stale": 1},
            timeout=60,
            what="both documents ignored",
        )
        assert told(data) == 4.0

        agent.stdin.writelines(lines[3:])
        agent.stdin.close()
        assert agent.wait(timeout=120) == 0, log.read_text()[-3000:]
    final = status(data)
    assert (final["sent_readings"], final["skipped_for_policy"]) == (4, 6)
    wait_until(lambda: totals(client, "home")[0] == 4, timeout=60, what="4 stored")
    assert totals(client, "home") == (4, {})
    print(f"adopted the lowered cap {adopted_s:.1f} s after the change")
