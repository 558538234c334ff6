"""`zeal-server` commands that ask the running server over HTTP: what they print is what the
server serves, whatever database the directory they run in would have opened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.server.helpers import publish_all
from tools.testbed.broker import Mosquitto
from tools.testbed.server import Server, batches, create, stats, wait_until
from zeal.mqtt.streamconfig import params_from_config

pytestmark = pytest.mark.integration  # a real server on a real broker


def zeal_server(server: Server, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**server.env, "ZEAL_SERVER_URL": f"http://127.0.0.1:{server.port}"}
    env.pop("ZEAL_DATABASE_URL", None)  # they open no database
    return subprocess.run(
        [sys.executable, "-m", "zeal_server", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_show_average_series_devices_and_tail_ask_the_running_server(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """Run from another directory (which would hold a database of its own): every command
    reads the server's stream, and no database is made there. Before: `streams create`
    run elsewhere wrote a new zeal-data/zeal.sqlite the server never listed, and there was
    no show, average, series, devices or tail; distribution prints /distribution's
    histogram and quantiles, every value with the stream's unit; rejects names who sent a
    rejected message."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "s.log").start()
    try:
        params = create(server, unit="degF")
        publish_all(
            broker.port, [("zeal/v1/temps/dev1/up", b) for b in batches(params, "temps", "dev1", 3)]
        )
        wait_until(lambda: stats(server)["readings"] == 30, 60, "the readings")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        shown = zeal_server(server, elsewhere, "streams", "show", "temps")
        assert shown.returncode == 0, shown.stderr
        assert "temps: readings in [0, 110]" in shown.stdout
        average = zeal_server(server, elsewhere, "average", "temps")
        assert average.returncode == 0, average.stderr
        served = server.http.get("/api/v1/streams/temps/average").json()["estimate"]["mean"]
        assert f"temps: {served:.4g} degF ± " in average.stdout
        assert "over 30 readings" in average.stdout
        series = zeal_server(server, elsewhere, "series", "temps", "--interval-seconds", "60")
        assert series.returncode == 0, series.stderr
        assert sum(int(line.split()[1]) for line in series.stdout.splitlines()) == 30
        histogram = zeal_server(
            server, elsewhere, "distribution", "temps", "--bins", "4", "--above", "50"
        )
        assert histogram.returncode == 0, histogram.stderr
        asked = {"bins": 4, "above": 50}
        served_q = server.http.get("/api/v1/streams/temps/distribution", params=asked).json()
        lines = histogram.stdout.splitlines()
        assert lines[0] == "temps: 30 readings from 1 device, in degF"
        assert len([line for line in lines if line.startswith("  [")]) == 4
        median = served_q["quantiles"][0]["value"]
        assert f"  q0.5 {median:.4g} degF" in lines  # one device: no interval, and it says why
        assert any("no intervals" in line for line in lines)
        devices = zeal_server(server, elsewhere, "streams", "devices", "temps")
        assert devices.stdout.startswith("dev1 "), devices.stdout
        assert "1 of 1 device\n" in devices.stdout
        listed = server.http.get("/api/v1/streams/temps/devices").json()["devices"][0]
        month = listed["account"]["last_30_days"]  # its account over all its streams
        assert f"all streams 30 d {month:g}" in devices.stdout
        tail = zeal_server(server, elsewhere, "tail", "temps", "--count", "2", "--every", "0.1")
        assert tail.returncode == 0, tail.stderr
        assert [line.split()[2] for line in tail.stdout.splitlines()] == ["30", "30"]
        publish_all(broker.port, [("zeal/v1/temps/evil-1/up", b"\x00garbage")])
        wait_until(lambda: sum(stats(server)["rejects"].values()) == 1, 60, "the reject")
        senders = zeal_server(server, elsewhere, "rejects", "temps")
        assert senders.returncode == 0, senders.stderr
        assert senders.stdout.startswith("evil-1 "), senders.stdout
        assert "(never stored a reading)" in senders.stdout
        missing = zeal_server(server, elsewhere, "average", "nope")
        assert missing.returncode == 2
        assert "answered 404: no stream named 'nope'" in missing.stderr
        assert list(elsewhere.iterdir()) == []  # no database made here
    finally:
        server.stop()
    gone = zeal_server(server, tmp_path, "average", "temps")
    assert gone.returncode == 2
    assert f"cannot reach the server at http://127.0.0.1:{server.port}" in gone.stderr
    assert np.isfinite(served)


def test_enroll_and_policy_set_change_the_running_server(broker: Mosquitto, tmp_path: Path) -> None:
    """With the operator token: enroll a device, set a stream's policy; without it, the
    server's 401 in one line."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "s.log")
    server.env["ZEAL_OPERATOR_TOKEN"] = "op-" + "x" * 20
    server.start()
    try:
        token = {"Authorization": "Bearer op-" + "x" * 20}
        body = {"name": "temps", "lower": 0, "upper": 110, "epsilon": 1, "enrolled_only": True}
        assert server.http.post("/api/v1/streams", json=body, headers=token).status_code == 201
        enrolled = zeal_server(server, tmp_path, "enroll", "temps", "dev7")
        assert enrolled.returncode == 0, enrolled.stderr
        names = [
            d["name"] for d in server.http.get("/api/v1/streams/temps/devices").json()["devices"]
        ]
        assert names == ["dev7"]
        policy = zeal_server(server, tmp_path, "policy", "set", "temps", "24")
        assert policy.returncode == 0, policy.stderr
        assert "at most 24 epsilon per device per UTC day" in policy.stdout
        assert server.http.get("/api/v1/streams/temps").json()["max_epsilon_per_day"] == 24
        # a device's cap across streams, and a tag's
        capped = zeal_server(server, tmp_path, "policy", "device", "dev7", "3")
        assert capped.returncode == 0, capped.stderr
        assert "device dev7: at most 3 epsilon per UTC day across its streams (its own)" in (
            capped.stdout
        )
        tagged = zeal_server(server, tmp_path, "policy", "tag", "site:north", "2")
        assert tagged.stdout.strip() == (
            "tag site:north: at most 2 epsilon per UTC day for each device carrying it"
        )
        assert zeal_server(server, tmp_path, "policy", "device", "dev7", "none").returncode == 0
        shown = zeal_server(server, tmp_path, "policy", "show", "dev7")
        assert shown.stdout.strip().splitlines() == [
            "device dev7: no cap across its streams (the default); 0 spent today in temps",
            "spent in the last 7 days 0, 30 days 0, 365 days 0; since first seen 0",
        ], shown.stdout
        bad = zeal_server(server, tmp_path, "policy", "device", "dev7", "-1")
        assert bad.returncode == 2
        assert "max_epsilon_per_day" in bad.stderr
        server.env.pop("ZEAL_OPERATOR_TOKEN")
        server.env["ZEAL_READ_TOKEN"] = "a read token, not the operator's"
        refused = zeal_server(server, tmp_path, "policy", "set", "temps", "30")
        assert refused.returncode == 2
        assert "answered 401" in refused.stderr
        assert "set ZEAL_OPERATOR_TOKEN" in refused.stderr  # what to do, not only what failed
        assert "ZEAL_READ_TOKEN only opens reads" in refused.stderr
        for action in (["policy", "set"], ["policy", "device"], ["enroll"], ["lorawan", "bind"]):
            helped = zeal_server(server, tmp_path, *action, "--help")
            assert "token ZEAL_OPERATOR_TOKEN" in helped.stdout, action
            assert not helped.stdout.rstrip().endswith(":"), action  # no empty heading
    finally:
        server.stop()


def test_stream_management_and_export_ask_the_running_server(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """`streams create|list|retention|delete-device|delete` and `export`, run from another
    directory with the operator token: each changes or reads the running server's streams,
    and no database is made where they run. Before: they opened the database of the
    directory they ran in (a new zeal-data/zeal.sqlite the server never listed)."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "s.log")
    server.env["ZEAL_OPERATOR_TOKEN"] = "op-" + "x" * 20
    server.start()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        made = zeal_server(
            server, elsewhere, "streams", "create", "temps", "--lower", "0", "--upper", "110",
            "--epsilon", "1", "--bucket-seconds", "1", "--max-epsilon-per-day", "1e6",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert f"created stream temps on http://127.0.0.1:{server.port}: " in made.stdout
        zero = zeal_server(
            server, elsewhere, "streams", "create", "t2", "--lower", "0", "--upper", "1",
            "--epsilon", "0",
        )  # fmt: skip
        assert zero.returncode == 2
        assert "answered 422: epsilon: must be greater than 0" in zero.stderr
        listed = zeal_server(server, elsewhere, "streams", "list", "--json")
        assert (listed.returncode, listed.stdout.strip()) == (0, '["temps"]'), listed.stderr
        params = params_from_config(server.http.get("/api/v1/streams/temps/config").json())
        publish_all(
            broker.port, [("zeal/v1/temps/dev1/up", b) for b in batches(params, "temps", "dev1", 3)]
        )
        wait_until(lambda: stats(server)["readings"] == 30, 60, "the readings")

        kept = zeal_server(server, elsewhere, "streams", "retention", "temps", "30")
        assert kept.returncode == 0, kept.stderr
        assert server.http.get("/api/v1/streams/temps").json()["retention_days"] == 30

        exported = zeal_server(server, elsewhere, "export", "temps")
        assert exported.returncode == 0, exported.stderr
        served = server.http.get("/api/v1/streams/temps/export")
        assert exported.stdout == served.text
        assert len(exported.stdout.splitlines()) == 31  # a header and 30 readings
        assert served.headers["Zeal-Estimates"] in exported.stderr
        parquet = elsewhere / "temps.parquet"
        wrote = zeal_server(
            server, elsewhere, "export", "temps", "--format", "parquet", "--out", str(parquet)
        )
        assert wrote.returncode == 0, wrote.stderr
        assert parquet.read_bytes()[:4] == b"PAR1"
        parquet.unlink()  # the directory is checked for what the commands left

        unconfirmed = zeal_server(server, elsewhere, "streams", "delete-device", "temps", "dev1")
        assert unconfirmed.returncode == 2
        assert "add --confirm dev1 to confirm" in unconfirmed.stderr
        assert stats(server)["readings"] == 30
        forgot = zeal_server(
            server, elsewhere, "streams", "delete-device", "temps", "dev1", "--confirm", "dev1"
        )
        assert forgot.returncode == 0, forgot.stderr
        assert "deleted device dev1 of stream temps and its 30 readings" in forgot.stdout
        assert stats(server)["readings"] == 0

        server.env.pop("ZEAL_OPERATOR_TOKEN")  # the client's environment, not the server's
        refused = zeal_server(server, elsewhere, "streams", "delete", "temps", "--confirm", "temps")
        assert refused.returncode == 2
        assert "answered 401" in refused.stderr
        server.env["ZEAL_OPERATOR_TOKEN"] = "op-" + "x" * 20
        gone = zeal_server(server, elsewhere, "streams", "delete", "temps", "--confirm", "temps")
        assert gone.returncode == 0, gone.stderr
        assert server.http.get("/api/v1/streams").json() == []
        assert list(elsewhere.iterdir()) == []  # no database made here
    finally:
        server.stop()


def test_lorawan_bindings_are_made_listed_and_removed_on_the_running_server(
    broker: Mosquitto, tmp_path: Path
) -> None:
    """`lorawan bind|list|unbind` over HTTP; an unknown stream and a port out of range are
    the server's refusals in one line."""
    server = Server(f"sqlite:///{tmp_path / 'zeal.sqlite'}", broker, tmp_path / "s.log")
    server.start()
    app = "5f0d8a8e-2c4b-4d6e-9a1b-0c2d3e4f5a6b"
    try:
        create(server, "temps")
        empty = zeal_server(server, tmp_path, "lorawan", "list")
        assert empty.returncode == 0, empty.stderr
        assert "no LoRaWAN bindings yet" in empty.stdout
        bound = zeal_server(server, tmp_path, "lorawan", "bind", app, "--port", "10",
                            "--stream", "temps", "--device-names", "device_name")  # fmt: skip
        assert bound.returncode == 0, bound.stderr
        assert f"application {app} on FPort 10 go to stream temps" in bound.stdout
        anyport = zeal_server(server, tmp_path, "lorawan", "bind", app, "--stream", "temps")
        assert anyport.returncode == 0, anyport.stderr
        listed = zeal_server(server, tmp_path, "lorawan", "list").stdout.splitlines()
        assert listed == [
            f"{app}  its other ports  ->  temps  (devices by dev_eui)",
            f"{app}  FPort 10  ->  temps  (devices by device_name)",
        ]
        assert [b["f_port"] for b in server.http.get("/api/v1/lorawan/bindings").json()] == [0, 10]
        for args, said in (
            (("--port", "10", "--stream", "nope"), "answered 404: no stream named 'nope'"),
            (("--port", "224", "--stream", "temps"), "answered 422"),
        ):
            refused = zeal_server(server, tmp_path, "lorawan", "bind", app, *args)
            assert (refused.returncode, refused.stdout) == (2, ""), refused.stdout
            assert said in refused.stderr
        gone = zeal_server(server, tmp_path, "lorawan", "unbind", app, "--port", "10")
        assert gone.returncode == 0, gone.stderr
        again = zeal_server(server, tmp_path, "lorawan", "unbind", app, "--port", "10")
        assert again.returncode == 2
        assert "answered 404: no binding for application" in again.stderr
        assert [b["f_port"] for b in server.http.get("/api/v1/lorawan/bindings").json()] == [0]
    finally:
        server.stop()
