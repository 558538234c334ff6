"""The stream's privacy policy end to end: a real Mosquitto, the real server and the real
agent. A device reading once a second for one simulated day never spends more than the
policy allows, at the agent (it skips, and says so in `zeal-edge status`) and at the
collector (a modified agent that ignores its ledger is refused as over_budget); a policy
change gives the stream a new fingerprint, and devices are refused until they take it."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import (
    NO_DEVICE_CAP,
    agent_command,
    publish_all,
    save_config,
    simulate,
    stats,
    wait_until,
)
from tools.testbed.appstate import state
from tools.testbed.broker import Mosquitto, agent_status
from zeal import Zeal, encode_batch
from zeal.mqtt.streamconfig import params_from_config
from zeal.policy import DAY_MS, HOUR_MS, day_of
from zeal_server.app import create_app
from zeal_server.settings import ServerSettings

pytestmark = pytest.mark.integration

#: The simulated day: yesterday (UTC) when the test runs, so that every reading is in the
#: past; set by `yesterday` before each test, never when the module is imported (a module
#: imported before midnight and run after it would send readings of two days ago).
DAY = 0
START = 0
SECONDS = 86_400


@pytest.fixture(autouse=True)
def yesterday() -> None:
    global DAY, START  # the simulated day of this test, read by the helpers
    DAY = day_of(int(time.time() * 1000)) - 1
    START = DAY * DAY_MS


def day_of_readings(seconds: int = SECONDS) -> str:
    """One simulated day at one reading a second (or its first `seconds`): `TIMESTAMP_MS,VALUE`
    lines for the agent."""
    return "".join(f"{START + 1000 * i},{40 + i % 30}\n" for i in range(seconds))


@pytest.fixture
def client(database_url: str, broker: Mosquitto) -> Iterator[TestClient]:
    """The real server on the broker; readings of yesterday are accepted (backfill 3 days:
    yesterday's first reading is still inside it when the test runs past midnight)."""
    settings = ServerSettings.from_env(
        {
            "ZEAL_DATABASE_URL": database_url,
            "ZEAL_MQTT_URL": broker.url,
            "ZEAL_BACKFILL_SECONDS": str(3 * 86_400),
            # the stream's policy is what these tests raise and hold; the device cap across
            # streams has its own (test_device_cap*.py)
            **NO_DEVICE_CAP,
        }
    )
    with TestClient(create_app(settings)) as c:
        wait_until(lambda: state(c).collector.broker_connected, what="collector")
        yield c


def run_agent(
    data_dir: Path, broker: Mosquitto, params: Path, seconds: int = SECONDS
) -> dict[str, Any]:
    result = subprocess.run(
        agent_command(data_dir, broker, params, "--batch", "60", "--batch-seconds", "1"),
        input=day_of_readings(seconds),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stream policy reached" in result.stderr
    (status,) = agent_status(data_dir)
    return status


def device(client: TestClient, name: str) -> dict[str, Any]:
    devices = client.get("/api/v1/streams/temps/devices").json()["devices"]
    return next(d for d in devices if d["name"] == name)


def modified_agent_batches(params: Zeal, name: str) -> list[tuple[str, bytes]]:
    """A device that ignores its ledger: ten readings at the start of every hour of the
    day, one per batch, then the whole day again in batches of 60."""
    stamps = [START + HOUR_MS * h + 1000 * i for h in range(24) for i in range(10)]
    stamps += [START + 1000 * i for i in range(SECONDS)]
    cuts = [*range(240), *range(240, len(stamps), 60), len(stamps)]
    codes = params.perturb([50.0] * len(stamps))
    return [
        (
            f"zeal/v1/temps/{name}/up",
            encode_batch(
                params,
                stream="temps",
                device=name,
                sequence=k,
                timestamps=stamps[a:b],
                codes=codes[a:b],
            ),
        )
        for k, (a, b) in enumerate(itertools.pairwise(cuts))
    ]


def test_the_default_policy_holds_a_day_of_readings_at_the_agent_and_the_collector(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    created = client.post(
        "/api/v1/streams", json={"name": "temps", "lower": 0, "upper": 110, "epsilon": 1}
    ).json()
    assert (created["max_epsilon_per_day"], created["readings_per_day"]) == (8.0, 8)
    params_file = save_config(client, tmp_path / "params.json")
    params = params_from_config(params_file.read_text())

    # The real agent: 86,400 readings of one day; 8 leave the device (the first of each of
    # the day's first 8 hours: the hour's cap is 1), the rest are skipped.
    began = time.monotonic()
    status = run_agent(tmp_path / "agent", broker, params_file)
    print(f"agent: one simulated day in {time.monotonic() - began:.1f} s: {status}")
    day = dt.datetime.fromtimestamp(DAY * 86_400, dt.UTC).strftime("%Y-%m-%d")
    assert status["sent_readings"] == 8
    assert status["skipped_for_policy"] == SECONDS - 8
    assert status["policy_spent_by_day"] == {day: 8.0}
    assert status["policy_epsilon_per_day"] == 8.0
    wait_until(lambda: stats(client)["readings"] == 8, what="the agent's 8 readings")
    hours = client.get(
        "/api/v1/streams/temps/series", params={"interval": 3600, "start": "2000-01-01T00:00:00Z"}
    ).json()["points"]
    assert [p["n"] for p in hours] == [1] * 8  # the hour's cap is 1
    assert hours[0]["start"].startswith(day)

    # A modified agent ignoring its ledger: the collector stores 8 readings of it (the
    # first of each of its first 8 hours) and refuses every other batch whole as
    # over_budget (after 100 rejects in a burst, the door sheds the device's messages
    # undecoded as rate_limited: nothing stored either).
    messages = modified_agent_batches(params, "rogue")
    publish_all(broker.port, messages)
    refused = len(messages) - 8

    def counted() -> int:
        rejects = stats(client)["rejects"]
        return int(rejects.get("over_budget", 0) + rejects.get("rate_limited", 0))

    wait_until(lambda: counted() == refused, timeout=60, what=f"{refused} rejects")
    assert stats(client)["rejects"]["over_budget"] >= 100
    assert stats(client)["readings"] == 16
    for name in ("dev1", "rogue"):
        assert device(client, name)["readings"] == 8
        assert device(client, name)["epsilon_spent"] == 8.0
    print(f"collector: {refused} of {len(messages)} batches refused: {stats(client)['rejects']}")


def test_a_policy_change_gives_a_new_fingerprint_and_old_devices_are_refused(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    client.post("/api/v1/streams", json={"name": "temps", "lower": 0, "upper": 110, "epsilon": 1})
    old_file = save_config(client, tmp_path / "old.json")
    old = params_from_config(old_file.read_text())
    status = run_agent(tmp_path / "agent", broker, old_file)
    assert status["sent_readings"] == 8  # one in each of the day's first 8 hours

    patched = client.patch("/api/v1/streams/temps", json={"max_epsilon_per_day": 24})
    assert patched.status_code == 200, patched.text
    assert patched.json()["readings_per_day"] == 24
    assert patched.json()["fingerprint"] != old.fingerprint.hex()
    new_file = save_config(client, tmp_path / "new.json")
    assert json.loads(new_file.read_text())["max_epsilon_per_day"] == 24.0
    assert client.patch("/api/v1/streams/temps", json={"max_epsilon_per_day": 0.5}).status_code == (
        422
    )

    # A device still on the old configuration is refused with the reason.
    stale = encode_batch(
        old, stream="temps", device="old", sequence=0, timestamps=[START], codes=old.perturb([50.0])
    )
    publish_all(broker.port, [("zeal/v1/temps/old/up", stale)])
    wait_until(
        lambda: stats(client)["rejects"].get("fingerprint_mismatch", 0) == 1,
        what="the stale device's batch refused",
    )
    # The agent with the new configuration spends the rest of the raised policy on that day
    # (its hours may now hold 2: a second reading in each of the first 8, then 2 in each
    # of the next 4).
    status = run_agent(tmp_path / "agent", broker, new_file)
    assert status["sent_readings"] == 24
    assert status["policy_spent_by_day"] == {
        dt.datetime.fromtimestamp(DAY * 86_400, dt.UTC).strftime("%Y-%m-%d"): 24.0
    }
    wait_until(lambda: stats(client)["readings"] == 24, what="24 readings of the day")
    assert device(client, "dev1")["epsilon_spent"] == 24.0


def test_the_simulator_keeps_the_policy_too(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """`zeal-edge simulate` (3 devices, batches of 2, 32 readings each, as fast as it can) on
    a stream allowing 24 readings a day and so 2 an hour: each device privatizes and sends
    one round of 2 in the hour, and skips the rest."""
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 24}
    client.post("/api/v1/streams", json=body)
    result = simulate(
        broker, tmp_path, "--devices", "3", "--rate", "0", "--readings", "32", "--batch", "2"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # Stamped now: the run can straddle an hour, and then each device sends a round more.
    sent = 6 if "skipped 90 readings" in result.stdout else 12
    assert f"skipped {96 - sent} readings at the stream's privacy policy" in result.stdout, (
        result.stdout
    )
    wait_until(lambda: stats(client)["readings"] == sent, what="one round of 2 per device")
    # The simulator has exited, every batch acknowledged: a sentinel batch of another
    # device published now is stored after anything more it could have sent.
    params = params_from_config(save_config(client, tmp_path / "params.json").read_text())
    sentinel = encode_batch(
        params,
        stream="temps",
        device="sentinel",
        sequence=0,
        timestamps=[int(time.time() * 1000)],
        codes=params.perturb([50.0]),
    )
    publish_all(broker.port, [("zeal/v1/temps/sentinel/up", sentinel)])
    wait_until(lambda: stats(client)["devices"] == 4, what="the sentinel's batch")
    assert stats(client)["readings"] == sent + 1
    assert stats(client)["rejects"] == {}


def test_an_agent_in_window_mean_mode_spends_one_reading_per_window(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """The real agent with --window-mean-seconds 3600, one reading a minute over a simulated day:
    24 means leave the device (1/60 of the readings, 24 epsilon against 1,440), each
    stamped at its hour, and fit a policy of 24 a day exactly."""
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "max_epsilon_per_day": 24}
    client.post("/api/v1/streams", json=body)
    params_file = save_config(client, tmp_path / "params.json")
    lines = "".join(f"{START + 60_000 * m},{40 + m % 30}\n" for m in range(1440))
    command = agent_command(
        tmp_path / "agent", broker, params_file, "--window-mean-seconds", "3600"
    )
    result = subprocess.run(
        command, input=lines, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stream policy reached" not in result.stderr
    (status,) = agent_status(tmp_path / "agent")
    day = dt.datetime.fromtimestamp(DAY * 86_400, dt.UTC).strftime("%Y-%m-%d")
    assert (status["sent_readings"], status["skipped_for_policy"]) == (24, 0)
    assert status["policy_spent_by_day"] == {day: 24.0}
    wait_until(lambda: stats(client)["readings"] == 24, what="24 hourly means")
    points = client.get(
        "/api/v1/streams/temps/series", params={"interval": 3600, "start": "2000-01-01T00:00:00Z"}
    ).json()["points"]
    assert [p["n"] for p in points] == [1] * 24
    assert points[0]["start"].startswith(day)


def test_an_agent_on_a_longitudinal_stream_pays_once_per_grid_value(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """The real agent on a longitudinal stream (12 grid values) under the default policy (8
    a day, 1 an hour): a reading every 10 minutes of a day, wandering over 6 degrees, is
    sent whole but for what a second new value in one hour would have cost; the agent and the
    collector book the draws (one or two), not the 144 readings; the codes repeat."""
    body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "grid_points": 12}
    assert client.post("/api/v1/streams", json=body).status_code == 201
    params_file = save_config(client, tmp_path / "params.json")
    lines = "".join(f"{START + 600_000 * i},{44 + 3 * math.sin(i / 20):.3f}\n" for i in range(144))
    command = agent_command(tmp_path / "agent", broker, params_file, "--batch", "12")
    result = subprocess.run(
        command, input=lines, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (status,) = agent_status(tmp_path / "agent")
    day = dt.datetime.fromtimestamp(DAY * 86_400, dt.UTC).strftime("%Y-%m-%d")
    sent, skipped = status["sent_readings"], status["skipped_for_policy"]
    spent = status["policy_spent_by_day"][day]
    assert sent + skipped == 144
    assert spent in (1.0, 2.0)
    assert sent >= 144 - 6  # at most the rest of one hour skipped
    wait_until(lambda: stats(client)["readings"] == sent, what="every reading sent")
    assert device(client, "dev1")["epsilon_spent"] == spent
    assert stats(client)["rejects"] == {}
    with closing(sqlite3.connect(tmp_path / "agent" / "outbox.sqlite")) as outbox:
        (text,) = outbox.execute("SELECT memo FROM memos").fetchone()
    memo = json.loads(text)
    assert len(memo["codes"]) == spent


def test_the_simulator_memoizes_on_a_longitudinal_stream(
    client: TestClient, broker: Mosquitto, tmp_path: Path
) -> None:
    """`zeal-edge simulate` on a longitudinal stream (4 grid values) with a policy of 48 a
    day (4 an hour): 3 devices, 40 readings each in rounds of 5, as fast as it can. A plain
    stream would send 4 readings per device in the hour; here every round whose new draws
    fit is sent, and the collector books only the codes each device has not sent before."""
    body = {
        "name": "temps",
        "lower": 0,
        "upper": 110,
        "epsilon": 1,
        "grid_points": 4,
        "max_epsilon_per_day": 48,
    }
    assert client.post("/api/v1/streams", json=body).status_code == 201
    result = simulate(
        broker, tmp_path, "--devices", "3", "--rate", "0", "--readings", "40", "--batch", "5"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    skipped = re.search(r"skipped (\d+) readings whose new draws", result.stdout)
    sent = 120 - (int(skipped.group(1)) if skipped else 0)
    assert sent > 4 * 3, result.stdout  # more than a plain stream's hour
    wait_until(lambda: stats(client)["readings"] == sent, what="every round sent")
    devices = client.get("/api/v1/streams/temps/devices").json()["devices"]
    assert all(1.0 <= d["epsilon_spent"] <= 4.0 for d in devices)
    assert stats(client)["rejects"] == {}
